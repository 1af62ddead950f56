//! The generation-fenced Git broker against a real control plane: commits of the profile's
//! current lease are accepted; once the lease is fenced and a new generation granted, the old
//! generation's commit is refused and writes nothing (no dual writers), and the new one commits.

mod support;

use std::sync::Arc;

use serde_json::json;
use squadron_core::ids::WorkerId;
use squadron_isolation::{CommitOutcome, CommitRequest, GitBroker, RefusalCode};
use squadron_worker::{ControlFence, WorkerConfig};
use support::*;

fn acquire(url: &str, profile: u64, expected: u64) -> (u64, u64) {
    let r = post(
        &format!("{url}/api/v1/profiles/{profile}/leases"),
        acquire_body(expected),
    )
    .expect("acquire");
    assert!(r.ok(), "{r:?}");
    let g = &r.body["lease_granted"];
    (
        g["lease"].as_u64().expect("lease"),
        g["generation"].as_u64().expect("generation"),
    )
}

#[test]
fn a_stale_generation_cannot_commit_and_the_new_one_can() {
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    let profile = setup_project(&url, "broker", 1, 4)[0];
    let repo = git_repo(cluster.dir.path());
    // The fence is asked of the leader as worker w1 would ask it (WorkerControl/CheckFence).
    let worker_dir = cluster.dir.path().join("w1");
    let tls = pki().issue_worker("w1", &worker_dir.join("pki"));
    let config = WorkerConfig::new(
        WorkerId::new("w1").expect("id"),
        cluster.urls(),
        worker_dir,
        "127.0.0.1:0".parse().expect("addr"),
    );
    let fence = ControlFence::for_worker(&config, tls).expect("fence");
    let broker =
        GitBroker::open(&cluster.dir.path().join("broker-state"), Arc::new(fence)).expect("broker");
    broker
        .register_profile(profile, &repo, &repo.join(".git"))
        .expect("register");
    let rt = tokio::runtime::Runtime::new().expect("runtime");

    let (lease1, gen1) = acquire(&url, profile, 0);
    std::fs::write(repo.join("README.md"), "# first generation\n").expect("write");
    let head0 = git(&repo, &["rev-parse", "HEAD"]);
    let commit = |lease: u64, generation: u64, head: &str, key: &str| {
        rt.block_on(broker.commit(CommitRequest {
            profile,
            lease,
            generation,
            expected_head: Some(head.to_string()),
            paths: vec!["README.md".into()],
            message: format!("work of generation {generation}"),
            idempotency_key: key.into(),
        }))
    };
    let head1 = match commit(lease1, gen1, &head0, "g1-a") {
        CommitOutcome::Committed { commit, replayed } => {
            assert!(!replayed);
            commit
        }
        CommitOutcome::Refused(r) => panic!("the current generation was refused: {r:?}"),
    };
    assert_eq!(git(&repo, &["rev-parse", "HEAD"]), head1);

    // The operator stops generation 1; its process is proved gone; generation 2 is granted.
    let r = post(
        &format!("{url}/api/v1/leases/{lease1}/fence"),
        json!({"profile": profile, "generation": gen1, "reason": "operator"}),
    )
    .expect("fence");
    assert!(r.ok(), "{r:?}");
    // Evidence comes from the holder's worker (w1), under its certificate.
    let r = worker_post(
        "w1",
        &format!("{url}/api/v1/leases/{lease1}/evidence"),
        json!({"profile": profile, "generation": gen1, "cgroup": "/sys/fs/cgroup/test/g1",
               "populated": false, "observed_at_ms": squadron_client::now_ms()}),
    )
    .expect("evidence");
    assert!(r.ok(), "{r:?}");
    let (lease2, gen2) = acquire(&url, profile, gen1);
    assert_eq!(gen2, gen1 + 1);

    // Generation 1 tries again: refused, nothing written.
    std::fs::write(repo.join("README.md"), "# stale writer\n").expect("write");
    let refs_before = git(&repo, &["for-each-ref"]);
    match commit(lease1, gen1, &head1, "g1-b") {
        CommitOutcome::Refused(r) => {
            assert_eq!(r.code, RefusalCode::StaleGeneration, "{r:?}");
            assert_eq!(r.current_generation, Some(gen2), "{r:?}");
        }
        CommitOutcome::Committed { commit, .. } => panic!("a stale generation committed {commit}"),
    }
    assert_eq!(git(&repo, &["rev-parse", "HEAD"]), head1, "HEAD moved");
    assert_eq!(git(&repo, &["for-each-ref"]), refs_before, "refs changed");

    // Generation 2 commits on top.
    std::fs::write(repo.join("README.md"), "# second generation\n").expect("write");
    match commit(lease2, gen2, &head1, "g2-a") {
        CommitOutcome::Committed { commit, .. } => {
            assert_eq!(git(&repo, &["rev-parse", "HEAD"]), commit);
            let message = git(&repo, &["log", "-1", "--format=%B"]);
            assert!(
                message.contains(&format!("Squadron-Generation: {gen2}")),
                "{message}"
            );
        }
        CommitOutcome::Refused(r) => panic!("the new generation was refused: {r:?}"),
    }
    let stats = broker.stats();
    assert_eq!(stats.accepted, 2, "{stats:?}");
    assert_eq!(stats.refused_stale, 1, "{stats:?}");
    assert_eq!(
        stats.accepted_from_non_current, 0,
        "dual writers: {stats:?}"
    );
}
