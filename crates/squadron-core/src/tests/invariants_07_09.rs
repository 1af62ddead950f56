//! INV-7 capsule chain, INV-8 graceful takeover, INV-9 crash takeover.

use super::*;
use crate::capsule::CapsuleDigestInput;
use crate::lease::LeaseState;

fn commit(fx: &mut Fx, g: &LeaseGrant, d: CapsuleDraft) -> (u64, Digest) {
    match fx.ok(Command::CommitCapsule(CommitCapsule {
        fence: token(g),
        capsule: d,
    })) {
        Outcome::CapsuleCommitted { sequence, digest } => (sequence, digest),
        o => panic!("{o:?}"),
    }
}

#[test]
fn inv_07_chain_links_sequence_and_previous_digest() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    let (s1, d1) = commit(&mut fx, &g, draft(1, None, "one"));
    let (s2, d2) = commit(&mut fx, &g, draft(2, Some(d1), "two"));
    assert_eq!((s1, s2), (1, 2));
    let stored = &fx.state.profile(p).unwrap().capsules;
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[1].previous, Some(d1));
    assert_eq!(stored[1].digest, d2);
    // The digest is SHA-256 of the canonical encoding of exactly what was stored.
    let recomputed = CapsuleDigestInput {
        schema_version: 1,
        profile: p,
        generation: g.generation,
        sequence: 2,
        previous: Some(&d1),
        payload: &payload("two"),
    }
    .digest();
    assert_eq!(recomputed, d2);
}

#[test]
fn inv_07_broken_chain_is_refused() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    let r = fx.rejected(Command::CommitCapsule(CommitCapsule {
        fence: token(&g),
        capsule: draft(2, None, "skips one"),
    }));
    assert_eq!(
        r,
        Rejection::ChainBroken {
            expected_sequence: 1,
            expected_previous: None
        }
    );
    let (_, d1) = commit(&mut fx, &g, draft(1, None, "one"));
    // Right sequence, forged previous digest: a fork.
    let r = fx.rejected(Command::CommitCapsule(CommitCapsule {
        fence: token(&g),
        capsule: draft(2, Some(Digest::from_bytes([7; 32])), "fork"),
    }));
    assert!(
        matches!(r, Rejection::ChainBroken { expected_sequence: 2, expected_previous: Some(d) } if d == d1)
    );
    // Replaying sequence 1 is a fork too.
    let r = fx.rejected(Command::CommitCapsule(CommitCapsule {
        fence: token(&g),
        capsule: draft(1, None, "one again"),
    }));
    assert!(matches!(r, Rejection::ChainBroken { .. }));
}

#[test]
fn inv_07_commit_and_verify_refuses_a_wrong_expected_digest() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    let mut d = draft(1, None, "one");
    d.expected_digest = Some(Digest::from_bytes([1; 32]));
    let r = fx.rejected(Command::CommitCapsule(CommitCapsule {
        fence: token(&g),
        capsule: d.clone(),
    }));
    let Rejection::DigestMismatch { computed } = r else {
        panic!("{r:?}")
    };
    d.expected_digest = Some(computed);
    assert_eq!(commit(&mut fx, &g, d).1, computed);
}

#[test]
fn inv_07_unsupported_schema_version_is_refused() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    let mut d = draft(1, None, "one");
    d.schema_version = 9;
    let r = fx.rejected(Command::CommitCapsule(CommitCapsule {
        fence: token(&g),
        capsule: d,
    }));
    assert!(matches!(r, Rejection::Invalid(ref e) if e.field == "capsule.schema_version"));
}

#[test]
fn inv_08_graceful_takeover_commits_fences_then_grants_in_one_command() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g1 = fx.acquire(p);
    let (_, d1) = commit(&mut fx, &g1, draft(1, None, "codex state"));
    let out = fx.ok(Command::GracefulTakeover(GracefulTakeover {
        fence: token(&g1),
        capsule: draft(2, Some(d1), "handoff to claude"),
        next: next(Provider::Claude),
        old_reap_evidence: None,
    }));
    let Outcome::TookOver {
        capsule: Some((2, d2)),
        fenced,
        old_reaped: false,
        grant,
    } = out
    else {
        panic!("{out:?}")
    };
    assert_eq!(fenced, g1.lease);
    assert_eq!(grant.generation, Generation::new(2));
    let profile = fx.state.profile(p).unwrap();
    assert_eq!(profile.capsule_head.unwrap().digest, d2);
    assert_eq!(profile.live_lease, Some(grant.lease));
    assert_eq!(
        fx.state.lease(grant.lease).unwrap().provider,
        Provider::Claude
    );
    // The old lease lost its authority but keeps its slot until its process is proved gone.
    assert!(matches!(
        fx.state.lease(g1.lease).unwrap().state,
        LeaseState::Fenced { .. }
    ));
    assert_eq!(fx.slots_held(), 2);
    let r = fx.rejected(Command::RenewLease(RenewLease {
        fence: token(&g1),
        ttl_ms: TTL,
    }));
    assert!(matches!(r, Rejection::Fenced { .. }));
    fx.ok(Command::RecordReapEvidence(RecordReapEvidence {
        profile: p,
        evidence: evidence(&g1, fx.now),
    }));
    assert_eq!(fx.slots_held(), 1);
    // The identity carries on: the new generation extends the same chain.
    commit(&mut fx, &grant, draft(3, Some(d2), "claude continues"));
    let stats = &fx.state.project(&tenant(), &project()).unwrap().stats;
    assert_eq!(stats.takeovers_graceful, 1);
}

#[test]
fn inv_08_takeover_with_evidence_passes_the_slot_at_full_capacity() {
    let mut fx = Fx::new();
    let profiles: Vec<_> = (0..4).map(|i| fx.profile(&format!("a{i}"))).collect();
    let grants: Vec<_> = profiles.iter().map(|p| fx.acquire(*p)).collect();
    // Without evidence the old process may still run: a fifth slot would be needed.
    let r = fx.rejected(Command::GracefulTakeover(GracefulTakeover {
        fence: token(&grants[0]),
        capsule: draft(1, None, "handoff"),
        next: next(Provider::Claude),
        old_reap_evidence: None,
    }));
    assert_eq!(r, Rejection::CapacityFull { held: 4, max: 4 });
    assert!(fx
        .state
        .profile(profiles[0])
        .unwrap()
        .capsule_head
        .is_none());
    let out = fx.ok(Command::GracefulTakeover(GracefulTakeover {
        fence: token(&grants[0]),
        capsule: draft(1, None, "handoff"),
        next: next(Provider::Claude),
        old_reap_evidence: Some(evidence(&grants[0], fx.now)),
    }));
    assert!(matches!(
        out,
        Outcome::TookOver {
            old_reaped: true,
            ..
        }
    ));
    assert_eq!(fx.slots_held(), 4);
}

#[test]
fn inv_08_takeover_with_broken_capsule_changes_nothing() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    let r = fx.rejected(Command::GracefulTakeover(GracefulTakeover {
        fence: token(&g),
        capsule: draft(5, None, "bad"),
        next: next(Provider::Claude),
        old_reap_evidence: None,
    }));
    assert!(matches!(r, Rejection::ChainBroken { .. }));
    let r = fx.rejected(Command::GracefulTakeover(GracefulTakeover {
        fence: token(&g),
        capsule: draft(1, None, "ok"),
        next: next(Provider::Script),
        old_reap_evidence: None,
    }));
    assert!(matches!(r, Rejection::ProviderNotAllowed { .. }));
}

#[test]
fn inv_09_crash_takeover_waits_for_expiry() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    let r = fx.rejected(Command::CrashTakeover(CrashTakeover {
        profile: p,
        lease: g.lease,
        generation: g.generation,
        next: next(Provider::Claude),
        reap_evidence: Some(evidence(&g, fx.now)),
    }));
    assert_eq!(
        r,
        Rejection::LeaseNotExpired {
            expires_at_ms: g.expires_at_ms
        }
    );
}

#[test]
fn inv_09_no_evidence_no_takeover() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    fx.advance(TTL);
    let cmd = |ev: Option<ReapEvidence>| {
        Command::CrashTakeover(CrashTakeover {
            profile: p,
            lease: g.lease,
            generation: g.generation,
            next: next(Provider::Claude),
            reap_evidence: ev,
        })
    };
    let r = fx.rejected(cmd(None));
    assert!(
        matches!(r, Rejection::TakeoverBlocked { ref reason } if reason.contains("populated 0"))
    );
    let mut populated = evidence(&g, fx.now);
    populated.populated = true;
    assert!(matches!(
        fx.rejected(cmd(Some(populated))),
        Rejection::EvidenceRefused { .. }
    ));
    let mut other_gen = evidence(&g, fx.now);
    other_gen.generation = Generation::new(9);
    assert!(matches!(
        fx.rejected(cmd(Some(other_gen))),
        Rejection::EvidenceRefused { .. }
    ));
    let mut other_cgroup = evidence(&g, fx.now);
    other_cgroup.cgroup = "squadron/acme/web/other".into();
    assert!(matches!(
        fx.rejected(cmd(Some(other_cgroup))),
        Rejection::EvidenceRefused { .. }
    ));
    let mut early = evidence(&g, fx.now);
    early.observed_at_ms = g.expires_at_ms - TTL - 1;
    assert!(matches!(
        fx.rejected(cmd(Some(early))),
        Rejection::EvidenceRefused { .. }
    ));
    let mut forged = evidence(&g, fx.now);
    forged.source = EvidenceSource::OperatorDecommission {
        operator: "mallory".into(),
        reason: "trust me".into(),
    };
    assert!(matches!(
        fx.rejected(cmd(Some(forged))),
        Rejection::EvidenceRefused { .. }
    ));

    let out = fx.ok(cmd(Some(evidence(&g, fx.now))));
    let Outcome::TookOver { grant, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!(grant.generation, Generation::new(2));
    assert!(matches!(
        fx.state.lease(g.lease).unwrap().state,
        LeaseState::Reaped { .. }
    ));
    assert_eq!(fx.slots_held(), 1);
    assert_eq!(
        fx.state
            .project(&tenant(), &project())
            .unwrap()
            .stats
            .takeovers_crash,
        1
    );
}

#[test]
fn inv_09_evidence_recorded_first_then_takeover() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    fx.advance(TTL);
    fx.ok(Command::Sweep);
    // Evidence alone ends the fenced lease and frees its slot.
    fx.ok(Command::RecordReapEvidence(RecordReapEvidence {
        profile: p,
        evidence: evidence(&g, fx.now),
    }));
    assert_eq!(fx.slots_held(), 0);
    let out = fx.ok(Command::CrashTakeover(CrashTakeover {
        profile: p,
        lease: g.lease,
        generation: g.generation,
        next: next(Provider::Claude),
        reap_evidence: None,
    }));
    assert!(
        matches!(out, Outcome::TookOver { grant, .. } if grant.generation == Generation::new(2))
    );
}

#[test]
fn inv_09_evidence_for_an_active_unexpired_lease_is_refused() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    let r = fx.rejected(Command::RecordReapEvidence(RecordReapEvidence {
        profile: p,
        evidence: evidence(&g, fx.now),
    }));
    assert!(matches!(r, Rejection::EvidenceRefused { .. }));
}

#[test]
fn inv_09_decommission_is_the_audited_way_past_missing_evidence() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    fx.advance(TTL);
    let out = fx.ok(Command::DecommissionWorker(DecommissionWorker {
        worker: worker(),
        operator: "alice".into(),
        reason: "host lost its disk".into(),
    }));
    assert!(
        matches!(out, Outcome::WorkerDecommissioned { ref leases_reaped, .. } if leases_reaped == &vec![g.lease])
    );
    let LeaseState::Reaped { evidence, .. } = &fx.state.lease(g.lease).unwrap().state else {
        panic!()
    };
    assert!(
        matches!(&evidence.source, EvidenceSource::OperatorDecommission { operator, .. } if operator == "alice")
    );
    // The sandbox went with the worker; a new one may be attached elsewhere.
    assert!(fx
        .state
        .project(&tenant(), &project())
        .unwrap()
        .sandbox
        .is_none());
    let w2 = WorkerId::new("w2").unwrap();
    fx.register_worker(w2.clone());
    fx.ok(Command::AttachSandbox(AttachSandbox {
        tenant: tenant(),
        project: project(),
        worker: w2.clone(),
        runtime: RuntimeKind::Process,
        sandbox_ref: "sandbox-2".into(),
    }));
    let out = fx.ok(Command::CrashTakeover(CrashTakeover {
        profile: p,
        lease: g.lease,
        generation: g.generation,
        next: NextHolder {
            provider: Provider::Claude,
            holder: holder_on(w2),
            ttl_ms: TTL,
        },
        reap_evidence: None,
    }));
    assert!(matches!(out, Outcome::TookOver { .. }));
}
