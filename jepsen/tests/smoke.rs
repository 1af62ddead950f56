//! The CI smoke run: 3 real nodes, about 30 s of the lease workload under partitions and
//! kills, then the checkers. The run must be valid.
//!
//! The node binary comes from `SQUADRON_BIN`, else from the same target directory as this test
//! (`<target>/debug/deps/smoke-…` → `<target>/debug/squadron`), which `cargo test --workspace`
//! builds alongside.

use std::path::PathBuf;
use std::process::Command;

fn node_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SQUADRON_BIN") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "SQUADRON_BIN={} is not a file", p.display());
        return p;
    }
    let exe = std::env::current_exe().expect("test executable");
    let debug = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/debug");
    let bin = debug.join("squadron");
    assert!(
        bin.is_file(),
        "node binary not found at {}: build it (`cargo build -p squadron`) or set SQUADRON_BIN",
        bin.display()
    );
    bin
}

#[test]
fn thirty_seconds_of_partitions_and_kills_is_valid() {
    let bin = node_binary();
    let out = tempfile::tempdir().expect("tempdir");
    let status = Command::new(env!("CARGO_BIN_EXE_squadron-jepsen"))
        .args([
            "run",
            "--nodes",
            "3",
            "--workload",
            "lease",
            "--nemesis",
            "partition-kill",
        ])
        .args(["--time-limit", "30", "--rate", "20", "--seed", "7"])
        .args(["--fault-secs", "6", "--quiet-secs", "3"])
        .arg("--bin")
        .arg(&bin)
        .arg("--out")
        .arg(out.path())
        .status()
        .expect("run squadron-jepsen");
    let results_path = out.path().join("results.json");
    let text = std::fs::read_to_string(&results_path)
        .unwrap_or_else(|e| panic!("{} missing ({e}); exit {status}", results_path.display()));
    let results: serde_json::Value = serde_json::from_str(&text).expect("results.json parses");
    assert_eq!(
        results["valid"],
        serde_json::json!(true),
        "results:\n{text}"
    );
    assert!(status.success(), "exit {status}");
    assert!(
        results["operations"]["ok"].as_u64().unwrap() > 50,
        "too few ok operations:\n{text}"
    );
    assert!(
        results["run"]["faults"].as_u64().unwrap() >= 2,
        "too few faults injected:\n{text}"
    );
    assert!(
        results["linearizability"].as_array().unwrap().len() == 4,
        "{text}"
    );
    let history = std::fs::read_to_string(out.path().join("history.jsonl")).expect("history");
    assert!(
        history.contains("\"kill-") || history.contains("\"partition-"),
        "no fault in the history"
    );
    let report = std::fs::read_to_string(out.path().join("report.html")).expect("report.html");
    assert!(report.contains("<svg"), "report.html has no plot");
    assert!(
        !report.contains("<script") && !report.contains("src="),
        "report.html must fetch nothing"
    );
}
