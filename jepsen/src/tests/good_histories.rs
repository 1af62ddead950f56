//! Histories a correct system can produce must pass, unknown outcomes included.

use serde_json::{json, Value};

use super::builder::Builder;
use crate::checker::Checker;
use crate::history::History;
use crate::node_final::NodeFinal;
use crate::results::Validity;

fn check(h: &History) -> crate::results::Results {
    Checker::default().check(h, None, Vec::new())
}

#[test]
fn sequential_acquire_release_read_is_valid() {
    let h = Builder::new()
        .read_lease(0.0, 1.0, 1, "lease/1", 0, false)
        .acquire(2.0, 3.0, 1, "lease/1", 0, 1)
        .read_lease(4.0, 5.0, 2, "lease/1", 1, true)
        .release(6.0, 7.0, 1, "lease/1", 1)
        .read_lease(8.0, 9.0, 2, "lease/1", 1, false)
        .final_lease(10.0, 3, "lease/1", 1, false)
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary());
    assert_eq!(r.operations.ok, 6);
    assert_eq!(r.linearizability.len(), 1);
}

#[test]
fn concurrent_acquires_with_one_winner_and_refusals_are_valid() {
    let h = Builder::new()
        .invoke(0.0, 1, "acquire", "lease/1", json!({"expected": 0}))
        .invoke(0.5, 2, "acquire", "lease/1", json!({"expected": 0}))
        .invoke(0.7, 3, "acquire", "lease/1", json!({"expected": 0}))
        // Process 2 read the generation as 1 late: process 1's grant took effect first.
        .fail(
            2.0,
            2,
            "acquire",
            "lease/1",
            json!({"error": "stale_generation", "current": 1}),
        )
        .ok(
            3.0,
            1,
            "acquire",
            "lease/1",
            json!({"generation": 1, "lease": 7}),
        )
        // Generation 1 is live: an acquire expecting it is refused as busy.
        .invoke(3.5, 2, "acquire", "lease/1", json!({"expected": 1}))
        .fail(3.9, 2, "acquire", "lease/1", json!({"error": "busy"}))
        .release(4.0, 5.0, 1, "lease/1", 1)
        // Process 3's answer comes late, after the release: the current generation was 1.
        .fail(
            6.0,
            3,
            "acquire",
            "lease/1",
            json!({"error": "stale_generation", "current": 1}),
        )
        .acquire(7.0, 8.0, 2, "lease/1", 1, 2)
        .final_lease(9.0, 4, "lease/1", 2, true)
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary());
}

#[test]
fn unknown_acquire_may_take_effect_late_or_never() {
    // The info acquire took effect between the two reads.
    let late = Builder::new()
        .invoke(0.0, 1, "acquire", "lease/1", json!({"expected": 0}))
        .info(1.0, 1, "acquire", "lease/1")
        .read_lease(2.0, 3.0, 2, "lease/1", 0, false)
        .read_lease(4.0, 5.0, 2, "lease/1", 1, true)
        .final_lease(6.0, 4, "lease/1", 1, true)
        .build();
    assert_eq!(check(&late).valid, Validity::Valid);
    // It never took effect.
    let never = Builder::new()
        .invoke(0.0, 1, "acquire", "lease/1", json!({"expected": 0}))
        .info(1.0, 1, "acquire", "lease/1")
        .read_lease(2.0, 3.0, 2, "lease/1", 0, false)
        .acquire(4.0, 5.0, 3, "lease/1", 0, 1)
        .final_lease(6.0, 4, "lease/1", 1, true)
        .build();
    assert_eq!(
        check(&never).valid,
        Validity::Valid,
        "{}",
        check(&never).summary()
    );
    // No completion at all before the history ended: also unknown.
    let open = Builder::new()
        .invoke(0.0, 1, "acquire", "lease/1", json!({"expected": 0}))
        .read_lease(2.0, 3.0, 2, "lease/1", 1, true)
        .final_lease(4.0, 4, "lease/1", 1, true)
        .build();
    assert_eq!(check(&open).valid, Validity::Valid);
}

#[test]
fn cas_register_and_capsule_chain_pass_when_consistent() {
    let h = Builder::new()
        .invoke(0.0, 1, "cas", "cas/3", json!({"expected": 0, "value": 5}))
        .invoke(0.1, 2, "cas", "cas/3", json!({"expected": 0, "value": 6}))
        .ok(1.0, 1, "cas", "cas/3", json!({"version": 1}))
        .fail(
            1.1,
            2,
            "cas",
            "cas/3",
            json!({"error": "version_conflict", "current": 1}),
        )
        .invoke(2.0, 3, "read", "cas/3", json!({"final": true}))
        .ok(3.0, 3, "read", "cas/3", json!({"version": 1, "value": 5}))
        .invoke(
            0.0,
            4,
            "append",
            "capsule/9",
            json!({"sequence": 1, "previous": null, "digest": "aa"}),
        )
        .ok(
            1.0,
            4,
            "append",
            "capsule/9",
            json!({"sequence": 1, "digest": "aa"}),
        )
        .invoke(
            2.0,
            4,
            "append",
            "capsule/9",
            json!({"sequence": 2, "previous": "aa", "digest": "bb"}),
        )
        .ok(
            3.0,
            4,
            "append",
            "capsule/9",
            json!({"sequence": 2, "digest": "bb"}),
        )
        .invoke(4.0, 5, "chain", "capsule/9", Value::Null)
        .ok(
            5.0,
            5,
            "chain",
            "capsule/9",
            json!({"capsules": [
            {"sequence": 1, "previous": null, "digest": "aa"},
            {"sequence": 2, "previous": "aa", "digest": "bb"}]}),
        )
        .invoke(6.0, 6, "read", "capsule/9", json!({"final": true}))
        .ok(
            7.0,
            6,
            "read",
            "capsule/9",
            json!({"sequence": 2, "digest": "bb"}),
        )
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary());
    assert_eq!(r.linearizability.len(), 2);
}

#[test]
fn equal_digests_pass_and_history_round_trips_through_jsonl() {
    let h = Builder::new()
        .nemesis(0.0, "start", "kill n1")
        .acquire(1.0, 2.0, 1, "lease/1", 0, 1)
        .nemesis(3.0, "stop", "kill n1")
        .final_lease(4.0, 2, "lease/1", 1, true)
        .build();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    h.save(&path).unwrap();
    let back = History::load(&path).unwrap();
    assert_eq!(back, h);
    let intervals = back.nemesis_intervals();
    assert_eq!(intervals.len(), 1);
    assert_eq!(intervals[0].end_ms, Some(3.0));
    let nodes = [
        NodeFinal {
            id: 1,
            applied: Some(9),
            digest: Some("d".into()),
            snapshot: None,
            purged: None,
            error: None,
        },
        NodeFinal {
            id: 2,
            applied: Some(9),
            digest: Some("d".into()),
            snapshot: None,
            purged: None,
            error: None,
        },
    ];
    let r = Checker::default().check(&back, Some(&nodes), Vec::new());
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary());
}

#[test]
fn results_round_trip_through_json() {
    let h = Builder::new().acquire(0.0, 1.0, 1, "lease/1", 0, 1).build();
    let mut r = check(&h);
    r.run.insert("concurrency".into(), json!(6));
    let text = serde_json::to_string_pretty(&r).unwrap();
    let back: crate::results::Results = serde_json::from_str(&text).unwrap();
    assert_eq!(back, r);
}

#[test]
fn a_replicated_clock_within_the_slew_passes() {
    // A skewed leader's clock gains 10% of the elapsed time at most: 1.9 s 20 s in is fine,
    // and so is one behind real time.
    let h = Builder::new()
        .acquire(0.0, 1.0, 1, "lease/1", 0, 1)
        .nemesis_with(
            20_000.0,
            "start",
            "clock-skew-leader",
            json!({"nodes": [1], "offset": "+86400s", "replicated_clock_ahead_ms": 1_900}),
        )
        .nemesis_with(
            26_000.0,
            "stop",
            "heal",
            json!({"clock_ahead_ms": -300, "clock_reset": [1]}),
        )
        .final_lease(30_000.0, 2, "lease/1", 1, true)
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary());
}

#[test]
fn a_key_without_a_final_read_is_unknown_not_valid() {
    // Nothing is wrong in what was seen, but the acknowledged acquire was never read back.
    let h = Builder::new().acquire(0.0, 1.0, 1, "lease/1", 0, 1).build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Unknown, "{}", r.summary());
    assert!(
        r.unknowns.iter().any(|u| u.contains("lease/1")),
        "{:?}",
        r.unknowns
    );
    // A failed final read does not count either.
    let failed = Builder::new()
        .acquire(0.0, 1.0, 1, "lease/1", 0, 1)
        .invoke(2.0, 2, "read", "lease/1", json!({"final": true}))
        .fail(3.0, 2, "read", "lease/1", json!({"error": "unavailable"}))
        .build();
    assert_eq!(check(&failed).valid, Validity::Unknown);
}

#[test]
fn a_keyed_write_whose_replay_repeats_its_answer_passes() {
    let answer = json!({"version": 1});
    let h = Builder::new()
        .keyed_cas(0.0, 1, "keyed/1", "sq-k1", 1, 3)
        .replay(3.0, 1, "keyed/1", "sq-k1", answer.clone(), answer)
        .invoke(7.0, 2, "read", "keyed/1", json!({"final": true}))
        .ok(8.0, 2, "read", "keyed/1", json!({"version": 1, "value": 7}))
        .build();
    let r = Checker::default().check(&h, None, Vec::new());
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary());
}

#[test]
fn a_task_assigned_unseen_then_moved_through_its_lifecycle_passes() {
    let mut b = Builder::new();
    // Unassigned at first, then the scheduler's move (no operation of its own) is made lazily.
    b.read_task(0.0, 1, "PENDING", Value::Null)
        .transition(
            1.0,
            1,
            "STAGING",
            "PROVISIONING",
            json!({"error": "not_task_owner"}),
        )
        .transition(
            2.0,
            1,
            "STAGING",
            "PROVISIONING",
            json!({"state": "PROVISIONING"}),
        )
        .transition(
            3.0,
            1,
            "STAGING",
            "FAILED",
            json!({"error": "stale_task_state", "current": "PROVISIONING"}),
        )
        .transition(
            4.0,
            1,
            "PROVISIONING",
            "COMPLETED",
            json!({"error": "illegal_transition"}),
        );
    let mut at = 5.0;
    for (from, to) in [
        ("PROVISIONING", "READY"),
        ("READY", "RUNNING"),
        ("RUNNING", "COMPLETING"),
        ("COMPLETING", "COMPLETED"),
    ] {
        b.transition(at, 1, from, to, json!({"state": to}));
        at += 1.0;
    }
    b.read_task(at, 1, "COMPLETED", json!({"final": true}));
    let r = check(&b.build());
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary());
}

/// A launch, a graceful takeover whose replaced generation's commit is refused, a crash
/// takeover whose outcome is unknown, a late commit refused, and final reads that saw the
/// unknown grant take effect.
#[test]
fn takeovers_with_refused_stale_writers_are_valid() {
    let k = "takeover/1";
    let h = Builder::new()
        .launch_then_take_over(k)
        .invoke(
            4.0,
            1,
            "stale-commit",
            k,
            json!({"generation": 1, "lease": 3}),
        )
        .fail(
            5.0,
            1,
            "stale-commit",
            k,
            json!({"error": "fenced", "current": 2}),
        )
        .invoke(6.0, 1, "takeover", k, json!({"kind": "crash"}))
        .info(7.0, 1, "takeover", k)
        .invoke(
            8.0,
            5,
            "late-git-commit",
            k,
            json!({"generation": 2, "lease": 4}),
        )
        .fail(
            9.0,
            5,
            "late-git-commit",
            k,
            json!({"error": "stale_generation"}),
        )
        .invoke(10.0, 2, "read", k, json!({"final": true}))
        .ok(11.0, 2, "read", k, json!({"generation": 3, "live": true}))
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary());
}
