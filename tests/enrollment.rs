//! Enrollment by one-time bootstrap token (DESIGN §5): a token works once — replayed, sent to
//! two nodes at once, expired or unknown it yields no second certificate — and the certificate
//! it yields is a working worker identity. A worker process enrolls itself from a token file,
//! which it scrubs.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use squadron_pki::{IssuedCert, KeyRequest, PkiDir, SpiffeId};
use support::*;

fn mint(url: &str, body: Value) -> String {
    let r = post(&format!("{url}/api/v1/bootstrap-tokens"), body).expect("mint");
    assert!(r.ok(), "{r:?}");
    r.body["token"].as_str().expect("secret").to_string()
}

fn enroll(url: &str, token: &str, worker: &str, csr: &KeyRequest) -> Reply {
    // Public: the token is the credential; no operator token is sent.
    reply(
        agent_with(pki().operator_for(url))
            .post(&format!("{url}/api/v1/enroll"))
            .send_json(json!({"token": token, "worker": worker, "csr_pem": csr.csr_pem})),
    )
    .expect("answer")
}

/// A client presenting the certificate an enrollment or renewal answered, with the key that
/// stayed here (written and loaded as a worker would).
fn presenting_answer(dir: &std::path::Path, answer: &Value, key: &KeyRequest) -> ureq::Agent {
    let cert = IssuedCert::new(
        answer["cert_pem"].as_str().expect("cert").to_string(),
        key.key_pem().to_string(),
        answer["ca_pem"].as_str().expect("ca"),
    );
    PkiDir::new(dir)
        .write_identity("worker", &cert)
        .expect("files");
    let identity = squadron_pki::TlsIdentity::load(&PkiDir::new(dir), "worker").expect("load");
    agent_with(support::presenting(&identity))
}

/// `WorkerControl/RenewCertificate` at the leader, presenting `identity`, for `worker`.
fn renew_over_grpc(
    urls: Vec<String>,
    identity: squadron_pki::TlsIdentity,
    worker: &str,
    key: &KeyRequest,
) -> Result<squadron_api::Enrolled, tonic::Status> {
    use squadron_proto::v1::worker_control_client::WorkerControlClient;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let credentials = squadron_client::Credentials::identity(identity);
        let rest = squadron_client::SquadronClient::secured(urls, &credentials).expect("client");
        let (_, channel) = squadron_client::GrpcLeader::new(rest)
            .channel()
            .await
            .expect("leader channel");
        let request = squadron_api::Addressed::new(
            worker.parse().expect("worker id"),
            squadron_api::RenewCertificate {
                csr_pem: key.csr_pem.clone(),
                hosts: Vec::new(),
            },
        );
        WorkerControlClient::new(channel)
            .renew_certificate(request)
            .await
            .map(|r| r.into_inner())
    })
}

fn csr(worker: &str) -> KeyRequest {
    KeyRequest::new(&SpiffeId::Worker(worker.parse().expect("id"))).expect("csr")
}

#[test]
fn a_bootstrap_token_yields_exactly_one_certificate() {
    let cluster = Cluster::start(3);
    cluster.wait_for_leader(Duration::from_secs(30));
    let (url1, url2, url3) = (cluster.url(1), cluster.url(2), cluster.url(3));
    let token = mint(&url1, json!({"worker": "wb", "ttl": "10m"}));

    // The same token at two nodes at once: one certificate.
    let (a, b) = (csr("wb"), csr("wb"));
    let (ra, rb) = std::thread::scope(|s| {
        let ha = s.spawn(|| enroll(&url1, &token, "wb", &a));
        let hb = s.spawn(|| enroll(&url2, &token, "wb", &b));
        (ha.join().expect("a"), hb.join().expect("b"))
    });
    let statuses = [ra.status, rb.status];
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "two enrollments with one token: {ra:?} {rb:?}"
    );
    assert!(statuses.contains(&401), "{ra:?} {rb:?}");
    let (won, key) = if ra.ok() { (&ra, &a) } else { (&rb, &b) };

    // A replay at a third node: refused.
    let replay = enroll(&url3, &token, "wb", &csr("wb"));
    assert_eq!(replay.status, 401, "{replay:?}");
    // A token for another worker id cannot be used for this one, nor can an unknown one.
    let other = mint(&url1, json!({"worker": "wc"}));
    let r = enroll(&url1, &other, "wb", &csr("wb"));
    assert_eq!(r.status, 403, "{r:?}");
    let unknown = format!("sqd_boot_{}_{}", "0".repeat(16), "0".repeat(64));
    assert_eq!(enroll(&url1, &unknown, "wb", &csr("wb")).status, 401);
    assert_eq!(enroll(&url1, "not a token", "wb", &csr("wb")).status, 401);

    // The certificate is wb's identity: it registers wb and nothing else.
    let as_wb = presenting_answer(&cluster.dir.path().join("wb-pki"), &won.body, key);
    let register = |worker: &str| {
        reply(as_wb.post(&format!("{url1}/api/v1/workers")).send_json(json!({
            "worker": worker, "address": "127.0.0.1:1", "runtimes": ["process"], "capacity": 1
        })))
        .expect("answer")
    };
    assert!(register("wb").ok(), "{:?}", register("wb"));
    assert_eq!(register("wd").status, 403);

    // Renewal under the live certificate: a new serial, recorded, and it works in turn.
    let fresh = csr("wb");
    let renew = |agent: &ureq::Agent, worker: &str, key: &KeyRequest| {
        reply(
            agent
                .post(&format!("{url2}/api/v1/workers/{worker}/certificate"))
                .send_json(json!({"csr_pem": key.csr_pem})),
        )
        .expect("answer")
    };
    let renewed = renew(&as_wb, "wb", &fresh);
    assert!(renewed.ok(), "{renewed:?}");
    assert_ne!(renewed.body["serial"], won.body["serial"]);
    let as_wb2 = presenting_answer(&cluster.dir.path().join("wb-pki-2"), &renewed.body, &fresh);
    let r = reply(
        as_wb2
            .post(&format!("{url1}/api/v1/workers/wb/heartbeat"))
            .send_json(json!(null)),
    )
    .expect("answer");
    assert!(r.ok(), "the renewed certificate is refused: {r:?}");
    // The worker itself renews at the leader over gRPC (WorkerControl), for itself only.
    let wb2_pki = PkiDir::new(cluster.dir.path().join("wb-pki-2"));
    let identity = squadron_pki::TlsIdentity::load(&wb2_pki, "worker").expect("identity");
    let over_grpc = renew_over_grpc(cluster.urls(), identity, "wb", &csr("wb"));
    let enrolled = over_grpc.expect("renewed over gRPC");
    assert_ne!(Value::from(enrolled.serial.clone()), renewed.body["serial"]);
    assert!(enrolled.cert_pem.contains("BEGIN CERTIFICATE"));
    let identity = squadron_pki::TlsIdentity::load(&wb2_pki, "worker").expect("identity");
    let refused = renew_over_grpc(cluster.urls(), identity, "wd", &csr("wd"))
        .expect_err("renewed another worker's certificate");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    // Another worker cannot renew wb's; a certificate the cluster never recorded (made
    // offline) cannot be renewed — it enrolls instead.
    assert_eq!(renew(&as_wb, "wd", &csr("wd")).status, 403);
    let offline = agent_with(pki().presenting_id(&SpiffeId::Worker("wo".parse().expect("id"))));
    assert_eq!(renew(&offline, "wo", &csr("wo")).status, 401);
    // The audit names the enrollment.
    let audit = http_get(&format!("{url1}/api/v1/audit"))
        .expect("audit")
        .to_string();
    assert!(audit.contains("enroll"), "{audit}");
}

#[test]
fn an_expired_bootstrap_token_is_refused() {
    let cluster = Cluster::start(1);
    cluster.wait_for_leader(Duration::from_secs(20));
    let url = cluster.url(1);
    let token = mint(&url, json!({"ttl": "10s"}));
    // Its life is the 10 s asked for plus at most the node's 2 s slack.
    std::thread::sleep(Duration::from_millis(12_500));
    let r = enroll(&url, &token, "late", &csr("late"));
    assert_eq!(r.status, 401, "{r:?}");
    // Bad requests change nothing and name the field.
    let r = post(
        &format!("{url}/api/v1/bootstrap-tokens"),
        json!({"ttl": "2d"}),
    )
    .expect("answer");
    assert_eq!(r.status, 400, "{r:?}");
    let r = post(
        &format!("{url}/api/v1/bootstrap-tokens"),
        json!({"ttl": "1h", "extra": 1}),
    )
    .expect("answer");
    assert_eq!(r.status, 400, "{r:?}");
}

#[test]
fn a_worker_enrolls_itself_from_a_token_file_and_scrubs_it() {
    let cluster = Cluster::start(1);
    cluster.wait_for_leader(Duration::from_secs(20));
    let url = cluster.url(1);
    let dir = cluster.dir.path().join("we");
    std::fs::create_dir_all(&dir).expect("dir");
    let token_file = dir.join("bootstrap.token");
    let out = cli(&url)
        .args([
            "--endpoint",
            &url,
            "token",
            "bootstrap",
            "--worker",
            "we",
            "--ttl",
            "5m",
        ])
        .arg("--token-out")
        .arg(&token_file)
        .output()
        .expect("cli");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("sqd_boot_"));
    let cert_dir = dir.join("pki");
    let mut worker = std::process::Command::new(support::BIN)
        .args([
            "worker",
            "--id",
            "we",
            "--control",
            &url,
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--cert-dir")
        .arg(&cert_dir)
        .arg("--cacert")
        .arg(&pki().ca_cert)
        .arg("--bootstrap-token-file")
        .arg(&token_file)
        .arg("--no-agents")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(
            std::fs::File::create(dir.join("worker.log")).expect("log"),
        ))
        .spawn()
        .expect("worker");
    let registered = wait_until(Duration::from_secs(30), || {
        http_get(&format!("{url}/api/v1/workers/we")).is_ok()
    });
    let _ = worker.kill();
    let _ = worker.wait();
    let log = std::fs::read_to_string(dir.join("worker.log")).unwrap_or_default();
    assert!(
        registered.is_ok(),
        "the enrolled worker did not register:\n{log}"
    );
    assert!(!token_file.exists(), "the token file was left behind");
    assert!(cert_dir.join("worker.pem").exists() && cert_dir.join("worker.key").exists());
    assert!(!log.contains("sqd_boot_"), "the token reached the log");
}
