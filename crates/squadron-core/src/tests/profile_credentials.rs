//! INV-13 for agent profiles: an admin names what a profile is given; a generation's lease
//! goes only to the worker holding its active runtime lease, and ends the moment that runtime
//! lease stops being active.

use super::*;
use crate::command::{
    GrantAgentCredentialLease, RegrantAgentCredentialLease, SetProfileCredentials,
};
use crate::credential::{SealedSecret, SEALED_NONCE_BYTES};
use crate::ids::{CredentialId, CredentialLeaseId};
use crate::lease::LeaseState;
use crate::manifest::CredentialRef;
use crate::snapshot::{decode_snapshot, encode_snapshot, SNAPSHOT_MAGIC, SNAPSHOT_VERSION_V6};

fn cid(s: &str) -> CredentialId {
    CredentialId::new(s).unwrap()
}

fn cref(id: &str, mount: &str) -> CredentialRef {
    CredentialRef {
        id: cid(id),
        mount: mount.into(),
    }
}

fn put(fx: &mut Fx, id: &str) {
    fx.ok(Command::PutCredential(PutCredential {
        id: cid(id),
        description: String::new(),
        sealed: SealedSecret {
            key_id: "0123456789abcdef".into(),
            nonce: vec![1; SEALED_NONCE_BYTES],
            ciphertext: vec![7; 40],
        },
    }));
}

fn set(profile: ProfileId, refs: Vec<CredentialRef>) -> Command {
    Command::SetProfileCredentials(SetProfileCredentials {
        profile,
        credential_refs: refs,
    })
}

fn grant_cmd(g: &LeaseGrant) -> Command {
    Command::GrantAgentCredentialLease(GrantAgentCredentialLease {
        fence: token(g),
        worker: worker(),
    })
}

fn as_worker() -> Subject {
    Subject::Worker(worker())
}

/// A profile given cred_a and cred_b, holding an active lease.
fn running_profile(fx: &mut Fx) -> (ProfileId, LeaseGrant) {
    put(fx, "cred_a");
    put(fx, "cred_b");
    let p = fx.profile("coder");
    fx.ok(set(
        p,
        vec![
            cref("cred_a", "anthropic_api_key"),
            cref("cred_b", "openai_api_key"),
        ],
    ));
    let g = fx.acquire(p);
    (p, g)
}

fn granted(fx: &mut Fx, g: &LeaseGrant) -> (CredentialLeaseId, String) {
    match fx.ok_as(&as_worker(), grant_cmd(g)) {
        Outcome::CredentialLeaseGranted {
            lease,
            session,
            credentials,
        } => {
            assert_eq!(credentials.len(), 2);
            (lease, session)
        }
        o => panic!("unexpected {o:?}"),
    }
}

#[test]
fn inv_13_a_generation_s_credentials_go_only_to_its_lease_holder() {
    let mut fx = Fx::new();
    let (p, g) = running_profile(&mut fx);
    let (id, session) = granted(&mut fx, &g);
    assert_eq!(session, format!("profile-{}-g1", p.get()));
    // A lost answer asked again: the same lease.
    assert_eq!(granted(&mut fx, &g).0, id);

    let other = Subject::Worker(WorkerId::new("w-other").unwrap());
    let r = fx.rejected_as(&other, grant_cmd(&g));
    assert!(matches!(r, Rejection::PermissionDenied { .. }), "{r:?}");
    let mut stale = grant_cmd(&g);
    if let Command::GrantAgentCredentialLease(c) = &mut stale {
        c.fence.generation = Generation::new(7);
    }
    let r = fx.rejected_as(&as_worker(), stale);
    assert!(matches!(r, Rejection::Fenced { .. }), "{r:?}");

    let bare = fx.profile("reviewer");
    let g2 = fx.acquire(bare);
    let r = fx.rejected_as(&as_worker(), grant_cmd(&g2));
    assert!(
        matches!(&r, Rejection::Invalid(e) if e.field == "credential_refs"),
        "{r:?}"
    );
    let held = fx.state.profile_credentials().active_for(g.lease).unwrap();
    assert_eq!((held.id, held.generation), (id, Generation::new(1)));
}

#[test]
fn inv_13_releasing_fencing_or_taking_over_ends_the_generation_s_credentials() {
    let mut fx = Fx::new();
    let (p, g1) = running_profile(&mut fx);
    let (first, _) = granted(&mut fx, &g1);
    fx.ok(Command::ReleaseLease(ReleaseLease { fence: token(&g1) }));
    let ended = fx.state.profile_credentials().lease(first).unwrap();
    assert!(ended.revoked.as_ref().unwrap().reason.contains("ended"));
    let r = fx.rejected_as(&as_worker(), grant_cmd(&g1));
    assert!(matches!(r, Rejection::Fenced { .. }), "{r:?}");

    // Expiry: the sweep fences the lease and ends the credentials with it.
    let g2 = fx.acquire(p);
    let (second, session) = granted(&mut fx, &g2);
    assert_eq!(session, format!("profile-{}-g2", p.get()));
    fx.advance(TTL + 1);
    fx.ok(Command::Sweep);
    let ended = fx.state.profile_credentials().lease(second).unwrap();
    assert!(ended.revoked.as_ref().unwrap().reason.contains("fenced"));
    assert!(fx
        .state
        .profile_credentials()
        .active_for(g2.lease)
        .is_none());

    // A graceful takeover fences the old generation; the new one takes its own.
    fx.ok(Command::RecordReapEvidence(RecordReapEvidence {
        profile: p,
        evidence: evidence(&g2, fx.now),
    }));
    let g3 = fx.acquire(p);
    let (third, _) = granted(&mut fx, &g3);
    let out = fx.ok(Command::GracefulTakeover(GracefulTakeover {
        fence: token(&g3),
        capsule: draft(1, None, "handoff"),
        next: next(Provider::Claude),
        old_reap_evidence: Some(evidence(&g3, fx.now)),
    }));
    let Outcome::TookOver { grant: g4, .. } = out else {
        panic!("{out:?}")
    };
    assert!(!fx
        .state
        .profile_credentials()
        .lease(third)
        .unwrap()
        .is_active());
    let (fourth, session) = granted(&mut fx, &g4);
    assert_ne!(fourth, third);
    assert_eq!(session, format!("profile-{}-g4", p.get()));
    assert_eq!(fx.state.profile_credentials().leases_of(p).count(), 4);
    fx.state.check_invariants().unwrap();
}

#[test]
fn inv_13_revoking_a_credential_ends_the_profile_leases_holding_it() {
    let mut fx = Fx::new();
    let (p, g) = running_profile(&mut fx);
    granted(&mut fx, &g);
    let out = fx.ok(Command::RevokeCredential(RevokeCredential {
        id: cid("cred_b"),
    }));
    assert_eq!(
        out,
        Outcome::CredentialRevoked {
            id: cid("cred_b"),
            leases_revoked: 1
        }
    );
    assert!(fx.state.profile_credentials().active_for(g.lease).is_none());
    // The list still names it: the next grant says which one is gone.
    let r = fx.rejected_as(&as_worker(), grant_cmd(&g));
    assert!(
        matches!(&r, Rejection::CredentialRevoked { field, .. } if field == "credential_refs[1].id"),
        "{r:?}"
    );
    assert_eq!(fx.state.profile_credentials().refs_of(p).len(), 2);
}

fn regrant_cmd(g: &LeaseGrant, only_lease: CredentialLeaseId) -> Command {
    Command::RegrantAgentCredentialLease(RegrantAgentCredentialLease {
        fence: token(g),
        worker: worker(),
        only_lease,
    })
}

/// A restarted worker resuming a generation asks for the lease it served, and only that one:
/// a lease that ended between its look and its grant is never followed by a new one (a plain
/// grant would record one, and the worker would refuse to serve it).
#[test]
fn inv_13_a_resumed_generation_gets_its_own_lease_again_or_nothing() {
    let mut fx = Fx::new();
    let (p, g) = running_profile(&mut fx);
    let (served, _) = granted(&mut fx, &g);
    match fx.ok_as(&as_worker(), regrant_cmd(&g, served)) {
        Outcome::CredentialLeaseGranted {
            lease, credentials, ..
        } => assert_eq!((lease, credentials.len()), (served, 2)),
        o => panic!("unexpected {o:?}"),
    }
    let other = Subject::Worker(WorkerId::new("w-other").unwrap());
    let r = fx.rejected_as(&other, regrant_cmd(&g, served));
    assert!(matches!(r, Rejection::PermissionDenied { .. }), "{r:?}");

    // The profile's list changes mid-generation: it applies from the next generation on, so
    // the lease is granted again with its own credentials, by a regrant and a plain grant.
    put(&mut fx, "cred_c");
    fx.ok(set(p, vec![cref("cred_c", "other_key")]));
    for again in [regrant_cmd(&g, served), grant_cmd(&g)] {
        match fx.ok_as(&as_worker(), again) {
            Outcome::CredentialLeaseGranted {
                lease, credentials, ..
            } => {
                let ids: Vec<&str> = credentials.iter().map(|c| c.id.as_str()).collect();
                assert_eq!((lease, ids), (served, vec!["cred_a", "cred_b"]));
            }
            o => panic!("unexpected {o:?}"),
        }
    }

    // The credential is revoked (the lease ends) and the profile given a live list again.
    fx.ok(Command::RevokeCredential(RevokeCredential {
        id: cid("cred_b"),
    }));
    fx.ok(set(
        p,
        vec![
            cref("cred_a", "anthropic_api_key"),
            cref("cred_c", "openai_api_key"),
        ],
    ));
    let before = fx.state.clone();
    let r = fx.rejected_as(&as_worker(), regrant_cmd(&g, served));
    assert!(
        matches!(&r, Rejection::Invalid(e) if e.field == "only_lease"
            && e.reason.contains(&served.to_string())),
        "{r:?}"
    );
    assert_eq!(fx.state, before, "a refused regrant changed the state");
    assert!(fx.state.profile_credentials().active_for(g.lease).is_none());

    // A plain grant records a new lease; asking for the old one still gets nothing.
    let (fresh, _) = granted(&mut fx, &g);
    assert_ne!(fresh, served);
    let r = fx.rejected_as(&as_worker(), regrant_cmd(&g, served));
    assert!(
        matches!(&r, Rejection::Invalid(e) if e.field == "only_lease"),
        "{r:?}"
    );
    fx.state.check_invariants().unwrap();
}

#[test]
fn inv_13_only_an_admin_names_a_profile_s_credentials_and_bad_lists_change_nothing() {
    let mut fx = Fx::new();
    put(&mut fx, "cred_a");
    put(&mut fx, "cred_gone");
    fx.ok(Command::RevokeCredential(RevokeCredential {
        id: cid("cred_gone"),
    }));
    let p = fx.profile("coder");
    let before = fx.state.clone();
    let r = fx.rejected_as(&as_worker(), set(p, vec![cref("cred_a", "key")]));
    assert!(matches!(r, Rejection::PermissionDenied { .. }), "{r:?}");
    let cases: Vec<(Vec<CredentialRef>, &str)> = vec![
        (vec![cref("cred_nope", "key")], "not found"),
        (vec![cref("cred_gone", "key")], "credential_refs[0].id"),
        (
            vec![cref("cred_a", "key"), cref("cred_a", "key")],
            "credential_refs[1].mount",
        ),
        (vec![cref("cred_a", "no/slash")], "credential_refs[0].mount"),
        (
            (0..=crate::limits::CREDENTIAL_REFS_MAX)
                .map(|i| cref("cred_a", &format!("k{i}")))
                .collect(),
            "credential_refs",
        ),
    ];
    for (refs, names) in cases {
        let r = fx.rejected(set(p, refs));
        assert!(format!("{r:?} {r}").contains(names), "{names}: {r:?}");
    }
    let r = fx.rejected(set(
        ProfileId::new(99).unwrap(),
        vec![cref("cred_a", "key")],
    ));
    assert!(matches!(r, Rejection::NotFound { .. }), "{r:?}");
    assert_eq!(fx.state, before, "a refused list changed the state");

    fx.ok(set(p, vec![cref("cred_a", "key")]));
    assert_eq!(fx.state.profile_credentials().refs_of(p).len(), 1);
    fx.ok(set(p, Vec::new()));
    assert!(fx.state.profile_credentials().refs_of(p).is_empty());
}

#[test]
fn inv_13_the_checker_catches_a_profile_lease_that_outlives_its_runtime_lease() {
    let mut fx = Fx::new();
    let (_, g) = running_profile(&mut fx);
    granted(&mut fx, &g);
    fx.state.check_invariants().unwrap();
    // The runtime lease ended without ending the credentials (the rest kept consistent, so
    // only this check can see it).
    let mut broken = fx.state.clone();
    broken.leases.get_mut(&g.lease).unwrap().state = LeaseState::Released { at_ms: 1 };
    let profile = broken.profiles.get_mut(&g.profile).unwrap();
    profile.live_lease = None;
    profile.past_leases.push_back(g.lease);
    broken.projects = broken
        .projects
        .into_iter()
        .map(|(key, mut p)| {
            p.slots_held = 0;
            (key, p)
        })
        .collect();
    broken.lease_expiry.clear();
    let e = broken.check_invariants().unwrap_err();
    assert!(e.contains("outlived"), "{e}");
}

#[test]
fn inv_13_snapshots_carry_profile_credentials_and_version_6_still_decodes() {
    let mut fx = Fx::new();
    let (_, g) = running_profile(&mut fx);
    granted(&mut fx, &g);
    let bytes = encode_snapshot(&fx.state);
    assert_eq!(decode_snapshot(&bytes).unwrap(), fx.state);

    // Version 6 is this layout without the trailing three maps, the egress bindings, the
    // pruned tasks' figures (a zero count and three empty maps) and the providers' progress.
    let mut without = fx.state.clone();
    without.profile_credentials = Default::default();
    let bytes = encode_snapshot(&without);
    let header = SNAPSHOT_MAGIC.len() + 4;
    let mut v6 = SNAPSHOT_MAGIC.to_vec();
    v6.extend_from_slice(&SNAPSHOT_VERSION_V6.to_be_bytes());
    v6.extend_from_slice(&bytes[header..bytes.len() - 9]);
    assert_eq!(decode_snapshot(&v6).unwrap(), without);
}
