//! INV-1 … INV-6: one sandbox, profile identity, generations, single writer, capacity, fencing.

use super::*;
use crate::lease::{FenceReason, LeaseState};
use crate::limits::PROFILES_PER_PROJECT_DEFAULT;

#[test]
fn inv_01_second_sandbox_is_refused_not_created() {
    let mut fx = Fx::new();
    let r = fx.rejected(Command::AttachSandbox(AttachSandbox {
        tenant: tenant(),
        project: project(),
        worker: worker(),
        runtime: RuntimeKind::Docker,
        sandbox_ref: "sandbox-2".into(),
    }));
    assert!(
        matches!(r, Rejection::SandboxExists { ref sandbox_ref, .. } if sandbox_ref == "sandbox-1")
    );
}

#[test]
fn inv_01_launch_without_sandbox_is_denied_with_no_fallback() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    fx.ok(Command::DetachSandbox(DetachSandbox {
        tenant: tenant(),
        project: project(),
        sandbox_ref: "sandbox-1".into(),
    }));
    assert_eq!(fx.rejected(fx.acquire_cmd(p, 0)), Rejection::NoSandbox);
}

#[test]
fn inv_01_launch_must_run_in_the_sandbox_worker() {
    let mut fx = Fx::new();
    let w2 = WorkerId::new("w2").unwrap();
    fx.register_worker(w2.clone());
    let p = fx.profile("a");
    let r = fx.rejected(Command::AcquireLease(AcquireLease {
        profile: p,
        expected_generation: Generation::ZERO,
        provider: Provider::Codex,
        holder: holder_on(w2),
        ttl_ms: TTL,
    }));
    assert!(matches!(r, Rejection::SandboxMismatch { .. }), "{r:?}");
}

#[test]
fn inv_01_sandbox_stays_while_leases_hold_slots() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    fx.acquire(p);
    let r = fx.rejected(Command::DetachSandbox(DetachSandbox {
        tenant: tenant(),
        project: project(),
        sandbox_ref: "sandbox-1".into(),
    }));
    assert_eq!(r, Rejection::SandboxBusy { slots_held: 1 });
}

#[test]
fn inv_02_profile_is_unique_by_tenant_project_key() {
    let mut fx = Fx::new();
    fx.profile("reviewer");
    let r = fx.rejected(Command::CreateProfile(CreateProfile {
        tenant: tenant(),
        project: project(),
        key: ProfileKey::new("reviewer").unwrap(),
        providers: vec![Provider::Claude],
        context_ref: None,
    }));
    assert!(matches!(r, Rejection::AlreadyExists { .. }));
    // The same key in another project is another identity.
    let other = ProjectId::new("api").unwrap();
    fx.ok(Command::CreateProject(CreateProject {
        tenant: tenant(),
        project: other.clone(),
        max_profiles: None,
        max_active: None,
    }));
    fx.ok(Command::CreateProfile(CreateProfile {
        tenant: tenant(),
        project: other,
        key: ProfileKey::new("reviewer").unwrap(),
        providers: vec![Provider::Claude],
        context_ref: None,
    }));
}

#[test]
fn inv_02_project_holds_at_most_max_profiles_default_eight() {
    let mut fx = Fx::new();
    for i in 0..PROFILES_PER_PROJECT_DEFAULT {
        fx.profile(&format!("agent-{i}"));
    }
    let r = fx.rejected(Command::CreateProfile(CreateProfile {
        tenant: tenant(),
        project: project(),
        key: ProfileKey::new("agent-9").unwrap(),
        providers: vec![Provider::Codex],
        context_ref: None,
    }));
    assert_eq!(r, Rejection::ProfileLimitReached { count: 8, max: 8 });
}

#[test]
fn inv_03_generation_rises_by_exactly_one_per_acquisition() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    for expected in 1..=5 {
        let g = fx.acquire(p);
        assert_eq!(g.generation, Generation::new(expected));
        assert_eq!(fx.state.profile(p).unwrap().generation, g.generation);
        fx.ok(Command::ReleaseLease(ReleaseLease { fence: token(&g) }));
    }
}

#[test]
fn inv_03_acquire_is_compare_and_swap_on_expected_generation() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    fx.ok(Command::ReleaseLease(ReleaseLease { fence: token(&g) }));
    let r = fx.rejected(fx.acquire_cmd(p, 0));
    assert_eq!(
        r,
        Rejection::StaleGeneration {
            expected: Generation::ZERO,
            current: Generation::new(1)
        }
    );
    let r = fx.rejected(fx.acquire_cmd(p, 7));
    assert!(matches!(r, Rejection::StaleGeneration { .. }));
}

#[test]
fn inv_04_one_writer_second_acquire_is_refused() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    let r = fx.rejected(fx.acquire_cmd(p, 1));
    assert!(matches!(r, Rejection::ProfileBusy { lease, .. } if lease == g.lease));
}

#[test]
fn inv_04_fenced_but_unreaped_generation_blocks_plain_acquire() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    fx.advance(TTL);
    fx.ok(Command::Sweep);
    assert!(matches!(
        fx.state.lease(g.lease).unwrap().state,
        LeaseState::Fenced {
            reason: FenceReason::Expired,
            ..
        }
    ));
    let r = fx.rejected(fx.acquire_cmd(p, 1));
    assert!(
        matches!(r, Rejection::ProfileBusy { ref state, .. } if state == "fenced"),
        "{r:?}"
    );
}

#[test]
fn inv_05_fifth_lease_is_refused_with_counts() {
    let mut fx = Fx::new();
    let profiles: Vec<_> = (0..5).map(|i| fx.profile(&format!("a{i}"))).collect();
    for p in &profiles[..4] {
        fx.acquire(*p);
    }
    let r = fx.rejected(fx.acquire_cmd(profiles[4], 0));
    assert_eq!(r, Rejection::CapacityFull { held: 4, max: 4 });
}

#[test]
fn inv_05_expired_and_fenced_leases_hold_their_slots_until_evidence() {
    let mut fx = Fx::new();
    let profiles: Vec<_> = (0..5).map(|i| fx.profile(&format!("a{i}"))).collect();
    let grants: Vec<_> = profiles[..4].iter().map(|p| fx.acquire(*p)).collect();
    fx.advance(TTL + 1);
    // Expired, not yet swept: still counted (fail closed).
    assert!(matches!(
        fx.rejected(fx.acquire_cmd(profiles[4], 0)),
        Rejection::CapacityFull { .. }
    ));
    fx.ok(Command::Sweep);
    assert_eq!(fx.slots_held(), 4);
    assert!(matches!(
        fx.rejected(fx.acquire_cmd(profiles[4], 0)),
        Rejection::CapacityFull { .. }
    ));
    fx.ok(Command::RecordReapEvidence(RecordReapEvidence {
        profile: profiles[0],
        evidence: evidence(&grants[0], fx.now),
    }));
    assert_eq!(fx.slots_held(), 3);
    fx.acquire(profiles[4]);
    assert_eq!(fx.slots_held(), 4);
}

#[test]
fn inv_05_release_frees_the_slot() {
    let mut fx = Fx::new();
    let profiles: Vec<_> = (0..5).map(|i| fx.profile(&format!("a{i}"))).collect();
    let grants: Vec<_> = profiles[..4].iter().map(|p| fx.acquire(*p)).collect();
    fx.ok(Command::ReleaseLease(ReleaseLease {
        fence: token(&grants[2]),
    }));
    assert_eq!(fx.slots_held(), 3);
    fx.acquire(profiles[4]);
    assert_eq!(
        fx.state
            .project(&tenant(), &project())
            .unwrap()
            .stats
            .peak_slots_held,
        4
    );
}

#[test]
fn inv_05_max_active_is_per_project_and_configurable() {
    let mut fx = Fx::new();
    let small = ProjectId::new("small").unwrap();
    fx.ok(Command::CreateProject(CreateProject {
        tenant: tenant(),
        project: small.clone(),
        max_profiles: Some(3),
        max_active: Some(1),
    }));
    fx.ok(Command::AttachSandbox(AttachSandbox {
        tenant: tenant(),
        project: small.clone(),
        worker: worker(),
        runtime: RuntimeKind::Process,
        sandbox_ref: "sandbox-small".into(),
    }));
    let ids: Vec<ProfileId> = ["x", "y"]
        .iter()
        .map(|k| {
            match fx.ok(Command::CreateProfile(CreateProfile {
                tenant: tenant(),
                project: small.clone(),
                key: ProfileKey::new(*k).unwrap(),
                providers: vec![Provider::Codex],
                context_ref: None,
            })) {
                Outcome::ProfileCreated { profile } => profile,
                o => panic!("{o:?}"),
            }
        })
        .collect();
    fx.acquire(ids[0]);
    assert_eq!(
        fx.rejected(fx.acquire_cmd(ids[1], 0)),
        Rejection::CapacityFull { held: 1, max: 1 }
    );
    // The other project is unaffected.
    let p = fx.profile("a");
    fx.acquire(p);
}

#[test]
fn inv_06_stale_tokens_are_refused_everywhere() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g1 = fx.acquire(p);
    fx.ok(Command::ReleaseLease(ReleaseLease { fence: token(&g1) }));
    let g2 = fx.acquire(p);
    let stale = token(&g1);
    let wrong_lease = FencingToken {
        lease: g1.lease,
        ..token(&g2)
    };
    for fence in [stale, wrong_lease] {
        for cmd in [
            Command::RenewLease(RenewLease { fence, ttl_ms: TTL }),
            Command::ReleaseLease(ReleaseLease { fence }),
            Command::FenceLease(FenceLease {
                fence,
                reason: FenceReason::Operator,
            }),
            Command::CommitCapsule(CommitCapsule {
                fence,
                capsule: draft(1, None, "x"),
            }),
            Command::AckMessages(AckMessages {
                fence,
                through_seq: 0,
            }),
            Command::PostMessage(PostMessage {
                to: p,
                sender: crate::mailbox::MessageSender::Profile(fence),
                kind: crate::mailbox::MessageKind::Handoff,
                body: "review auth.rs".into(),
            }),
            Command::GracefulTakeover(GracefulTakeover {
                fence,
                capsule: draft(1, None, "x"),
                next: next(Provider::Claude),
                old_reap_evidence: None,
            }),
        ] {
            let name = cmd.name();
            let r = fx.rejected(cmd);
            assert!(matches!(r, Rejection::Fenced { .. }), "{name}: {r:?}");
        }
    }
    // The current token still works.
    fx.ok(Command::RenewLease(RenewLease {
        fence: token(&g2),
        ttl_ms: TTL,
    }));
}

#[test]
fn inv_06_expired_lease_cannot_renew_or_write() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    fx.advance(TTL);
    let r = fx.rejected(Command::RenewLease(RenewLease {
        fence: token(&g),
        ttl_ms: TTL,
    }));
    assert!(matches!(r, Rejection::LeaseExpired { .. }));
    let r = fx.rejected(Command::CommitCapsule(CommitCapsule {
        fence: token(&g),
        capsule: draft(1, None, "late"),
    }));
    assert!(matches!(r, Rejection::LeaseExpired { .. }));
}

#[test]
fn inv_06_renewal_extends_expiry_and_never_shortens_it() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    fx.advance(5_000);
    let Outcome::LeaseRenewed { expires_at_ms } = fx.ok(Command::RenewLease(RenewLease {
        fence: token(&g),
        ttl_ms: TTL,
    })) else {
        panic!()
    };
    assert_eq!(expires_at_ms, fx.now + TTL);
    let Outcome::LeaseRenewed {
        expires_at_ms: after,
    } = fx.ok(Command::RenewLease(RenewLease {
        fence: token(&g),
        ttl_ms: 1_000,
    }))
    else {
        panic!()
    };
    assert_eq!(
        after, expires_at_ms,
        "a shorter renewal must not cut the lease"
    );
}

#[test]
fn inv_06_batched_renewal_renews_only_valid_leases_of_that_worker() {
    let mut fx = Fx::new();
    let a = fx.profile("a");
    let b = fx.profile("b");
    let ga = fx.acquire(a);
    let gb = fx.acquire(b);
    fx.ok(Command::ReleaseLease(ReleaseLease { fence: token(&gb) }));
    fx.advance(1_000);
    let Outcome::LeasesRenewed { results } = fx.ok(Command::RenewLeases(RenewLeases {
        worker: worker(),
        fences: vec![token(&ga), token(&gb)],
        ttl_ms: TTL,
    })) else {
        panic!()
    };
    assert_eq!(results[0].result, Ok(fx.now + TTL));
    assert!(matches!(results[1].result, Err(Rejection::Fenced { .. })));
    // Another worker cannot renew leases it does not hold.
    let w2 = WorkerId::new("w2").unwrap();
    fx.register_worker(w2.clone());
    let Outcome::LeasesRenewed { results } = fx.ok(Command::RenewLeases(RenewLeases {
        worker: w2,
        fences: vec![token(&ga)],
        ttl_ms: TTL,
    })) else {
        panic!()
    };
    assert!(results[0].result.is_err());
}

#[test]
fn time_never_goes_back_and_expiry_uses_command_time() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    fx.advance(TTL + 5);
    fx.ok(Command::Sweep);
    // A command stamped earlier (a skewed leader) does not revive the lease.
    fx.now -= 8_000;
    let r = fx.rejected(Command::RenewLease(RenewLease {
        fence: token(&g),
        ttl_ms: TTL,
    }));
    assert!(matches!(r, Rejection::Fenced { .. }));
    assert_eq!(fx.state.clock_ms(), 1_000 + TTL + 5);
}
