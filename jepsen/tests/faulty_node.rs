//! A node built with a deliberate fault is caught by a real run: with the cargo feature
//! `jepsen-faults` (which `scripts/test` builds) and `SQUADRON_JEPSEN_FAULT=local-reads`
//! in the nodes' environment, "linearizable" reads are answered from local state, and the
//! CAS workload under partitions must be judged invalid with non-linearizable reads.

use std::process::Command;

mod support;

#[test]
fn a_node_serving_local_reads_is_caught() {
    let out = tempfile::tempdir().expect("tempdir");
    let status = Command::new(env!("CARGO_BIN_EXE_squadron-jepsen"))
        .args([
            "run",
            "--nodes",
            "3",
            "--workload",
            "cas",
            "--nemesis",
            "partition",
        ])
        .args(["--time-limit", "25", "--rate", "25", "--seed", "3"])
        .args(["--fault-secs", "8", "--quiet-secs", "2"])
        .arg("--bin")
        .arg(support::node_binary())
        .arg("--out")
        .arg(out.path())
        // The nodes inherit the harness's environment.
        .env("SQUADRON_JEPSEN_FAULT", "local-reads")
        .status()
        .expect("run squadron-jepsen");
    let text = std::fs::read_to_string(out.path().join("results.json")).expect("results.json");
    let results: serde_json::Value = serde_json::from_str(&text).expect("parses");
    assert_eq!(
        results["valid"],
        serde_json::json!(false),
        "the faulty node went unnoticed (was the binary built with --features \
         squadron/jepsen-faults?):\n{text}"
    );
    assert_eq!(status.code(), Some(1));
    let kinds: Vec<&str> = results["anomalies"]
        .as_array()
        .expect("anomalies")
        .iter()
        .filter_map(|a| a["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"non-linearizable"), "{text}");
}
