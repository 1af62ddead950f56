//! The faults issue 17 added, each injected once in one run (`--faults`, in order): one-way
//! partitions both ways, packet loss and delay, removal of the leader, a skewed follower then the
//! leader killed, a skewed leader then isolated, a follower replaced by a node with an empty
//! disk. The run must be valid, and each must appear in the history.

mod support;

use serde_json::json;

const FAULTS: [&str; 8] = [
    "partition-one-way-from-leader",
    "partition-one-way-to-leader",
    "packet-loss",
    "packet-delay",
    "membership-remove-leader",
    "clock-skew-follower-kill-leader",
    "clock-skew-leader-isolated",
    "replace-wiped",
];

#[test]
fn every_new_fault_once_and_the_run_is_valid() {
    let out = tempfile::tempdir().expect("tempdir");
    let faults = FAULTS.join(",");
    let (status, results, text) = support::run_suite(
        out.path(),
        &[
            "--nodes",
            "3",
            "--workload",
            "lease",
            "--nemesis",
            "none",
            "--faults",
            &faults,
            "--time-limit",
            "54",
            "--rate",
            "20",
            "--seed",
            "3",
            "--fault-secs",
            "4",
            "--quiet-secs",
            "2",
        ],
    );
    support::assert_valid(out.path(), &results, &text);
    assert!(status.success(), "exit {status}");
    support::assert_injected(out.path(), &FAULTS, &text);
    assert_wiped_node_rejoined(out.path(), &text);
    assert_writes_commit_under_delay(out.path(), &text);
}

/// The delay slows the cluster without stopping it: a write invoked while packets between the
/// nodes were held succeeded before the heal (a round trip of twice the delay stays under the
/// heartbeat interval, which openraft times appends out after; at twice this delay none did).
fn assert_writes_commit_under_delay(out: &std::path::Path, text: &str) {
    let history = std::fs::read_to_string(out.join("history.jsonl")).expect("history");
    let events: Vec<serde_json::Value> = history
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .collect();
    let nemesis_at = |from: usize, fault: &str| {
        events[from..]
            .iter()
            .position(|e| e["process"] == "nemesis" && e["value"]["fault"] == fault)
            .map(|i| from + i)
    };
    let start = nemesis_at(0, "packet-delay").expect("packet-delay in the history");
    let end = nemesis_at(start, "heal").expect("its heal");
    let mut invoked = std::collections::BTreeSet::new();
    let mut committed = 0;
    for (i, e) in events.iter().enumerate().skip(start) {
        let write = e["f"] != "read" && e["process"] != "nemesis";
        match e["type"].as_str() {
            Some("invoke") if write && i < end => {
                invoked.insert(e["process"].to_string());
            }
            Some("ok") if write && i < end && invoked.remove(&e["process"].to_string()) => {
                committed += 1
            }
            Some(_) => {
                invoked.remove(&e["process"].to_string());
            }
            None => {}
        }
    }
    assert!(
        committed > 0,
        "no write invoked under the packet delay succeeded\n{text}"
    );
}

/// The replaced node lost its Raft data, and the heal that followed started it and made it a
/// voter again (the run's validity then says it caught up to the same digest).
fn assert_wiped_node_rejoined(out: &std::path::Path, text: &str) {
    let history = std::fs::read_to_string(out.join("history.jsonl")).expect("history");
    let nemesis: Vec<serde_json::Value> = history
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["process"] == "nemesis")
        .collect();
    let at = nemesis
        .iter()
        .position(|e| e["value"]["fault"] == "replace-wiped")
        .expect("replace-wiped in the history");
    let detail = &nemesis[at]["value"]["detail"];
    let node = detail["nodes"][0].clone();
    assert!(
        detail["wiped"]
            .as_array()
            .is_some_and(|w| w.contains(&json!("raft"))),
        "the Raft store was not wiped: {detail}\n{text}"
    );
    let heal = &nemesis[at + 1]["value"];
    assert_eq!(heal["fault"], "heal", "{heal}");
    for step in ["restarted", "readded"] {
        assert!(
            heal["detail"][step]
                .as_array()
                .is_some_and(|n| n.contains(&node)),
            "node {node} was not {step}: {heal}\n{text}"
        );
    }
}

#[test]
fn an_unknown_fault_name_is_refused_before_anything_starts() {
    let out = tempfile::tempdir().expect("tempdir");
    let stderr = support::run_refused(
        out.path(),
        &[
            "--nemesis",
            "none",
            "--faults",
            "packet-loss,partition-sideways",
        ],
    );
    assert!(
        stderr.contains("invalid setting faults")
            && stderr.contains("\"partition-sideways\"")
            && stderr.contains("packet-loss"),
        "stderr: {stderr}"
    );
}
