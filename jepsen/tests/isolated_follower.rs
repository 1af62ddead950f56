//! A follower cut off from both other voters for several election timeouts does not campaign
//! (`squadron-server/src/quorum_watch.rs`, issue 17 item 8): its term stays, and when the
//! partition heals the leader keeps its leadership and its term, and a linearizable read
//! through the healed follower is answered within a second. Without the watch the follower
//! raised its term at every timeout and deposed the leader on the heal.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use squadron_client::Consistency;
use squadron_jepsen::cluster::{Cluster, NetMode};

mod support;

/// Several election timeouts of the chaos nodes (500–1000 ms).
const ISOLATION: Duration = Duration::from_secs(5);
/// DESIGN §7: reads available within 1 s of a partition healing.
const READ_AFTER_HEAL_MS_MAX: u128 = 1_000;

#[tokio::test]
async fn an_isolated_follower_neither_raises_its_term_nor_deposes_the_leader() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster =
        Cluster::prepare(dir.path(), &support::node_binary(), 3, NetMode::Netns, None)
            .expect("a cluster in network namespaces (root, iproute2, iptables)");
    cluster.start_all().await.expect("start");
    let leader = cluster
        .wait_for_leader(Duration::from_secs(30))
        .await
        .expect("a leader");
    let term = cluster.status(leader).await.expect("leader status").term;
    let follower = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    let others: BTreeSet<u64> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != follower)
        .collect();
    let mut grudge: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    grudge.insert(follower, others.clone());
    for o in &others {
        grudge.insert(*o, BTreeSet::from([follower]));
    }
    let net = cluster.net.as_ref().expect("namespaces");
    net.partition(&grudge).expect("partition");
    tokio::time::sleep(ISOLATION).await;
    let isolated = cluster.status(follower).await.expect("follower status");
    assert_eq!(
        isolated.term, term,
        "the isolated follower campaigned (term {term} → {})",
        isolated.term
    );
    net.heal().expect("heal");
    let healed = Instant::now();
    let client = cluster
        .client(
            vec![url_of(&cluster, follower)],
            Duration::from_secs(5),
            Duration::from_secs(1),
        )
        .expect("client");
    let mut read = client.cluster_status(Consistency::Linearizable).await;
    while read.is_err() && healed.elapsed() < Duration::from_secs(10) {
        if let Err(e) = &read {
            eprintln!("{} ms: {e}", healed.elapsed().as_millis());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        read = client.cluster_status(Consistency::Linearizable).await;
    }
    let waited = healed.elapsed().as_millis();
    let status = read.expect("a linearizable read through the healed follower");
    eprintln!("first linearizable read through the healed follower after {waited} ms");
    assert!(
        waited <= READ_AFTER_HEAL_MS_MAX,
        "the first linearizable read came {waited} ms after the heal"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = cluster.status(leader).await.expect("leader status");
    assert_eq!(
        (after.leader, after.term),
        (Some(leader), term),
        "the heal deposed the leader ({status:?})"
    );
    cluster.stop_all();
}

/// A node's REST URL as the harness reaches it.
fn url_of(cluster: &Cluster, id: u64) -> String {
    let index = cluster
        .ids()
        .iter()
        .position(|i| *i == id)
        .expect("a node of the cluster");
    cluster.endpoints()[index].clone()
}
