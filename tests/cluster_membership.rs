//! Membership changes under load, and a five-node cluster losing two, then three nodes.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::*;

/// Keeps writing heartbeats through every given endpoint until stopped; counts successes.
fn background_writes(
    urls: Vec<String>,
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let url = &urls[i % urls.len()];
            if let Ok(r) = worker_post(
                "w1",
                &format!("{url}/api/v1/workers/w1/heartbeat"),
                json!(null),
            ) {
                if r.ok() {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

#[test]
fn add_a_learner_promote_it_then_remove_a_voter_and_the_leader_under_load() {
    let mut cluster = Cluster::start(3);
    let url1 = cluster.url(1);
    setup_project(&url1, "web", 1, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let writer = background_writes(cluster.urls(), stop.clone(), ok.clone());

    let new_id = cluster.add_node();
    let spec = cluster.nodes[&new_id].spec.clone();
    let r = post(
        &format!("{url1}/api/v1/cluster/learners"),
        json!({"id": new_id, "rest": spec.rest, "grpc": spec.grpc, "peer": spec.peer}),
    )
    .unwrap();
    assert!(r.ok(), "add learner: {r:?}");
    let r = post(
        &format!("{}/api/v1/cluster/voters", cluster.url(2)),
        json!({"id": new_id}),
    )
    .unwrap();
    assert!(r.ok(), "promote (through a follower): {r:?}");
    // The new node learns of its promotion when it applies the change; its own (local) view
    // may lag the leader's answer by a moment.
    let sees_itself_a_voter = || {
        cluster.status(new_id).is_ok_and(|status| {
            status["members"].as_array().is_some_and(|members| {
                members
                    .iter()
                    .any(|m| m["id"] == json!(new_id) && m["voter"] == json!(true))
            })
        })
    };
    assert!(
        wait_until(Duration::from_secs(10), sees_itself_a_voter).is_ok(),
        "node {new_id} never saw itself a voter: {:?}",
        cluster.status(new_id)
    );

    // Remove a follower voter, then the leader itself.
    let leader = cluster.wait_for_leader(Duration::from_secs(10));
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let r = http_send(
        "DELETE",
        &format!("{}/api/v1/cluster/members/{follower}", cluster.url(leader)),
        None,
        None,
    )
    .unwrap();
    assert!(r.ok(), "remove follower: {r:?}");
    cluster.kill(follower);
    let r = http_send(
        "DELETE",
        &format!("{}/api/v1/cluster/members/{leader}", cluster.url(new_id)),
        None,
        None,
    )
    .unwrap();
    assert!(r.ok(), "remove leader: {r:?}");
    std::thread::sleep(Duration::from_secs(1));
    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(20));
    assert!(new_leader != leader && new_leader != follower);
    let before = ok.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        ok.load(Ordering::Relaxed) > before,
        "writes did not continue after the changes"
    );
    let members = cluster.status(new_leader).unwrap()["members"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(members, 2);
    cluster.wait_for_equal_digests(Duration::from_secs(20));
}

#[test]
fn five_nodes_survive_two_failures_and_refuse_writes_without_quorum() {
    let mut cluster = Cluster::start(5);
    let url = cluster.url(1);
    setup_project(&url, "web", 2, 2);
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    // Two down (the leader among them): writes go on.
    let others: Vec<u64> = (1..=5).filter(|id| *id != leader).collect();
    cluster.kill(leader);
    cluster.kill(others[0]);
    let live = others[1];
    cluster.wait_for_leader(Duration::from_secs(20));
    let mut acked = Vec::new();
    for i in 0..5 {
        let r = post(
            &format!("{}/api/v1/projects", cluster.url(live)),
            json!({"tenant": "acme", "project": format!("p{i}")}),
        )
        .unwrap();
        assert!(r.ok(), "write with 3 of 5 up: {r:?}");
        acked.push(format!("p{i}"));
    }
    // Three down: no quorum; writes are refused with 503 and a Retry-After.
    cluster.kill(others[1]);
    let survivor = others[2];
    std::thread::sleep(Duration::from_secs(2));
    let r = post(
        &format!("{}/api/v1/projects", cluster.url(survivor)),
        json!({"tenant": "acme", "project": "never"}),
    )
    .unwrap();
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.body["code"], json!("unavailable"));
    // Bring two back: quorum returns, and nothing acknowledged was lost.
    cluster.start_node(leader);
    cluster.start_node(others[0]);
    cluster.wait_for_leader(Duration::from_secs(30));
    for p in &acked {
        let got = http_get(&format!("{}/api/v1/projects/acme/{p}", cluster.url(leader)));
        assert!(got.is_ok(), "acknowledged project {p} lost: {got:?}");
    }
}
