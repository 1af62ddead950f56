//! `serve_tls` with a real axum router and a real HTTP client: the handler sees the client's
//! verified identity, plaintext is refused, HTTP/2 is negotiated, shutdown stops the listener.

// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use axum::routing::get;
use axum::{Extension, Router};
use squadron_core::ids::WorkerId;
use squadron_pki::{
    client_config, serve_tls, server_config, CertUse, ClientAuth, ClusterCa, ClusterTrust,
    ExpectedPeer, IssuedCert, KeyRequest, PeerCert, ReloadableCert, SpiffeId, SubjectName,
};
use tokio::net::TcpListener;

const DAY: Duration = Duration::from_secs(24 * 3600);

async fn whoami(Extension(peer): Extension<PeerCert>) -> String {
    match peer.0 {
        Some(f) => f.identity.to_string(),
        None => "anonymous".into(),
    }
}

#[tokio::test]
async fn handlers_see_the_verified_identity_and_plaintext_is_refused() {
    let (ca, _) = ClusterCa::generate("t").unwrap();
    let trust = ClusterTrust::from_ca_pem(ca.cert_pem()).unwrap();
    let node = ca
        .issue(
            &SpiffeId::Node(1),
            &[SubjectName::of_host("127.0.0.1")],
            DAY,
            CertUse::ServerAndClient,
        )
        .unwrap();
    let cert = ReloadableCert::new(&trust, &node).unwrap();
    let config = server_config(&trust, &cert, ClientAuth::Optional).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let router = Router::new().route("/whoami", get(whoami));
    let server = tokio::spawn(serve_tls(
        listener,
        config,
        router,
        async {
            let _ = stop_rx.await;
        },
        Default::default(),
    ));

    let url = format!("https://{addr}/whoami");
    // An operator's client: no certificate, host-name check.
    let anonymous = reqwest::Client::builder()
        .use_preconfigured_tls(client_config(&trust, ExpectedPeer::ServerName, None).unwrap())
        .build()
        .unwrap();
    let reply = anonymous.get(&url).send().await.unwrap();
    assert_eq!(reply.version(), reqwest::Version::HTTP_2);
    assert_eq!(reply.text().await.unwrap(), "anonymous");

    // A worker's client: its enrolled certificate.
    let id = SpiffeId::Worker(WorkerId::new("w1").unwrap());
    let request = KeyRequest::new(&id).unwrap();
    let signed = ca
        .sign_csr(&request.csr_pem, &id, &[], DAY, CertUse::ServerAndClient)
        .unwrap();
    let worker = ReloadableCert::new(
        &trust,
        &IssuedCert::new(signed, request.key_pem().into(), ca.cert_pem()),
    )
    .unwrap();
    let as_worker = reqwest::Client::builder()
        .use_preconfigured_tls(client_config(&trust, ExpectedPeer::AnyNode, Some(&worker)).unwrap())
        .build()
        .unwrap();
    assert_eq!(
        as_worker
            .get(&url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "spiffe://squadron.local/worker/w1"
    );

    // Plaintext HTTP to the TLS port gets no answer.
    let plain = reqwest::Client::new();
    assert!(plain
        .get(format!("http://{addr}/whoami"))
        .send()
        .await
        .is_err());

    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap();
    assert!(
        anonymous.get(&url).send().await.is_err(),
        "still serving after shutdown"
    );
}
