//! Real TLS handshakes over loopback: who gets in, what the server learns about them, and
//! rotation without a restart.

// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use squadron_core::ids::WorkerId;
use squadron_pki::{
    client_config, server_config, CertFacts, CertUse, ClientAuth, ClusterCa, ClusterTrust,
    ExpectedPeer, IssuedCert, KeyRequest, ReloadableCert, SpiffeId, SubjectName,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

const DAY: Duration = Duration::from_secs(24 * 3600);

struct Cluster {
    ca: ClusterCa,
    trust: ClusterTrust,
}

fn cluster() -> Cluster {
    let (ca, _key) = ClusterCa::generate("test").unwrap();
    let trust = ClusterTrust::from_ca_pem(ca.cert_pem()).unwrap();
    Cluster { ca, trust }
}

fn node_cert(c: &Cluster, id: u64) -> IssuedCert {
    c.ca.issue(
        &SpiffeId::Node(id),
        &[
            SubjectName::of_host("127.0.0.1:0"),
            SubjectName::Dns("localhost".into()),
        ],
        DAY,
        CertUse::ServerAndClient,
    )
    .unwrap()
}

fn enrolled_worker(c: &Cluster, name: &str) -> IssuedCert {
    let id = SpiffeId::Worker(WorkerId::new(name).unwrap());
    let request = KeyRequest::new(&id).unwrap();
    let cert =
        c.ca.sign_csr(&request.csr_pem, &id, &[], DAY, CertUse::ServerAndClient)
            .unwrap();
    IssuedCert::new(cert, request.key_pem().to_owned(), c.ca.cert_pem())
}

/// A server that answers each connection with the client's identity (or "anonymous").
async fn serve(c: &Cluster, cert: &ReloadableCert, auth: ClientAuth) -> std::net::SocketAddr {
    let config = server_config(&c.trust, cert, auth).unwrap();
    let acceptor = TlsAcceptor::from(config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let who = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| CertFacts::of_der(c).unwrap().identity.to_string())
                    .unwrap_or_else(|| "anonymous".into());
                let _ = tls.write_all(who.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    addr
}

async fn ask(
    c: &Cluster,
    addr: std::net::SocketAddr,
    expect: ExpectedPeer,
    cert: Option<&ReloadableCert>,
) -> Result<String, String> {
    let config = client_config(&c.trust, expect, cert).map_err(|e| e.to_string())?;
    let connector = TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    tls.read_to_string(&mut out)
        .await
        .map_err(|e| e.to_string())?;
    if out.is_empty() {
        return Err("connection closed without an answer".into());
    }
    Ok(out)
}

#[tokio::test]
async fn a_required_listener_admits_only_certificates_of_the_cluster() {
    let c = cluster();
    let server = ReloadableCert::new(&c.trust, &node_cert(&c, 1)).unwrap();
    let addr = serve(&c, &server, ClientAuth::Required).await;

    let worker = ReloadableCert::new(&c.trust, &enrolled_worker(&c, "w1")).unwrap();
    let node2 = ReloadableCert::new(&c.trust, &node_cert(&c, 2)).unwrap();
    assert_eq!(
        ask(&c, addr, ExpectedPeer::AnyNode, Some(&worker))
            .await
            .unwrap(),
        "spiffe://squadron.local/worker/w1"
    );
    assert_eq!(
        ask(
            &c,
            addr,
            ExpectedPeer::Exactly(SpiffeId::Node(1)),
            Some(&node2)
        )
        .await
        .unwrap(),
        "spiffe://squadron.local/node/2"
    );
    // No certificate: refused.
    assert!(ask(&c, addr, ExpectedPeer::AnyNode, None).await.is_err());
    // A certificate of another CA: refused.
    let other = cluster();
    let stranger = ReloadableCert::new(&c.trust, &node_cert(&other, 1)).unwrap();
    assert!(ask(&c, addr, ExpectedPeer::AnyNode, Some(&stranger))
        .await
        .is_err());
}

#[tokio::test]
async fn an_optional_listener_admits_anonymous_clients_and_names_the_others() {
    let c = cluster();
    let server = ReloadableCert::new(&c.trust, &node_cert(&c, 1)).unwrap();
    let addr = serve(&c, &server, ClientAuth::Optional).await;
    assert_eq!(
        ask(&c, addr, ExpectedPeer::ServerName, None).await.unwrap(),
        "anonymous"
    );
    let worker = ReloadableCert::new(&c.trust, &enrolled_worker(&c, "w2")).unwrap();
    assert_eq!(
        ask(&c, addr, ExpectedPeer::AnyNode, Some(&worker))
            .await
            .unwrap(),
        "spiffe://squadron.local/worker/w2"
    );
}

#[tokio::test]
async fn a_client_refuses_a_server_that_is_not_who_it_expects() {
    let c = cluster();
    // A worker's certificate serving where a node is expected.
    let server = ReloadableCert::new(&c.trust, &enrolled_worker(&c, "w1")).unwrap();
    let addr = serve(&c, &server, ClientAuth::Optional).await;
    let e = ask(&c, addr, ExpectedPeer::AnyNode, None)
        .await
        .unwrap_err();
    assert!(e.contains("not the expected"), "{e}");
    let w1 = SpiffeId::Worker(WorkerId::new("w1").unwrap());
    let w9 = SpiffeId::Worker(WorkerId::new("w9").unwrap());
    assert!(ask(&c, addr, ExpectedPeer::Exactly(w1), None).await.is_ok());
    assert!(ask(&c, addr, ExpectedPeer::Exactly(w9), None)
        .await
        .is_err());
    // The worker certificate has no address names: a host-name check fails.
    assert!(ask(&c, addr, ExpectedPeer::ServerName, None).await.is_err());
    // A server of another cluster is refused whatever it claims.
    let other = cluster();
    let impostor = ReloadableCert::new(&other.trust, &node_cert(&other, 1)).unwrap();
    let addr = serve(&other, &impostor, ClientAuth::Optional).await;
    assert!(ask(&c, addr, ExpectedPeer::AnyNode, None).await.is_err());
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let c = cluster();
    let first = node_cert(&c, 1);
    let server = ReloadableCert::new(&c.trust, &first).unwrap();
    let addr = serve(&c, &server, ClientAuth::Optional).await;
    assert!(
        ask(&c, addr, ExpectedPeer::Exactly(SpiffeId::Node(1)), None)
            .await
            .is_ok()
    );
    // Rotate to a certificate of node 7 (a different identity makes the swap observable).
    server.reload(&node_cert(&c, 7)).unwrap();
    assert!(
        ask(&c, addr, ExpectedPeer::Exactly(SpiffeId::Node(1)), None)
            .await
            .is_err()
    );
    assert!(
        ask(&c, addr, ExpectedPeer::Exactly(SpiffeId::Node(7)), None)
            .await
            .is_ok()
    );
}
