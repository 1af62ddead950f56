//! The CI smoke run: 3 real nodes, 30 s of the lease workload under partitions and kills,
//! then the checkers. The run must be valid, and every node must have snapshotted.

mod support;

use serde_json::json;

#[test]
fn thirty_seconds_of_partitions_and_kills_is_valid() {
    let out = tempfile::tempdir().expect("tempdir");
    let (status, results, text) = support::run_suite(
        out.path(),
        &[
            "--nodes",
            "3",
            "--workload",
            "lease",
            "--nemesis",
            "partition-kill",
            "--time-limit",
            "30",
            "--rate",
            "20",
            "--seed",
            "7",
            "--fault-secs",
            "6",
            "--quiet-secs",
            "3",
        ],
    );
    assert_eq!(results["valid"], json!(true), "results:\n{text}");
    assert!(status.success(), "exit {status}");
    assert!(
        results["operations"]["ok"].as_u64().unwrap() > 50,
        "too few ok operations:\n{text}"
    );
    assert!(
        results["run"]["faults"].as_u64().unwrap() >= 2,
        "too few faults injected:\n{text}"
    );
    assert_eq!(
        results["linearizability"].as_array().unwrap().len(),
        4,
        "{text}"
    );
    let history = std::fs::read_to_string(out.path().join("history.jsonl")).expect("history");
    assert!(
        history.contains("\"kill-") || history.contains("\"partition-"),
        "no fault in the history"
    );
    // Every node built a snapshot and purged its log behind it (chaos nodes snapshot every 64
    // entries), and still agreed on the digest above.
    let nodes: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("nodes.json")).expect("nodes.json"),
    )
    .expect("nodes.json parses");
    for node in nodes.as_array().expect("nodes") {
        assert!(
            node["snapshot"].as_u64().is_some() && node["purged"].as_u64().is_some(),
            "a node without a snapshot or a purged log: {nodes:#}"
        );
    }
    let report = std::fs::read_to_string(out.path().join("report.html")).expect("report.html");
    assert!(report.contains("<svg"), "report.html has no plot");
    assert!(
        !report.contains("<script") && !report.contains("src="),
        "report.html must fetch nothing"
    );
}
