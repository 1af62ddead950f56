//! A clock that cannot jump (issue 17, item 7): one node's wall clock is moved by up to a day
//! (libfaketime) while 2 s leases are acquired, renewed, released and reaped. The replicated
//! clock must stay within the cluster clock's slew of real time at every clock fault and heal,
//! and writes must go on at once after each heal. A node built with the deliberate fault
//! `wall-clock-stamps` (it stamps its wall clock, as nodes did before) must be caught.

use std::process::Command;

use serde_json::{json, Value};

mod support;

/// After a clock fault heals, the first write must succeed within this (before the clock
/// slewed: about 100 s after a +120 s skew of the leader).
const FIRST_WRITE_AFTER_CLOCK_HEAL_MS_MAX: f64 = 5_000.0;
/// The seed's faults include a forward jump of the leader's clock by more than an hour.
const SEED: &str = "5";

/// One cluster at a time: the heal bound is about the cluster, not about a shared machine.
static ONE_RUN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(out: &std::path::Path, fault: Option<&str>) -> (Value, String) {
    let _one = ONE_RUN.lock().unwrap_or_else(|p| p.into_inner());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_squadron-jepsen"));
    cmd.args(["run", "--nodes", "3", "--workload", "expiry"])
        .args(["--nemesis", "clock", "--clock-skew-secs-max", "86400"])
        .args(["--time-limit", "24", "--rate", "20", "--seed", SEED])
        .args(["--fault-secs", "5", "--quiet-secs", "2"])
        .arg("--bin")
        .arg(support::node_binary())
        .arg("--out")
        .arg(out);
    // The nodes inherit the harness's environment.
    match fault {
        Some(f) => cmd.env("SQUADRON_JEPSEN_FAULT", f),
        None => cmd.env_remove("SQUADRON_JEPSEN_FAULT"),
    };
    let status = cmd.status().expect("run squadron-jepsen");
    let text = std::fs::read_to_string(out.join("results.json"))
        .unwrap_or_else(|e| panic!("results.json missing ({e}); exit {status}"));
    (
        serde_json::from_str(&text).expect("results.json parses"),
        text,
    )
}

/// The clock faults' starts in the history: (fault, offset in seconds).
fn clock_faults(out: &std::path::Path) -> Vec<(String, i64)> {
    let history = std::fs::read_to_string(out.join("history.jsonl")).expect("history");
    history
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["process"] == json!("nemesis") && e["f"] == json!("start"))
        .filter_map(|e| {
            let offset = e["value"]["detail"]["offset"].as_str()?;
            let secs = offset.trim_end_matches('s').parse::<i64>().ok()?;
            Some((e["value"]["fault"].as_str()?.to_string(), secs))
        })
        .collect()
}

#[test]
fn day_sized_clock_jumps_leave_the_replicated_clock_on_time() {
    let out = tempfile::tempdir().expect("tempdir");
    let (results, text) = run(out.path(), None);
    let faults = clock_faults(out.path());
    assert!(
        faults
            .iter()
            .any(|(f, secs)| f == "clock-skew-leader" && *secs >= 3_600),
        "seed {SEED} no longer jumps the leader's clock forward by an hour or more: {faults:?}"
    );
    support::assert_valid(out.path(), &results, &text);
    let heals = results["run"]["heals"].as_array().expect("heals");
    assert!(!heals.is_empty(), "no heal measured:\n{text}");
    for h in heals {
        let first = h["first_write_ms"].as_f64();
        assert!(
            first.is_some_and(|ms| ms <= FIRST_WRITE_AFTER_CLOCK_HEAL_MS_MAX),
            "the first write after the heal of {} came after {first:?} ms:\n{text}",
            h["fault"]
        );
    }
}

#[test]
fn a_node_stamping_its_wall_clock_is_caught() {
    let out = tempfile::tempdir().expect("tempdir");
    let (results, text) = run(out.path(), Some("wall-clock-stamps"));
    assert_eq!(
        results["valid"],
        json!(false),
        "the wall-clock stamps went unnoticed (was the binary built with --features \
         squadron/jepsen-faults?):\n{text}"
    );
    let kinds = support::anomaly_kinds(&results);
    assert!(
        kinds.iter().any(|k| k == "clock-jump"),
        "anomalies {kinds:?}:\n{text}"
    );
}
