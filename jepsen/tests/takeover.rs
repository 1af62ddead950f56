//! The takeover workload on a real worker (the process runtime: bubblewrap and cgroups): eight
//! profiles' provider processes launched, taken over gracefully and after a `kill -9`, and
//! stopped, under a paused worker (twice, each time past its agents' leases) and a killed and
//! an isolated leader. Every replaced generation's commit, and every paused generation's late
//! commit to the control plane and through the worker's broker, must be refused; the run must
//! be valid; the worker's evidence must show no dual writer, at most four writers, one sandbox.

mod support;

use serde_json::Value;

const FAULTS: [&str; 4] = [
    "worker-pause",
    "kill-leader",
    "worker-pause",
    "partition-leader",
];

fn events(out: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("history.jsonl"))
        .expect("history")
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The completions of `f` (with the input of their invocation).
fn completions<'a>(events: &'a [Value], f: &str) -> Vec<(&'a Value, &'a Value)> {
    let mut invoked = std::collections::HashMap::new();
    let mut out = Vec::new();
    for e in events.iter().filter(|e| e["f"] == f) {
        let process = e["process"].to_string();
        if e["type"] == "invoke" {
            invoked.insert(process, e);
        } else if let Some(inv) = invoked.remove(&process) {
            out.push((inv, e));
        }
    }
    out
}

#[test]
fn takeovers_under_worker_pauses_and_leader_faults_keep_one_writer() {
    let out = tempfile::tempdir().expect("tempdir");
    let faults = FAULTS.join(",");
    let (status, results, text) = support::run_suite(
        out.path(),
        &[
            "--nodes",
            "3",
            "--workload",
            "takeover",
            "--nemesis",
            "none",
            "--faults",
            &faults,
            "--time-limit",
            "44",
            "--rate",
            "10",
            "--seed",
            "2",
            "--fault-secs",
            "6",
            "--quiet-secs",
            "4",
        ],
    );
    support::assert_valid(out.path(), &results, &text);
    assert!(status.success(), "exit {status}");
    support::assert_injected(out.path(), &FAULTS, &text);
    let events = events(out.path());

    let takeovers = completions(&events, "takeover");
    for kind in ["graceful", "crash"] {
        let done = takeovers
            .iter()
            .filter(|(inv, c)| inv["value"]["kind"] == kind && c["type"] == "ok")
            .count();
        assert!(done > 0, "no {kind} takeover succeeded\n{text}");
    }
    // Refused, each naming the fence; none accepted (the checker's INV-6 would have said so).
    for (f, reasons) in [
        ("stale-commit", &["fenced"][..]),
        ("late-commit", &["fenced", "lease_expired"][..]),
    ] {
        let done = completions(&events, f);
        let refused = done
            .iter()
            .filter(|(_, c)| {
                c["type"] == "fail" && reasons.iter().any(|r| c["value"]["error"] == *r)
            })
            .count();
        assert!(refused > 0, "no {f} was refused by its fence\n{text}");
        assert!(
            done.iter().all(|(_, c)| c["type"] != "ok"),
            "a {f} was accepted\n{text}"
        );
    }
    let git = completions(&events, "late-git-commit");
    assert!(!git.is_empty(), "no late commit through the broker\n{text}");
    assert!(
        git.iter().all(|(_, c)| c["type"] != "ok"),
        "the broker accepted a paused generation's commit\n{text}"
    );

    let evidence = &results["run"]["takeover_evidence"];
    let worker = &evidence["worker"];
    assert_eq!(
        worker["broker"]["accepted_from_non_current"], 0,
        "{evidence}"
    );
    assert!(
        worker["broker"]["commits_accepted"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "no provider committed through the broker: {evidence}"
    );
    // Eight profiles pressed on the four slots: launches were refused for capacity.
    assert!(
        completions(&events, "launch")
            .iter()
            .any(|(_, c)| c["value"]["error"] == "capacity_full"),
        "no launch met a full project\n{text}"
    );
    assert!(
        evidence["peak_slots_held"]
            .as_u64()
            .is_some_and(|n| (1..=4).contains(&n)),
        "{evidence}"
    );
    assert!(
        worker["peak_concurrent_processes"]
            .as_u64()
            .is_some_and(|n| (1..=4).contains(&n)),
        "{evidence}"
    );
    assert_eq!(worker["sandboxes"], 1, "INV-1: {evidence}");
    assert_eq!(
        worker["cgroup_leaves_left"],
        serde_json::json!([]),
        "{evidence}"
    );
}

#[test]
fn a_worker_pause_without_the_takeover_workload_is_refused_before_anything_starts() {
    let out = tempfile::tempdir().expect("tempdir");
    let stderr = support::run_refused(
        out.path(),
        &[
            "--workload",
            "lease",
            "--nemesis",
            "none",
            "--faults",
            "worker-pause",
        ],
    );
    assert!(
        stderr.contains("invalid setting faults")
            && stderr.contains("worker-pause")
            && stderr.contains("--workload takeover"),
        "stderr: {stderr}"
    );
}
