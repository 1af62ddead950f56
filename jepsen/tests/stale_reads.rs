//! The checkers catch a real bug in a real run: clients that read with
//! `?consistency=stale` (a deliberate client bug) read from partitioned nodes, and the run must
//! be judged invalid with non-linearizable reads.

mod support;

use serde_json::json;

#[test]
fn stale_reads_under_partitions_are_caught() {
    let out = tempfile::tempdir().expect("tempdir");
    let (status, results, text) = support::run_suite(
        out.path(),
        &[
            "--nodes",
            "3",
            "--workload",
            "cas",
            "--nemesis",
            "partition",
            "--reads",
            "stale",
            "--time-limit",
            "25",
            "--rate",
            "25",
            "--seed",
            "3",
            "--fault-secs",
            "8",
            "--quiet-secs",
            "2",
        ],
    );
    assert_eq!(
        results["valid"],
        json!(false),
        "stale reads went unnoticed:\n{text}"
    );
    assert_eq!(status.code(), Some(1), "exit status of an invalid run");
    let kinds: Vec<&str> = results["anomalies"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"non-linearizable"), "{text}");
}
