//! Power cuts with the lazy filesystem under every node (issue 17 item 1): a crash drops
//! what a node had not fsynced. The real node keeps every acknowledged write through crashes
//! of one node, the leader and the whole cluster, and as a single node (dev mode's shape);
//! a node built with the deliberate fault `skip-wal-sync` (acknowledges appends without an
//! fsync, syncing once a second) must be caught losing acknowledged writes. Runs one at a time: each is a cluster on two cores.

use std::process::Command;
use std::sync::Mutex;

use serde_json::{json, Value};

mod support;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn run(
    nodes: &str,
    faults: &str,
    time_limit: &str,
    fault_env: Option<&str>,
) -> (Option<i32>, Value, String) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let out = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_squadron-jepsen"));
    cmd.args([
        "run",
        "--nodes",
        nodes,
        "--workload",
        "lease",
        "--nemesis",
        "none",
    ])
    .args(["--faults", faults, "--time-limit", time_limit])
    .args([
        "--rate",
        "20",
        "--seed",
        "3",
        "--fault-secs",
        "4",
        "--quiet-secs",
        "2",
    ])
    .arg("--bin")
    .arg(support::node_binary())
    .arg("--out")
    .arg(out.path());
    // The nodes inherit the harness's environment.
    match fault_env {
        Some(f) => cmd.env("SQUADRON_JEPSEN_FAULT", f),
        None => cmd.env_remove("SQUADRON_JEPSEN_FAULT"),
    };
    let status = cmd.status().expect("run squadron-jepsen");
    let text = std::fs::read_to_string(out.path().join("results.json")).expect("results.json");
    let results: Value = serde_json::from_str(&text).expect("parses");
    if fault_env.is_none() {
        // The real node must be valid; a failure keeps its history and data.
        support::assert_valid(out.path(), &results, &text);
    }
    let names: Vec<&str> = faults.split(',').collect();
    support::assert_injected(out.path(), &names, &text);
    (status.code(), results, text)
}

/// Some node lost unsynced bytes in a crash: the faults did something.
fn lost_bytes(results: &Value) -> u64 {
    let lazyfs = results["run"]["lazyfs"].as_object().expect("run.lazyfs");
    lazyfs
        .values()
        .map(|s| s["lost_bytes"].as_u64().unwrap_or(0))
        .sum()
}

#[test]
fn a_cluster_keeps_every_acknowledged_write_through_power_cuts() {
    let (code, results, text) = run("3", "crash-leader,crash-all,crash-one", "32", None);
    assert_eq!(results["valid"], json!(true), "{text}");
    assert_eq!(code, Some(0));
    assert!(
        lost_bytes(&results) > 0,
        "no crash dropped anything:\n{text}"
    );
}

#[test]
fn a_single_node_keeps_every_acknowledged_write_through_power_cuts() {
    let (code, results, text) = run("1", "crash-one", "22", None);
    assert_eq!(results["valid"], json!(true), "{text}");
    assert_eq!(code, Some(0));
    assert!(
        lost_bytes(&results) > 0,
        "no crash dropped anything:\n{text}"
    );
}

/// The run is invalid, with lost or non-linearizable writes named.
fn assert_caught(code: Option<i32>, results: &Value, text: &str) {
    assert_eq!(
        results["valid"],
        json!(false),
        "the faulty node went unnoticed (built with --features squadron/jepsen-faults?):\n{text}"
    );
    assert_eq!(code, Some(1));
    let kinds = support::anomaly_kinds(results);
    let named = [
        "lost-write",
        "non-linearizable",
        "inv3-duplicate-generation",
    ];
    assert!(
        kinds.iter().any(|k| named.contains(&k.as_str())),
        "{kinds:?}\n{text}"
    );
}

#[test]
fn a_cluster_that_skips_the_wal_sync_is_caught_losing_writes() {
    let (code, results, text) = run("3", "crash-all", "26", Some("skip-wal-sync"));
    assert_caught(code, &results, &text);
}

#[test]
fn a_single_node_that_skips_the_wal_sync_is_caught_losing_writes() {
    let (code, results, text) = run("1", "crash-one", "22", Some("skip-wal-sync"));
    assert_caught(code, &results, &text);
}
