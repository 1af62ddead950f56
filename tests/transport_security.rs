//! Every listener speaks TLS only, and the node-only listeners admit only node certificates:
//! plaintext to the REST, gRPC and peer ports gets no answer; the peer listener refuses a
//! worker certificate of the same CA on its HTTP routes and on Raft (a forged vote leaves the
//! leader's term alone); a worker's output listener refuses a worker certificate and a client
//! without one. Real `squadron server` and `squadron worker` processes, real sockets.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;
use support::*;

/// What a plaintext HTTP/1.1 request to `addr` gets back (the server closes a connection
/// that does not start a TLS handshake; whatever bytes come are not an HTTP answer).
fn plaintext_answer(addr: &str) -> Vec<u8> {
    let mut tcp = TcpStream::connect(addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let _ = tcp.write_all(request.as_bytes());
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer);
    answer
}

fn assert_not_http(addr: &str, what: &str) {
    let answer = plaintext_answer(addr);
    assert!(
        !answer.starts_with(b"HTTP/"),
        "{what} answered plaintext HTTP: {:?}",
        String::from_utf8_lossy(&answer)
    );
}

fn term_and_leader(cluster: &Cluster, id: u64) -> (u64, u64) {
    let s = cluster.status(id).expect("status");
    (
        s["term"].as_u64().expect("term"),
        s["leader"].as_u64().expect("leader"),
    )
}

#[test]
fn plaintext_reaches_no_listener_and_peers_admit_only_nodes() {
    let cluster = Cluster::start(3);
    let leader = cluster.wait_for_leader(Duration::from_secs(30));
    let spec = cluster.nodes[&leader].spec.clone();

    // Over TLS the REST port answers; in plaintext none of the three ports does.
    assert!(http_ok(&format!("{}/healthz", cluster.url(leader))));
    assert_not_http(&spec.rest, "the REST port");
    assert_not_http(&spec.grpc, "the gRPC port");
    assert_not_http(&spec.peer, "the peer port");

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let worker = worker_credentials("w-forger", &cluster.dir.path().join("w-forger"));
    rt.block_on(async {
        use squadron_proto::v1 as pb;
        use squadron_proto::v1::worker_service_client::WorkerServiceClient;
        // Plaintext gRPC to the leader's gRPC port fails; with TLS and a worker
        // certificate the same call is answered.
        let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", spec.grpc))
            .expect("endpoint")
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(5))
            .connect_lazy();
        let register = || pb::RegisterWorkerRequest {
            worker: "w-forger".into(),
            address: "https://127.0.0.1:1".into(),
            runtimes: vec!["process".into()],
            capacity: 1,
            labels: Default::default(),
            heartbeat_interval_ms: 600_000,
            policy: None,
        };
        let refused = WorkerServiceClient::new(plain).register(register()).await;
        let status = refused.expect_err("plaintext gRPC is not served");
        assert!(
            status.metadata().get("x-squadron-leader").is_none(),
            "a plaintext call reached the service: {status:?}"
        );
        let connector = worker.grpc_connector().expect("tls").expect("connector");
        let secured = tonic::transport::Endpoint::from_shared(format!("https://{}", spec.grpc))
            .expect("endpoint")
            .connect_with_connector(connector)
            .await
            .expect("TLS connect");
        WorkerServiceClient::new(secured)
            .register(register())
            .await
            .expect("over TLS with a worker certificate the leader answers");
    });

    // The peer routes: a worker certificate of the same CA is refused, a node's is not.
    let forwarded = json!({
        "subject": "legacy",
        "command": {"create_project": {"tenant": "acme", "project": "forged"}},
        "idempotency_key": null
    });
    let worker_tls =
        presenting(&pki().issue_worker("w-forger", &cluster.dir.path().join("w-forger")));
    let peer_url = format!("{}/internal/v1/propose", cluster.peer_url(leader));
    let r = reply(
        agent_with(worker_tls.clone())
            .post(&peer_url)
            .send_json(forwarded.clone()),
    )
    .expect("an answer");
    assert_eq!(r.status, 403, "a worker reached the peer protocol: {r:?}");
    let r = http_get(&format!(
        "{}/api/v1/projects/acme/forged",
        cluster.url(leader)
    ));
    assert!(
        r.is_err_and(|e| e.starts_with("404")),
        "the forged write was applied"
    );
    let r = peer_post(&peer_url, forwarded).expect("an answer");
    assert_eq!(r.status, 200, "a node is admitted: {r:?}");

    // A forged Raft vote for a far higher term, sent with the worker certificate.
    let before = term_and_leader(&cluster, leader);
    rt.block_on(async {
        use squadron_proto::v1::raft_service_client::RaftServiceClient;
        use squadron_proto::v1::RaftPayload;
        let vote: openraft::raft::VoteRequest<u64> =
            openraft::raft::VoteRequest::new(openraft::Vote::new(before.0 + 100, 2), None);
        let data = squadron_raft::wire::encode(&vote).expect("encode");
        let connector = worker.grpc_connector().expect("tls").expect("connector");
        let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", spec.peer))
            .expect("endpoint")
            .connect_with_connector(connector)
            .await
            .expect("TLS connect: the chain is valid");
        let refused = RaftServiceClient::new(channel)
            .vote(RaftPayload { data })
            .await
            .expect_err("a worker's vote is refused");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    });
    std::thread::sleep(Duration::from_millis(500));
    let after = term_and_leader(&cluster, leader);
    assert_eq!(
        after, before,
        "the forged vote changed the term or the leader"
    );
}

#[test]
fn a_workers_listener_admits_only_nodes() {
    let cluster = Cluster::start(1);
    let id = unique_worker_id("w-listen");
    let worker = WorkerProc::start(cluster.dir.path(), &id, cluster.urls(), "process");
    let url = format!("https://{}/healthz", worker.listen);

    assert!(
        node_agent().get(&url).call().is_ok(),
        "a node certificate is admitted"
    );
    // Another worker's certificate, from the same CA: refused before any handler.
    let other = presenting(&pki().issue_worker("w-other", &cluster.dir.path().join("w-other")));
    match agent_with(other).get(&url).call() {
        Err(ureq::Error::Status(code, _)) => assert_eq!(code, 403),
        other => panic!("a worker certificate was not refused with 403: {other:?}"),
    }
    // No certificate at all: the handshake fails, nothing answers.
    match agent_with(pki().operator.clone()).get(&url).call() {
        Err(ureq::Error::Transport(_)) => {}
        other => panic!("a client without a certificate got an answer: {other:?}"),
    }
    assert_not_http(&worker.listen, "the worker's output port");
}

/// The DER of the certificate a TLS server at `addr` presents to a new connection.
fn presented_cert(addr: &str, config: std::sync::Arc<rustls::ClientConfig>) -> Vec<u8> {
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    // A full handshake every time: a resumed session would report the first one's certificate.
    let mut config = (*config).clone();
    config.resumption = rustls::client::Resumption::disabled();
    let mut conn =
        rustls::ClientConnection::new(std::sync::Arc::new(config), name).expect("client");
    let mut tcp = TcpStream::connect(addr).expect("connect");
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).expect("handshake");
    }
    conn.peer_certificates().expect("a certificate")[0].to_vec()
}

fn node_cert_on_disk(cluster: &Cluster, id: u64) -> Vec<u8> {
    let pem = std::fs::read_to_string(
        cluster
            .dir
            .path()
            .join(format!("node{id}/data/pki/node.pem")),
    )
    .expect("node.pem");
    squadron_pki::peer_identity::first_cert_der(&pem)
        .expect("der")
        .to_vec()
}

/// Certificate rotation of a running cluster: `squadron init --rotate-node-certs`, then SIGHUP
/// to each node, while a client keeps writing. No write fails, and new connections to every
/// listener see the new certificate.
#[test]
fn node_certificates_rotate_without_downtime() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let cluster = Cluster::start(3);
    let url = cluster.url(cluster.wait_for_leader(Duration::from_secs(30)));
    let old: Vec<Vec<u8>> = (1..=3).map(|id| node_cert_on_disk(&cluster, id)).collect();
    for id in 1..=3 {
        let rest = &cluster.nodes[&id].spec.rest;
        assert_eq!(
            presented_cert(rest, pki().operator.clone()),
            old[id as usize - 1]
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let (stop, ok, failed, url) = (stop.clone(), ok.clone(), failed.clone(), url.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let body = json!({"tenant": "acme", "project": format!("rot-{i}")});
                match post(&format!("{url}/api/v1/projects"), body) {
                    Ok(r) if r.ok() => ok.fetch_add(1, Ordering::Relaxed),
                    other => {
                        errors.push(format!("{other:?}"));
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
            errors
        })
    };
    std::thread::sleep(Duration::from_secs(1));

    let configs: Vec<_> = cluster.nodes.values().map(|n| n.config.clone()).collect();
    let out = std::process::Command::new(BIN)
        .arg("init")
        .arg("--rotate-node-certs")
        .args(&configs)
        .output()
        .expect("squadron init --rotate-node-certs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for node in cluster.nodes.values() {
        let pid = node.child.as_ref().expect("running").id();
        let hup = std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .expect("kill -HUP");
        assert!(hup.success());
    }
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let errors = writer.join().expect("writer");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "writes failed: {errors:?}"
    );
    assert!(ok.load(Ordering::Relaxed) > 0, "no write went through");

    for id in 1..=3 {
        let new = node_cert_on_disk(&cluster, id);
        assert_ne!(
            new,
            old[id as usize - 1],
            "node {id}'s certificate was re-issued"
        );
        let spec = &cluster.nodes[&id].spec;
        assert_eq!(
            presented_cert(&spec.rest, pki().operator.clone()),
            new,
            "REST of node {id}"
        );
        assert_eq!(
            presented_cert(&spec.peer, pki().as_node.clone()),
            new,
            "peer of node {id}"
        );
    }
    // The cluster still replicates with the new certificates.
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "after-rotation"}),
    )
    .expect("write");
    assert!(r.ok(), "{r:?}");
    cluster.wait_for_equal_digests(Duration::from_secs(20));
}

/// Every file below `dir` that holds `needle`, read whole (test data directories are small).
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                pending.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
            {
                found.push(path);
            }
        }
    }
    found
}

/// `squadron token create|list|revoke`: the secret is answered once and stored nowhere — not
/// in the listing, the node's data directory (Raft log, RocksDB, snapshots) or its log; bad input
/// is refused naming the field; creation and revocation are in the audit record.
#[test]
fn operator_tokens_are_created_listed_and_revoked_and_no_secret_is_stored() {
    let cluster = Cluster::start(1);
    cluster.wait_for_leader(Duration::from_secs(20));
    let url = cluster.url(1);
    let run = |args: &[&str]| {
        let out = cli(&url)
            .args(["--endpoint", &url, "--output", "json", "token"])
            .args(args)
            .output()
            .expect("run the CLI");
        assert!(
            out.status.success(),
            "token {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON")
    };
    let created = run(&["create", "--name", "ci", "--role", "viewer", "--ttl", "30d"]);
    let secret = created["token"].as_str().expect("token").to_string();
    let id = created["id"].as_str().expect("id").to_string();
    assert!(secret.starts_with(&format!("sqd_op_{id}_")), "{created}");
    assert_eq!(created["role"], json!("viewer"));

    let listed = run(&["list"]);
    let text = listed.to_string();
    let secret_part = secret.rsplit('_').next().expect("secret part");
    assert!(
        !text.contains(secret_part),
        "the listing shows the secret: {text}"
    );
    let mine: Vec<&serde_json::Value> = listed
        .as_array()
        .expect("list")
        .iter()
        .filter(|t| t["id"] == json!(id))
        .collect();
    assert_eq!(mine.len(), 1, "{listed}");
    assert_eq!(mine[0]["name"], json!("ci"));
    assert_eq!(mine[0]["revoked_at_ms"], json!(null));
    assert!(mine[0]["expires_at_ms"].as_u64().is_some(), "{listed}");

    for (body, field) in [
        (json!({"name": "op", "role": "operator"}), "scope"),
        (json!({"name": "v", "role": "viewer", "ttl": "soon"}), "ttl"),
        (json!({"name": "v", "role": "root"}), "role"),
    ] {
        let r = post(&format!("{url}/api/v1/tokens"), body.clone()).expect("answer");
        assert_eq!(r.status, 400, "{body}: {r:?}");
        assert!(
            r.body["field"].as_str().unwrap_or("").contains(field),
            "{body}: {r:?}"
        );
    }
    assert_eq!(
        run(&["list"]).as_array().map(Vec::len),
        listed.as_array().map(Vec::len)
    );

    run(&["revoke", &id]);
    let listed = run(&["list"]);
    let revoked = listed
        .as_array()
        .and_then(|l| l.iter().find(|t| t["id"] == json!(id)).cloned())
        .expect("still listed");
    assert!(revoked["revoked_at_ms"].as_u64().is_some(), "{revoked}");

    let audit = http_get(&format!("{url}/api/v1/audit")).expect("audit");
    for command in ["create_operator_token", "revoke_operator_token"] {
        let target = format!("token {id}");
        assert!(
            audit["records"]
                .as_array()
                .is_some_and(|r| r.iter().any(|x| x["command"] == json!(command)
                    && x["target"].as_str() == Some(target.as_str()))),
            "{command} missing: {audit}"
        );
    }
    // The node's data directory (Raft log, RocksDB, snapshots), its log and its config.
    let holders = files_holding(cluster.dir.path(), secret_part.as_bytes());
    assert!(holders.is_empty(), "the secret is stored in {holders:?}");
}
