//! The faults issue 17 added, each injected once in one run (`--faults`, in order): one-way
//! partitions both ways, packet loss, removal of the leader, a skewed follower then the
//! leader killed, a skewed leader then isolated. The run must be valid, and each must appear
//! in the history.

mod support;

use serde_json::json;

const FAULTS: [&str; 6] = [
    "partition-one-way-from-leader",
    "partition-one-way-to-leader",
    "packet-loss",
    "membership-remove-leader",
    "clock-skew-follower-kill-leader",
    "clock-skew-leader-isolated",
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
            "42",
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
    assert_eq!(results["valid"], json!(true), "results:\n{text}");
    assert!(status.success(), "exit {status}");
    support::assert_injected(out.path(), &FAULTS, &text);
}

#[test]
fn an_unknown_fault_name_is_refused_before_anything_starts() {
    let out = tempfile::tempdir().expect("tempdir");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_squadron-jepsen"))
        .args([
            "run",
            "--nemesis",
            "none",
            "--faults",
            "packet-loss,partition-sideways",
        ])
        .arg("--bin")
        .arg(support::node_binary())
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("run squadron-jepsen");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "stderr: {stderr}");
    assert!(
        stderr.contains("invalid setting faults")
            && stderr.contains("\"partition-sideways\"")
            && stderr.contains("packet-loss"),
        "stderr: {stderr}"
    );
    assert!(
        !out.path().join("history.jsonl").exists(),
        "a run started despite the bad name"
    );
}
