//! Workloads of issue 17, each in a short run under partitions and kills (the two run at once):
//! - `capacity`: the eight profiles share four slots, and all their operations are checked
//!   together as one object (`capacity/*`, `model_project.rs`), which judges every grant
//!   against the slots and every `capacity_full` refusal's `held` count;
//! - `tasks`: dedicated tasks moved through their lifecycle by the harness's worker's
//!   reports, each task checked against the lifecycle (`model_task.rs`): only legal
//!   transitions recorded, each from the state it names, never undone;
//! - `keyed` (INV-11): each write goes under its idempotency key to the next node after an
//!   unknown outcome, and answered writes are replayed later, across snapshots, kills and
//!   partitions: the run is valid, writes went on to other nodes, and replays got their first
//!   answers back.

mod support;

use serde_json::Value;

#[test]
fn the_project_s_admission_and_held_counts_are_linearizable_under_faults() {
    let out = tempfile::tempdir().expect("tempdir");
    let (status, results, text) =
        support::run_short(out.path(), "capacity", "partition-kill", 15, 50);
    support::assert_valid(out.path(), &results, &text);
    assert!(status.success(), "exit {status}");
    let project = results["linearizability"]
        .as_array()
        .expect("verdicts")
        .iter()
        .find(|v| v["key"] == "capacity/*")
        .unwrap_or_else(|| panic!("no project-wide verdict:\n{text}"));
    assert_eq!(project["model"], "project-capacity");
    assert_eq!(project["verdict"], "linearizable");
    assert!(
        project["operations"].as_u64().unwrap_or(0) > 100,
        "{project}"
    );
    let history = std::fs::read_to_string(out.path().join("history.jsonl")).expect("history");
    let full = history
        .lines()
        .filter(|l| l.contains("\"capacity_full\"") && l.contains("\"held\":4"))
        .count();
    assert!(full >= 1, "no capacity_full refusal was seen:\n{text}");
}

#[test]
fn task_transitions_are_legal_and_linearizable_under_faults() {
    let out = tempfile::tempdir().expect("tempdir");
    let (status, results, text) = support::run_short(out.path(), "tasks", "partition-kill", 15, 50);
    support::assert_valid(out.path(), &results, &text);
    assert!(status.success(), "exit {status}");
    let verdicts = results["linearizability"].as_array().expect("verdicts");
    let tasks = verdicts
        .iter()
        .filter(|v| v["model"] == "task-lifecycle" && v["verdict"] == "linearizable")
        .count();
    assert!(tasks >= 3, "only {tasks} tasks were checked:\n{text}");
    let history = std::fs::read_to_string(out.path().join("history.jsonl")).expect("history");
    // Reports recorded, and refusals of reports naming a state already left.
    for seen in ["\"state\":\"PROVISIONING\"", "\"stale_task_state\""] {
        assert!(history.contains(seen), "{seen} never seen:\n{text}");
    }
}

/// Completions of `f` in the history, with their values.
fn completions(out: &std::path::Path, f: &str, kind: &str) -> Vec<Value> {
    let history = std::fs::read_to_string(out.join("history.jsonl")).expect("history");
    history
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["f"] == f && e["type"] == kind && e["process"] != "nemesis")
        .map(|e| e["value"].clone())
        .collect()
}

#[test]
fn keyed_writes_retried_on_other_nodes_take_effect_once_and_answer_alike() {
    let out = tempfile::tempdir().expect("tempdir");
    let (status, results, text) = support::run_short(out.path(), "keyed", "partition-kill", 20, 50);
    support::assert_valid(out.path(), &results, &text);
    assert!(status.success(), "exit {status}");
    let answered = completions(out.path(), "cas", "ok");
    let moved_on = |v: &&Value| v["attempts"].as_u64().is_some_and(|a| a >= 2);
    let retried = answered.iter().filter(moved_on).count();
    let after_unknown = answered
        .iter()
        .filter(|v| v["unknown_attempts"].as_u64().is_some_and(|a| a >= 1))
        .count();
    // Every completion, answered or not, that went on to another node: the kills and
    // partitions make some whatever the timing (an answer after it is luck).
    let resent = ["ok", "fail", "info"]
        .into_iter()
        .flat_map(|kind| completions(out.path(), "cas", kind))
        .filter(|v| moved_on(&v))
        .count();
    let replays = completions(out.path(), "replay", "ok").len();
    eprintln!(
        "keyed: {} writes answered, {retried} by a retry, {after_unknown} after an unknown \
         outcome; {resent} sent to more than one node; {replays} replays answered",
        answered.len()
    );
    assert!(resent >= 1, "no write was sent to a second node:\n{text}");
    assert!(
        replays >= 5,
        "only {replays} replays were answered:\n{text}"
    );
}
