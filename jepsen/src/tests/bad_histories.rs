//! Each hand-built bad history must fail, with the anomaly that names its bug.

use serde_json::{json, Value};

use super::builder::Builder;
use crate::anomaly::AnomalyKind;
use crate::checker::Checker;
use crate::history::History;
use crate::node_final::NodeFinal;
use crate::results::{Results, Validity};

fn check(h: &History) -> Results {
    Checker::default().check(h, None, Vec::new())
}

fn kinds(r: &Results) -> Vec<AnomalyKind> {
    r.anomalies.iter().map(|a| a.kind).collect()
}

#[test]
fn lost_write_fails() {
    // An acknowledged CAS is missing from the final read.
    let h = Builder::new()
        .invoke(0.0, 1, "cas", "cas/1", json!({"expected": 0, "value": 7}))
        .ok(1.0, 1, "cas", "cas/1", json!({"version": 1}))
        .invoke(5.0, 2, "read", "cas/1", json!({"final": true}))
        .ok(
            6.0,
            2,
            "read",
            "cas/1",
            json!({"version": 0, "value": null}),
        )
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Invalid);
    assert!(
        kinds(&r).contains(&AnomalyKind::LostWrite),
        "{}",
        r.summary()
    );
    assert!(
        kinds(&r).contains(&AnomalyKind::NonLinearizable),
        "{}",
        r.summary()
    );
}

#[test]
fn lost_lease_generation_fails() {
    let h = Builder::new()
        .acquire(0.0, 1.0, 1, "lease/1", 0, 1)
        .invoke(5.0, 2, "read", "lease/1", json!({"final": true}))
        .ok(
            6.0,
            2,
            "read",
            "lease/1",
            json!({"generation": 0, "live": false}),
        )
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Invalid);
    assert!(
        kinds(&r).contains(&AnomalyKind::LostWrite),
        "{}",
        r.summary()
    );
}

#[test]
fn stale_read_fails() {
    // The read begins after the acquisition was acknowledged, yet sees the old generation.
    let h = Builder::new()
        .acquire(0.0, 1.0, 1, "lease/1", 0, 1)
        .read_lease(2.0, 3.0, 2, "lease/1", 0, false)
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Invalid);
    assert_eq!(
        kinds(&r),
        vec![AnomalyKind::NonLinearizable],
        "{}",
        r.summary()
    );
    assert!(
        r.anomalies[0].message.contains("lease-register"),
        "{}",
        r.anomalies[0].message
    );
    // The same read overlapping the acquisition is fine.
    let ok = Builder::new()
        .invoke(0.0, 1, "acquire", "lease/1", json!({"expected": 0}))
        .read_lease(0.5, 0.9, 2, "lease/1", 0, false)
        .ok(
            1.0,
            1,
            "acquire",
            "lease/1",
            json!({"generation": 1, "lease": 1}),
        )
        .final_lease(2.0, 3, "lease/1", 1, true)
        .build();
    assert_eq!(
        check(&ok).valid,
        Validity::Valid,
        "{}",
        check(&ok).summary()
    );
}

#[test]
fn stale_cas_read_fails() {
    let h = Builder::new()
        .invoke(0.0, 1, "cas", "cas/1", json!({"expected": 0, "value": 1}))
        .ok(1.0, 1, "cas", "cas/1", json!({"version": 1}))
        .invoke(1.5, 1, "cas", "cas/1", json!({"expected": 1, "value": 2}))
        .ok(2.0, 1, "cas", "cas/1", json!({"version": 2}))
        .invoke(3.0, 2, "read", "cas/1", Value::Null)
        .ok(4.0, 2, "read", "cas/1", json!({"version": 1, "value": 1}))
        .build();
    let r = check(&h);
    assert_eq!(
        kinds(&r),
        vec![AnomalyKind::NonLinearizable],
        "{}",
        r.summary()
    );
}

#[test]
fn unknown_outcome_cannot_take_effect_before_its_invocation() {
    let h = Builder::new()
        .read_lease(0.0, 1.0, 2, "lease/1", 1, true)
        .invoke(2.0, 1, "acquire", "lease/1", json!({"expected": 0}))
        .info(3.0, 1, "acquire", "lease/1")
        .build();
    assert_eq!(check(&h).valid, Validity::Invalid);
    // And once it took effect it cannot be undone.
    let h = Builder::new()
        .invoke(0.0, 1, "acquire", "lease/1", json!({"expected": 0}))
        .info(1.0, 1, "acquire", "lease/1")
        .read_lease(2.0, 3.0, 2, "lease/1", 1, true)
        .read_lease(4.0, 5.0, 2, "lease/1", 0, false)
        .build();
    assert_eq!(check(&h).valid, Validity::Invalid);
}

#[test]
fn duplicate_generation_fails() {
    // Two concurrent acquisitions expecting 0 both succeed with generation 1.
    let h = Builder::new()
        .invoke(0.0, 1, "acquire", "lease/1", json!({"expected": 0}))
        .invoke(0.1, 2, "acquire", "lease/1", json!({"expected": 0}))
        .ok(
            1.0,
            1,
            "acquire",
            "lease/1",
            json!({"generation": 1, "lease": 1}),
        )
        .ok(
            1.1,
            2,
            "acquire",
            "lease/1",
            json!({"generation": 1, "lease": 2}),
        )
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Invalid);
    assert!(
        kinds(&r).contains(&AnomalyKind::Inv3DuplicateGeneration),
        "{}",
        r.summary()
    );
    assert!(
        kinds(&r).contains(&AnomalyKind::NonLinearizable),
        "{}",
        r.summary()
    );
    let dup = r
        .anomalies
        .iter()
        .find(|a| a.kind == AnomalyKind::Inv3DuplicateGeneration)
        .unwrap();
    assert_eq!(dup.ops, vec![0, 1]);
}

#[test]
fn generation_jump_fails() {
    let h = Builder::new().acquire(0.0, 1.0, 1, "lease/1", 0, 2).build();
    let r = check(&h);
    assert!(
        kinds(&r).contains(&AnomalyKind::Inv3GenerationJump),
        "{}",
        r.summary()
    );
    assert!(
        kinds(&r).contains(&AnomalyKind::NonLinearizable),
        "{}",
        r.summary()
    );
}

#[test]
fn five_holders_at_once_fail() {
    let mut b = Builder::new();
    for p in 1..=5u64 {
        b.acquire(p as f64, 10.0 + p as f64, p, &format!("capacity/{p}"), 0, 1);
    }
    // All five hold their slot from 15 ms until their releases begin at 20 ms and later.
    for p in 1..=5u64 {
        b.release(
            20.0 + p as f64,
            30.0 + p as f64,
            p,
            &format!("capacity/{p}"),
            1,
        );
    }
    let r = check(&b.build());
    assert_eq!(r.valid, Validity::Invalid);
    // The project-wide model finds no order either: a fifth grant while four are live.
    let mut found = kinds(&r);
    found.sort();
    assert_eq!(
        found,
        vec![AnomalyKind::NonLinearizable, AnomalyKind::Inv5OverCapacity],
        "{}",
        r.summary()
    );
    let inv5 = r
        .anomalies
        .iter()
        .find(|a| a.kind == AnomalyKind::Inv5OverCapacity)
        .expect("INV-5");
    assert_eq!(inv5.ops.len(), 5);
    assert_eq!(inv5.key.as_deref(), Some("capacity"));
    let project = r
        .anomalies
        .iter()
        .find(|a| a.kind == AnomalyKind::NonLinearizable)
        .expect("non-linearizable");
    assert_eq!(
        project.key.as_deref(),
        Some("capacity/*"),
        "{}",
        r.summary()
    );
}

/// Four leases of a project of four slots are live; `capacity_full` refusals are checked
/// against them by the project-wide model.
fn four_live_then_refused(held: u64, live: u64) -> History {
    let mut b = Builder::new();
    for p in 1..=live {
        b.acquire(p as f64, 10.0 + p as f64, p, &format!("capacity/{p}"), 0, 1);
    }
    b.invoke(20.0, 9, "acquire", "capacity/8", json!({"expected": 0}));
    b.fail(
        21.0,
        9,
        "acquire",
        "capacity/8",
        json!({"error": "capacity_full", "held": held, "max": 4}),
    );
    for p in 1..=live {
        b.final_lease(30.0, 10 + p, &format!("capacity/{p}"), 1, true);
    }
    b.final_lease(30.0, 20, "capacity/8", 0, false);
    b.build()
}

#[test]
fn a_capacity_refusal_that_miscounts_the_live_leases_fails() {
    // Only two leases are live, yet the project is reported full; then four are live but the
    // refusal reports three.
    for (held, live) in [(4, 2), (3, 4), (2, 2)] {
        let r = check(&four_live_then_refused(held, live));
        assert_eq!(r.valid, Validity::Invalid, "held {held} live {live}");
        let a = &r.anomalies[0];
        assert_eq!(
            (a.kind, a.key.as_deref()),
            (AnomalyKind::NonLinearizable, Some("capacity/*")),
            "{}",
            r.summary()
        );
    }
    let r = check(&four_live_then_refused(4, 4));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary());
}

#[test]
fn five_holders_in_sequence_or_with_unsure_overlap_pass() {
    // The fifth acquisition is acknowledged only after the first release was invoked: the
    // release may have freed the slot before the grant, so this is not a violation.
    let mut b = Builder::new();
    for p in 1..=4u64 {
        b.acquire(p as f64, 10.0, p, &format!("capacity/{p}"), 0, 1);
    }
    b.invoke(
        11.0,
        1,
        "release",
        "capacity/1",
        json!({"generation": 1, "lease": 100}),
    );
    b.info(12.0, 1, "release", "capacity/1");
    b.acquire(11.5, 13.0, 5, "capacity/5", 0, 1);
    b.final_lease(14.0, 6, "capacity/1", 1, false);
    for p in 2..=5u64 {
        b.final_lease(14.0, 6 + p, &format!("capacity/{p}"), 1, true);
    }
    let r = check(&b.build());
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary());
}

#[test]
fn forked_chain_fails() {
    // Two different capsules acknowledged at sequence 1, each extending the empty chain.
    let h = Builder::new()
        .invoke(
            0.0,
            1,
            "append",
            "capsule/4",
            json!({"sequence": 1, "previous": null, "digest": "aa"}),
        )
        .invoke(
            0.1,
            2,
            "append",
            "capsule/4",
            json!({"sequence": 1, "previous": null, "digest": "bb"}),
        )
        .ok(
            1.0,
            1,
            "append",
            "capsule/4",
            json!({"sequence": 1, "digest": "aa"}),
        )
        .ok(
            1.1,
            2,
            "append",
            "capsule/4",
            json!({"sequence": 1, "digest": "bb"}),
        )
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Invalid);
    assert!(
        kinds(&r).contains(&AnomalyKind::Inv7Fork),
        "{}",
        r.summary()
    );
    assert!(
        kinds(&r).contains(&AnomalyKind::NonLinearizable),
        "{}",
        r.summary()
    );
}

#[test]
fn final_chain_that_does_not_link_or_lost_a_capsule_fails() {
    let h = Builder::new()
        .invoke(
            0.0,
            1,
            "append",
            "capsule/4",
            json!({"sequence": 1, "previous": null, "digest": "aa"}),
        )
        .ok(
            1.0,
            1,
            "append",
            "capsule/4",
            json!({"sequence": 1, "digest": "aa"}),
        )
        .invoke(2.0, 2, "chain", "capsule/4", Value::Null)
        .ok(
            3.0,
            2,
            "chain",
            "capsule/4",
            json!({"capsules": [
            {"sequence": 1, "previous": null, "digest": "cc"},
            {"sequence": 2, "previous": "dd", "digest": "ee"}]}),
        )
        .build();
    let r = check(&h);
    let k = kinds(&r);
    assert!(k.contains(&AnomalyKind::Inv7Fork), "{}", r.summary());
    assert!(k.contains(&AnomalyKind::LostWrite), "{}", r.summary());
}

#[test]
fn release_that_succeeds_twice_fails() {
    let h = Builder::new()
        .acquire(0.0, 1.0, 1, "lease/1", 0, 1)
        .release(2.0, 3.0, 1, "lease/1", 1)
        .release(4.0, 5.0, 2, "lease/1", 1)
        .build();
    assert_eq!(kinds(&check(&h)), vec![AnomalyKind::NonLinearizable]);
}

#[test]
fn diverged_replicas_fail() {
    let h = Builder::new().acquire(0.0, 1.0, 1, "lease/1", 0, 1).build();
    let nodes = [
        NodeFinal {
            id: 1,
            applied: Some(9),
            digest: Some("aa".into()),
            snapshot: None,
            purged: None,
            error: None,
        },
        NodeFinal {
            id: 2,
            applied: Some(9),
            digest: Some("bb".into()),
            snapshot: None,
            purged: None,
            error: None,
        },
        NodeFinal {
            id: 3,
            applied: Some(8),
            digest: Some("cc".into()),
            snapshot: None,
            purged: None,
            error: None,
        },
    ];
    let r = Checker::default().check(&h, Some(&nodes), Vec::new());
    let k = kinds(&r);
    assert!(
        k.contains(&AnomalyKind::DigestDivergence),
        "{}",
        r.summary()
    );
    assert!(
        k.contains(&AnomalyKind::ReplicasNotConverged),
        "{}",
        r.summary()
    );
}

#[test]
fn malformed_history_is_reported_not_accepted() {
    let h = Builder::new()
        .ok(0.0, 1, "acquire", "lease/1", json!({"generation": 1}))
        .build();
    let r = check(&h);
    assert_eq!(kinds(&r), vec![AnomalyKind::MalformedHistory]);
    let h = Builder::new()
        .invoke(0.0, 1, "acquire", "lease/1", json!({}))
        .ok(1.0, 1, "acquire", "lease/1", json!({"generation": 1}))
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Invalid);
    assert!(
        r.anomalies[0].message.contains("expected"),
        "{}",
        r.summary()
    );
}

#[test]
fn writes_failing_long_after_a_heal_fail_the_recovery_bound() {
    use crate::recovery::RecoveryCheck;
    let mut b = Builder::new();
    b.nemesis(0.0, "start", "partition-halves")
        .nemesis(1_000.0, "stop", "heal");
    // Every write after the heal fails for 40 s; the next fault starts at 60 s.
    for i in 0..40u64 {
        let t = 1_000.0 + i as f64 * 1_000.0;
        b.invoke(t, 1, "acquire", "lease/1", json!({"expected": 0}))
            .fail(
                t + 10.0,
                1,
                "acquire",
                "lease/1",
                json!({"error": "unreachable"}),
            );
    }
    b.acquire(45_000.0, 45_010.0, 1, "lease/1", 0, 1);
    // Reads came back a second after the heal: measured beside the writes.
    b.read_lease(2_000.0, 2_010.0, 2, "lease/1", 0, false);
    b.nemesis(60_000.0, "start", "kill-one")
        .nemesis(61_000.0, "stop", "heal");
    let h = b.build();
    let check = RecoveryCheck {
        bound_ms: 30_000.0,
        read_bound_ms: 2_000.0,
    };
    let (heals, anomalies) = check.check(&h.operations().unwrap(), &h.nemesis_intervals());
    assert_eq!(
        heals.len(),
        1,
        "the last heal is the harness probe's to judge"
    );
    assert_eq!(heals[0].first_write_ms, Some(44_010.0));
    assert_eq!(heals[0].first_read_ms, Some(1_010.0));
    assert_eq!(anomalies.len(), 1);
    assert_eq!(anomalies[0].kind, AnomalyKind::UnavailableAfterHeal);
    // Within the bound: no anomaly.
    let (_, none) = RecoveryCheck {
        bound_ms: 50_000.0,
        read_bound_ms: 2_000.0,
    }
    .check(&h.operations().unwrap(), &h.nemesis_intervals());
    assert!(none.is_empty());
}

/// Reads that come back 3 s after a heal break the read bound (2 s) though writes came back at
/// once; a read bound they meet, or a workload that never reads, has nothing to say.
#[test]
fn reads_failing_past_the_read_bound_after_a_heal_are_named() {
    use crate::recovery::RecoveryCheck;
    let mut b = Builder::new();
    b.nemesis(0.0, "start", "partition-leader")
        .nemesis(1_000.0, "stop", "heal");
    b.acquire(1_100.0, 1_150.0, 1, "lease/1", 0, 1);
    for i in 0..3u64 {
        let t = 1_000.0 + i as f64 * 1_000.0;
        b.invoke(t, 2, "read", "lease/1", Value::Null).fail(
            t + 10.0,
            2,
            "read",
            "lease/1",
            json!({"error": "no leader"}),
        );
    }
    b.read_lease(4_000.0, 4_010.0, 2, "lease/1", 1, true);
    b.nemesis(10_000.0, "start", "kill-one")
        .nemesis(11_000.0, "stop", "heal");
    let h = b.build();
    let ops = h.operations().unwrap();
    let check = |read_bound_ms| {
        RecoveryCheck {
            bound_ms: 30_000.0,
            read_bound_ms,
        }
        .check(&ops, &h.nemesis_intervals())
    };
    let (heals, anomalies) = check(2_000.0);
    assert_eq!(heals[0].first_read_ms, Some(3_010.0));
    assert_eq!(anomalies.len(), 1, "{anomalies:?}");
    assert_eq!(anomalies[0].kind, AnomalyKind::UnavailableAfterHeal);
    assert!(
        anomalies[0]
            .message
            .contains("first read succeeded after 3010 ms"),
        "{:?}",
        anomalies[0]
    );
    assert!(check(5_000.0).1.is_empty());
    // A workload whose every read failed is judged too.
    let failed_reads: Vec<_> = ops
        .iter()
        .filter(|o| o.f != "read" || !o.is_ok())
        .cloned()
        .collect();
    let (heals, late) = RecoveryCheck {
        bound_ms: 30_000.0,
        read_bound_ms: 5_000.0,
    }
    .check(&failed_reads, &h.nemesis_intervals());
    assert_eq!(heals[0].first_read_ms, None);
    assert!(
        late.iter()
            .any(|a| a.message.contains("first read succeeded never")),
        "{late:?}"
    );
    let writes_only: Vec<_> = ops.iter().filter(|o| o.f != "read").cloned().collect();
    let (_, none) = RecoveryCheck {
        bound_ms: 30_000.0,
        read_bound_ms: 2_000.0,
    }
    .check(&writes_only, &h.nemesis_intervals());
    assert!(none.is_empty(), "{none:?}");
}

fn read_phase(b: &mut Builder, t: f64, p: u64, key: &str, generation: u64, phase: &str) {
    b.invoke(t, p, "read", key, Value::Null).ok(
        t + 0.5,
        p,
        "read",
        key,
        json!({"generation": generation, "phase": phase}),
    );
}

#[test]
fn expiring_lease_allows_expiry_but_not_resurrection() {
    // Acquire, then the lease is seen fenced (expired and swept), then reaped: valid.
    let mut b = Builder::new();
    b.acquire(0.0, 1.0, 1, "expiry/1", 0, 1);
    read_phase(&mut b, 2.0, 2, "expiry/1", 1, "live");
    read_phase(&mut b, 5.0, 2, "expiry/1", 1, "fenced");
    b.invoke(
        6.0,
        3,
        "reap",
        "expiry/1",
        json!({"generation": 1, "lease": 100}),
    )
    .ok(7.0, 3, "reap", "expiry/1", json!({"slot_freed": true}));
    read_phase(&mut b, 8.0, 2, "expiry/1", 1, "idle");
    b.invoke(9.0, 4, "read", "expiry/1", json!({"final": true}))
        .ok(
            9.5,
            4,
            "read",
            "expiry/1",
            json!({"generation": 1, "phase": "idle"}),
        );
    let good = b.build();
    assert_eq!(
        check(&good).valid,
        Validity::Valid,
        "{}",
        check(&good).summary()
    );

    // A fenced lease coming back to life is not expiry.
    let mut b = Builder::new();
    b.acquire(0.0, 1.0, 1, "expiry/1", 0, 1);
    read_phase(&mut b, 5.0, 2, "expiry/1", 1, "fenced");
    read_phase(&mut b, 6.0, 2, "expiry/1", 1, "live");
    assert_eq!(
        kinds(&check(&b.build())),
        vec![AnomalyKind::NonLinearizable]
    );

    // A renewal acknowledged after the lease was reaped.
    let mut b = Builder::new();
    b.acquire(0.0, 1.0, 1, "expiry/1", 0, 1);
    b.invoke(
        6.0,
        3,
        "reap",
        "expiry/1",
        json!({"generation": 1, "lease": 100}),
    )
    .ok(7.0, 3, "reap", "expiry/1", json!({"slot_freed": true}));
    b.invoke(
        8.0,
        1,
        "renew",
        "expiry/1",
        json!({"generation": 1, "lease": 100}),
    )
    .ok(9.0, 1, "renew", "expiry/1", json!({"expires_at_ms": 1}));
    assert_eq!(
        kinds(&check(&b.build())),
        vec![AnomalyKind::NonLinearizable]
    );

    // A fenced lease still holds its slot: five acquisitions, none released or reaped, over
    // capacity even though all have expired.
    let mut b = Builder::new();
    for p in 1..=5u64 {
        b.acquire(p as f64, 10.0, p, &format!("expiry/{p}"), 0, 1);
        read_phase(
            &mut b,
            20.0 + p as f64,
            9,
            &format!("expiry/{p}"),
            1,
            "fenced",
        );
    }
    assert!(kinds(&check(&b.build())).contains(&AnomalyKind::Inv5OverCapacity));
}

#[test]
fn a_replicated_clock_that_jumped_with_a_skewed_leader_fails() {
    // 2.5 s after a +1 day skew of the leader its stamps are a day ahead; at the heal too.
    let h = Builder::new()
        .acquire(0.0, 1.0, 1, "lease/1", 0, 1)
        .nemesis_with(
            10_000.0,
            "start",
            "clock-skew-leader",
            json!({"nodes": [1], "offset": "+86400s", "replicated_clock_ahead_ms": 86_399_000}),
        )
        .nemesis_with(
            16_000.0,
            "stop",
            "heal",
            json!({"clock_ahead_ms": 86_398_000, "clock_reset": [1]}),
        )
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Invalid);
    let jumps = kinds(&r)
        .into_iter()
        .filter(|k| *k == AnomalyKind::ClockJump)
        .count();
    assert_eq!(jumps, 2, "{}", r.summary());
}

#[test]
fn a_replicated_clock_just_past_the_slew_fails() {
    // 20 s in, the bound is 10% of 20 s plus 2 s of slack: 4 s.
    let h = Builder::new()
        .acquire(0.0, 1.0, 1, "lease/1", 0, 1)
        .nemesis_with(
            20_000.0,
            "start",
            "clock-skew",
            json!({"nodes": [2], "offset": "+120s", "replicated_clock_ahead_ms": 4_001}),
        )
        .build();
    assert!(kinds(&check(&h)).contains(&AnomalyKind::ClockJump));
}

#[test]
fn a_keyed_write_that_answers_otherwise_when_sent_again_fails_inv11() {
    // Applied once (version 1); the replay of the same key was applied again and refused.
    let again = json!({"error": "version_conflict", "current": 1});
    let h = Builder::new()
        .keyed_cas(0.0, 1, "keyed/1", "sq-k1", 1, 2)
        .replay(3.0, 1, "keyed/1", "sq-k1", json!({"version": 1}), again)
        .invoke(
            5.0,
            2,
            "cas",
            "keyed/1",
            json!({"expected": 1, "value": 8, "idempotency_key": "sq-k2"}),
        )
        .fail(
            6.0,
            2,
            "cas",
            "keyed/1",
            json!({"error": "idempotency_key_reused"}),
        )
        .invoke(7.0, 2, "read", "keyed/1", json!({"final": true}))
        .ok(8.0, 2, "read", "keyed/1", json!({"version": 1, "value": 7}))
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Invalid);
    let inv11 = kinds(&r)
        .into_iter()
        .filter(|k| *k == AnomalyKind::Inv11ReplayDiffers)
        .count();
    assert_eq!(inv11, 2, "{}", r.summary());
}

/// A task whose report STAGING → PROVISIONING was recorded.
fn provisioned() -> Builder {
    let mut b = Builder::new();
    let done = json!({"state": "PROVISIONING"});
    b.transition(0.0, 1, "STAGING", "PROVISIONING", done);
    b
}

#[test]
fn a_task_moved_from_a_state_it_was_not_in_or_against_the_lifecycle_fails() {
    // Recorded from STAGING twice: the second report named a state the task had left.
    let mut b = provisioned();
    b.transition(2.0, 2, "STAGING", "FAILED", json!({"state": "FAILED"}));
    let r = check(&b.build());
    assert_eq!(r.valid, Validity::Invalid, "{}", r.summary());
    assert_eq!(kinds(&r), vec![AnomalyKind::NonLinearizable]);

    // Recorded a step the lifecycle does not have (STAGING straight to RUNNING).
    let mut b = Builder::new();
    b.transition(0.0, 1, "STAGING", "RUNNING", json!({"state": "RUNNING"}));
    assert_eq!(check(&b.build()).valid, Validity::Invalid);

    // A read that goes back to PENDING after the task was assigned.
    let mut b = provisioned();
    b.invoke(2.0, 2, "read", "tasks/1", Value::Null).ok(
        2.5,
        2,
        "read",
        "tasks/1",
        json!({"state": "PENDING"}),
    );
    assert_eq!(check(&b.build()).valid, Validity::Invalid);

    // A refusal for want of an owner after a report was recorded.
    let mut b = provisioned();
    b.transition(
        2.0,
        2,
        "PROVISIONING",
        "READY",
        json!({"error": "not_task_owner"}),
    );
    assert_eq!(check(&b.build()).valid, Validity::Invalid);
}

/// After every node was crashed and started again, the first read may take the cluster's cold
/// start more than the read bound (`COLD_CLUSTER_START_MS`): 3 s is within it, 6 s is not; the
/// same 3 s after a partition is late.
#[test]
fn a_cold_start_of_every_node_gets_its_start_added_to_the_read_bound() {
    use crate::recovery::RecoveryCheck;
    let history = |fault: &str, read_at: f64| {
        let mut b = Builder::new();
        b.nemesis(0.0, "start", fault)
            .nemesis(1_000.0, "stop", "heal");
        b.acquire(1_100.0, 1_150.0, 1, "lease/1", 0, 1);
        b.invoke(1_000.0, 2, "read", "lease/1", Value::Null).fail(
            1_010.0,
            2,
            "read",
            "lease/1",
            json!({"error": "no leader"}),
        );
        b.read_lease(read_at, read_at + 10.0, 2, "lease/1", 1, true);
        b.nemesis(20_000.0, "start", "kill-one")
            .nemesis(21_000.0, "stop", "heal");
        b.build()
    };
    let late = |fault: &str, read_at: f64| {
        let h = history(fault, read_at);
        RecoveryCheck {
            bound_ms: 30_000.0,
            read_bound_ms: 2_000.0,
        }
        .check(&h.operations().unwrap(), &h.nemesis_intervals())
        .1
    };
    assert_eq!(
        crate::recovery::read_bound_after("crash-all", std::time::Duration::from_secs(2)),
        std::time::Duration::from_secs(5),
        "the runner's quiet gap after it is as long, so it is judged"
    );
    assert_eq!(
        crate::recovery::read_bound_after("partition-one", std::time::Duration::from_secs(2)),
        std::time::Duration::from_secs(2)
    );
    assert!(late("crash-all", 4_000.0).is_empty());
    let named = late("crash-all", 7_000.0);
    assert_eq!(named.len(), 1, "{named:?}");
    assert!(
        named[0].message.contains("the bound is 5000 ms"),
        "{named:?}"
    );
    assert_eq!(late("partition-leader", 4_000.0).len(), 1);
}

/// INV-6: a replaced generation's commit, or a paused generation's late commit through the
/// worker's broker, that succeeded — or met a refusal that only comes after the fence check —
/// is a dual writer, whatever the generations say; refused by the fence it is fine.
#[test]
fn an_accepted_stale_or_late_commit_is_a_dual_writer() {
    let k = "takeover/1";
    let ok = |f: &str| (f.to_string(), EventKind::Ok, json!({"sequence": 4}));
    let past = |f: &str, e: &str| (f.to_string(), EventKind::Fail, json!({"error": e}));
    let cases = [
        ok("stale-commit"),
        ok("late-commit"),
        ok("late-git-commit"),
        past("stale-commit", "chain_broken"),
        past("late-commit", "chain_broken"),
        past("late-git-commit", "head_moved"),
        past("late-git-commit", "nothing_to_commit"),
    ];
    for (f, kind, out) in cases {
        let mut b = Builder::new();
        b.launch_then_take_over(k)
            .invoke(4.0, 1, &f, k, json!({"generation": 1, "lease": 3}));
        match kind {
            EventKind::Ok => b.ok(5.0, 1, &f, k, out.clone()),
            EventKind::Fail => b.fail(5.0, 1, &f, k, out.clone()),
        };
        let h = b
            .invoke(6.0, 2, "read", k, json!({"final": true}))
            .ok(7.0, 2, "read", k, json!({"generation": 2, "live": true}))
            .build();
        let r = check(&h);
        assert_eq!(r.valid, Validity::Invalid, "{f} {out}: {}", r.summary());
        assert_eq!(kinds(&r), vec![AnomalyKind::Inv6DualWriter], "{f} {out}");
    }
    for (f, e) in [
        ("stale-commit", "fenced"),
        ("late-git-commit", "stale_generation"),
    ] {
        let h = Builder::new()
            .launch_then_take_over(k)
            .invoke(4.0, 1, f, k, json!({"generation": 1, "lease": 3}))
            .fail(5.0, 1, f, k, json!({"error": e}))
            .invoke(6.0, 2, "read", k, json!({"final": true}))
            .ok(7.0, 2, "read", k, json!({"generation": 2, "live": true}))
            .build();
        let r = check(&h);
        assert_eq!(r.valid, Validity::Valid, "{f} {e}: {}", r.summary());
    }
}

/// How a hand-built commit ended.
enum EventKind {
    Ok,
    Fail,
}

/// INV-3 through a worker: a takeover granted two generations above the last, and a read
/// that missed an acknowledged grant, each break the takeover register.
#[test]
fn a_skipped_or_lost_takeover_generation_fails() {
    let k = "takeover/2";
    let skipped = Builder::new()
        .invoke(0.0, 1, "launch", k, Value::Null)
        .ok(1.0, 1, "launch", k, json!({"generation": 1, "lease": 3}))
        .invoke(2.0, 1, "takeover", k, json!({"kind": "crash"}))
        .ok(
            3.0,
            1,
            "takeover",
            k,
            json!({"generation": 3, "replaced": 1}),
        )
        .invoke(6.0, 2, "read", k, json!({"final": true}))
        .ok(7.0, 2, "read", k, json!({"generation": 3, "live": true}))
        .build();
    let lost = Builder::new()
        .invoke(0.0, 1, "launch", k, Value::Null)
        .ok(1.0, 1, "launch", k, json!({"generation": 1, "lease": 3}))
        .invoke(6.0, 2, "read", k, json!({"final": true}))
        .ok(7.0, 2, "read", k, json!({"generation": 0, "live": false}))
        .build();
    for (name, h) in [("skipped", skipped), ("lost", lost)] {
        let r = check(&h);
        assert_eq!(r.valid, Validity::Invalid, "{name}: {}", r.summary());
        assert!(
            kinds(&r).contains(&AnomalyKind::NonLinearizable),
            "{name}: {}",
            r.summary()
        );
    }
}

/// A takeover history whose profile has no final read is unknown, not valid.
#[test]
fn a_takeover_key_without_a_final_read_is_unknown() {
    let k = "takeover/3";
    let h = Builder::new()
        .invoke(0.0, 1, "launch", k, Value::Null)
        .ok(1.0, 1, "launch", k, json!({"generation": 1, "lease": 3}))
        .build();
    let r = check(&h);
    assert_eq!(r.valid, Validity::Unknown, "{}", r.summary());
}
