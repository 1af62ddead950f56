//! INV-13: the credential store holds sealed values only, and a session lease belongs to one
//! attempt on one worker and ends with it.

use super::*;
use crate::command::Assignment;
use crate::credential::{SealedSecret, SEALED_NONCE_BYTES};
use crate::ids::CredentialId;
use crate::snapshot::{
    decode_snapshot, encode_snapshot, SNAPSHOT_MAGIC, SNAPSHOT_VERSION_V2, SNAPSHOT_VERSION_V3,
};
use crate::task::TaskState::{self, *};

const REFS: &str = "startup_profile:\n  id: s\n  trigger: on_instance_ready\n  \
    session: { launcher: l, workdir: /workspace, cols: 80, rows: 24 }\n  \
    credential_refs:\n    - { id: cred_a, mount: key_a }\n    - { id: cred_b, mount: key_b }\n  \
    readiness: { probes: [] }\n  \
    observation: { retention_class: short, redaction_profile: credentials }\n";

fn cid(s: &str) -> CredentialId {
    CredentialId::new(s).unwrap()
}

fn sealed(byte: u8) -> SealedSecret {
    SealedSecret {
        key_id: "0123456789abcdef".into(),
        nonce: vec![byte; SEALED_NONCE_BYTES],
        ciphertext: vec![byte; 40],
    }
}

fn put(fx: &mut Fx, id: &str, byte: u8) -> Outcome {
    fx.ok(Command::PutCredential(PutCredential {
        id: cid(id),
        description: "ci key".into(),
        sealed: sealed(byte),
    }))
}

fn worker_subject() -> Subject {
    Subject::Worker(worker())
}

/// A task naming cred_a and cred_b, assigned to the fixture's worker and provisioning.
fn provisioning_task(fx: &mut Fx) -> TaskId {
    put(fx, "cred_a", 1);
    put(fx, "cred_b", 2);
    provisioning_task_again(fx)
}

/// Another such task, the credentials already stored.
fn provisioning_task_again(fx: &mut Fx) -> TaskId {
    let task = fx.submit(REFS);
    fx.ok(Command::AssignTasks(AssignTasks {
        assignments: vec![Assignment {
            task,
            worker: worker(),
        }],
    }));
    move_task(fx, task, Staging, Provisioning);
    task
}

fn move_task(fx: &mut Fx, task: TaskId, from: TaskState, to: TaskState) {
    let r = report(fx, task, from, to, (to == Completing).then_some(0));
    assert!(r.is_ok(), "{from} -> {to}: {r:?}");
}

fn grant_cmd(fx: &Fx, task: TaskId) -> Command {
    Command::GrantCredentialLease(GrantCredentialLease {
        task,
        worker: worker(),
        attempt: fx.state.task(task).unwrap().attempt,
    })
}

fn grant(fx: &mut Fx, task: TaskId) -> Outcome {
    let cmd = grant_cmd(fx, task);
    fx.ok_as(&worker_subject(), cmd)
}

#[test]
fn inv_13_put_rotate_revoke_keep_versions_and_drop_the_value() {
    let mut fx = Fx::new();
    assert_eq!(
        put(&mut fx, "cred_a", 1),
        Outcome::CredentialStored {
            id: cid("cred_a"),
            version: 1
        }
    );
    let again = fx.rejected(Command::PutCredential(PutCredential {
        id: cid("cred_a"),
        description: String::new(),
        sealed: sealed(9),
    }));
    assert!(
        matches!(again, Rejection::AlreadyExists { .. }),
        "{again:?}"
    );
    let rotated = fx.ok(Command::RotateCredential(RotateCredential {
        id: cid("cred_a"),
        sealed: sealed(3),
    }));
    assert_eq!(
        rotated,
        Outcome::CredentialStored {
            id: cid("cred_a"),
            version: 2
        }
    );
    assert_eq!(
        fx.state
            .credentials()
            .credential(&cid("cred_a"))
            .unwrap()
            .sealed,
        Some(sealed(3))
    );
    fx.ok(Command::RevokeCredential(RevokeCredential {
        id: cid("cred_a"),
    }));
    let revoked = fx.state.credentials().credential(&cid("cred_a")).unwrap();
    assert!(revoked.sealed.is_none() && revoked.is_revoked());
    let rotate_revoked = fx.rejected(Command::RotateCredential(RotateCredential {
        id: cid("cred_a"),
        sealed: sealed(4),
    }));
    assert!(
        matches!(rotate_revoked, Rejection::CredentialRevoked { .. }),
        "{rotate_revoked:?}"
    );
    // The id may be used again; its version keeps rising.
    assert_eq!(
        put(&mut fx, "cred_a", 5),
        Outcome::CredentialStored {
            id: cid("cred_a"),
            version: 3
        }
    );
}

#[test]
fn inv_13_only_an_admin_stores_credentials_and_bad_shapes_change_nothing() {
    let mut fx = Fx::new();
    let denied = fx.rejected_as(
        &worker_subject(),
        Command::PutCredential(PutCredential {
            id: cid("cred_a"),
            description: String::new(),
            sealed: sealed(1),
        }),
    );
    assert!(
        matches!(denied, Rejection::PermissionDenied { .. }),
        "{denied:?}"
    );
    let before = fx.state.clone();
    for (bad, field) in [
        (
            SealedSecret {
                nonce: vec![0; 24],
                ..sealed(1)
            },
            "sealed.nonce",
        ),
        (
            SealedSecret {
                key_id: "not-hex".into(),
                ..sealed(1)
            },
            "sealed.key_id",
        ),
        (
            SealedSecret {
                ciphertext: Vec::new(),
                ..sealed(1)
            },
            "sealed.ciphertext",
        ),
    ] {
        let r = fx.rejected(Command::PutCredential(PutCredential {
            id: cid("cred_a"),
            description: String::new(),
            sealed: bad,
        }));
        assert!(
            matches!(&r, Rejection::Invalid(e) if e.field == field),
            "{field}: {r:?}"
        );
    }
    let r = fx.rejected(Command::PutCredential(PutCredential {
        id: cid("cred_a"),
        description: "x".repeat(300),
        sealed: sealed(1),
    }));
    assert!(
        matches!(&r, Rejection::Invalid(e) if e.field == "description"),
        "{r:?}"
    );
    assert_eq!(fx.state.credentials(), before.credentials());
}

#[test]
fn inv_13_a_lease_goes_only_to_the_task_s_worker_for_its_attempt() {
    let mut fx = Fx::new();
    let task = provisioning_task(&mut fx);
    let other = WorkerId::new("w2").unwrap();
    fx.register_worker(other.clone());
    let r = fx.rejected_as(
        &Subject::Worker(other.clone()),
        Command::GrantCredentialLease(GrantCredentialLease {
            task,
            worker: other,
            attempt: 1,
        }),
    );
    assert!(matches!(r, Rejection::NotTaskOwner { .. }), "{r:?}");
    let r = fx.rejected_as(
        &Subject::Operator(crate::access::TokenId::new("0000000000000001").unwrap()),
        grant_cmd(&fx, task),
    );
    assert!(matches!(r, Rejection::PermissionDenied { .. }), "{r:?}");
    let r = fx.rejected_as(
        &worker_subject(),
        Command::GrantCredentialLease(GrantCredentialLease {
            task,
            worker: worker(),
            attempt: 2,
        }),
    );
    assert!(matches!(r, Rejection::NotTaskOwner { .. }), "{r:?}");

    let Outcome::CredentialLeaseGranted {
        lease,
        session,
        credentials,
    } = grant(&mut fx, task)
    else {
        panic!()
    };
    assert_eq!(session, format!("task-{}-a1", task.get()));
    let mounts: Vec<_> = credentials
        .iter()
        .map(|c| (c.mount.as_str(), c.version))
        .collect();
    assert_eq!(mounts, [("key_a", 1), ("key_b", 1)]);
    assert_eq!(credentials[1].sealed, sealed(2));
    // Asked again (a lost answer), the same lease comes back.
    let Outcome::CredentialLeaseGranted { lease: again, .. } = grant(&mut fx, task) else {
        panic!()
    };
    assert_eq!(again, lease);
    assert_eq!(fx.state.credentials().leases_of(task).count(), 1);
}

#[test]
fn inv_13_a_lease_ends_with_the_task_and_is_not_granted_after() {
    let mut fx = Fx::new();
    let task = provisioning_task(&mut fx);
    grant(&mut fx, task);
    move_task(&mut fx, task, Provisioning, Ready);
    move_task(&mut fx, task, Ready, Running);
    assert!(fx.state.credentials().active_lease_of(task).is_some());
    move_task(&mut fx, task, Running, Completing);
    move_task(&mut fx, task, Completing, Completed);
    assert!(fx.state.credentials().active_lease_of(task).is_none());
    let ended = fx.state.credentials().leases_of(task).next().unwrap();
    let why = &ended.revoked.as_ref().expect("revoked").reason;
    assert!(why.contains("COMPLETED"), "{why}");
    let r = fx.rejected_as(&worker_subject(), grant_cmd(&fx, task));
    assert!(matches!(r, Rejection::IllegalTransition { .. }), "{r:?}");
}

#[test]
fn inv_13_losing_the_worker_ends_the_lease_and_the_next_attempt_gets_its_own() {
    let mut fx = Fx::new();
    let task = provisioning_task(&mut fx);
    grant(&mut fx, task);
    fx.advance(WORKER_TTL * 2);
    fx.ok(Command::Sweep);
    let t = fx.state.task(task).unwrap();
    assert_eq!((t.state, t.attempt), (Pending, 2));
    let first = fx.state.credentials().leases_of(task).next().unwrap();
    assert!(first.revoked.as_ref().unwrap().reason.contains("lost"));
    assert!(fx.state.credentials().active_lease_of(task).is_none());
}

#[test]
fn inv_13_revoking_a_credential_ends_the_leases_holding_it_and_names_the_field() {
    let mut fx = Fx::new();
    let task = provisioning_task(&mut fx);
    grant(&mut fx, task);
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
    assert!(fx.state.credentials().active_lease_of(task).is_none());
    let r = fx.rejected_as(&worker_subject(), grant_cmd(&fx, task));
    assert!(
        matches!(&r, Rejection::CredentialRevoked { field, .. }
            if field == "startup_profile.credential_refs[1].id"),
        "{r:?}"
    );
    let spec = fx.state.task(task).unwrap().spec.clone();
    let r = fx.state.check_credential_refs(&spec).unwrap_err();
    assert!(matches!(r, Rejection::CredentialRevoked { .. }), "{r:?}");
}

#[test]
fn inv_13_the_checker_catches_a_lease_that_outlives_its_attempt() {
    let mut fx = Fx::new();
    let task = provisioning_task(&mut fx);
    grant(&mut fx, task);
    let mut broken = fx.state.clone();
    broken.tasks.get_mut(&task).unwrap().live_mut().attempt = 2;
    let e = broken.check_invariants().unwrap_err();
    assert!(e.contains("outlived"), "{e}");
    let mut broken = fx.state.clone();
    broken
        .credentials
        .credentials
        .get_mut(&cid("cred_a"))
        .unwrap()
        .sealed = None;
    assert!(broken.check_invariants().unwrap_err().contains("malformed"));
}

#[test]
fn inv_13_snapshots_carry_credentials_and_version_2_still_decodes() {
    let mut fx = Fx::new();
    let task = provisioning_task(&mut fx);
    grant(&mut fx, task);
    let bytes = encode_snapshot(&fx.state);
    assert_eq!(decode_snapshot(&bytes).unwrap(), fx.state);

    // A version-2 snapshot is this layout without the trailing credential state, worker
    // policies, agent sessions, task leases, profile credentials, egress bindings, figures
    // of pruned tasks and providers' progress; empty, they encode as three empty maps, the
    // first lease id, seven more empty maps, a zero count and three empty maps, and one more
    // empty map, one byte each. Version 3 keeps the credentials, version 4 the policies,
    // version 5 the agent sessions, version 6 the task leases, version 7 the profile
    // credentials, version 8 the egress bindings, version 9 the figures of pruned tasks.
    let empty = Fx::new().state;
    let v6 = encode_snapshot(&empty);
    let header = SNAPSHOT_MAGIC.len() + 4;
    for (version, cut) in [
        (SNAPSHOT_VERSION_V2, 16),
        (SNAPSHOT_VERSION_V3, 12),
        (crate::snapshot::SNAPSHOT_VERSION_V4, 11),
        (crate::snapshot::SNAPSHOT_VERSION_V5, 10),
        (crate::snapshot::SNAPSHOT_VERSION_V6, 9),
        (crate::snapshot::SNAPSHOT_VERSION_V7, 6),
        (crate::snapshot::SNAPSHOT_VERSION_V8, 5),
        (crate::snapshot::SNAPSHOT_VERSION_V9, 1),
    ] {
        let mut old = SNAPSHOT_MAGIC.to_vec();
        old.extend_from_slice(&version.to_be_bytes());
        old.extend_from_slice(&v6[header..v6.len() - cut]);
        assert_eq!(decode_snapshot(&old).unwrap(), empty, "version {version}");
    }
    let with_credentials = fx.state.clone();
    let bytes = encode_snapshot(&with_credentials);
    let mut v3 = SNAPSHOT_MAGIC.to_vec();
    v3.extend_from_slice(&SNAPSHOT_VERSION_V3.to_be_bytes());
    v3.extend_from_slice(&bytes[header..bytes.len() - 12]);
    assert_eq!(decode_snapshot(&v3).unwrap(), with_credentials);
}

#[test]
fn inv_13_a_grant_after_a_rotation_records_the_version_it_hands_out() {
    let mut fx = Fx::new();
    let task = provisioning_task(&mut fx);
    let Outcome::CredentialLeaseGranted { lease, .. } = grant(&mut fx, task) else {
        panic!()
    };
    fx.ok(Command::RotateCredential(RotateCredential {
        id: cid("cred_a"),
        sealed: sealed(7),
    }));
    let Outcome::CredentialLeaseGranted {
        lease: again,
        credentials,
        ..
    } = grant(&mut fx, task)
    else {
        panic!()
    };
    assert_eq!(again, lease, "the same lease");
    assert_eq!(
        (credentials[0].version, &credentials[0].sealed),
        (2, &sealed(7))
    );
    let recorded = fx.state.credentials().lease(lease).unwrap();
    assert_eq!(recorded.credentials[0].version, 2, "{recorded:?}");
    assert_eq!(recorded.credentials[1].version, 1);
}

#[test]
fn inv_13_a_resumed_attempt_gets_its_own_lease_again_or_nothing() {
    let mut fx = Fx::new();
    let task = provisioning_task(&mut fx);
    let Outcome::CredentialLeaseGranted { lease, .. } = grant(&mut fx, task) else {
        panic!("no grant")
    };
    let regrant = |fx: &Fx, worker: WorkerId, only_lease| {
        Command::RegrantCredentialLease(crate::command::RegrantCredentialLease {
            task,
            worker,
            attempt: fx.state.task(task).unwrap().attempt,
            only_lease,
        })
    };
    // The lease it held: the same lease, with its two credentials.
    let cmd = regrant(&fx, worker(), lease);
    let Outcome::CredentialLeaseGranted {
        lease: again,
        credentials,
        ..
    } = fx.ok_as(&worker_subject(), cmd)
    else {
        panic!("no regrant")
    };
    assert_eq!(again, lease);
    assert_eq!(credentials.len(), 2);
    // The same worker's active lease of another task is not this task's.
    let second = provisioning_task_again(&mut fx);
    let Outcome::CredentialLeaseGranted { lease: theirs, .. } = grant(&mut fx, second) else {
        panic!("no grant")
    };
    let cmd = regrant(&fx, worker(), theirs);
    let r = fx.rejected_as(&worker_subject(), cmd);
    assert!(
        matches!(&r, Rejection::Invalid(e) if e.field == "only_lease"),
        "{r:?}"
    );
    // Another worker may not ask, and learns nothing of the lease.
    let other = WorkerId::new("w2").unwrap();
    fx.register_worker(other.clone());
    let cmd = regrant(&fx, other.clone(), lease);
    let r = fx.rejected_as(&Subject::Worker(other), cmd);
    assert!(matches!(r, Rejection::NotTaskOwner { .. }), "{r:?}");
    // Revoked and put again while the worker was down: the lease ended, and asking for it
    // again records nothing.
    fx.ok(Command::RevokeCredential(RevokeCredential {
        id: cid("cred_b"),
    }));
    put(&mut fx, "cred_b", 9);
    let before = fx.state.clone();
    let cmd = regrant(&fx, worker(), lease);
    let r = fx.rejected_as(&worker_subject(), cmd);
    assert!(
        matches!(&r, Rejection::Invalid(e) if e.field == "only_lease"),
        "{r:?}"
    );
    assert_eq!(fx.state.credentials(), before.credentials());
    // A plain grant would have recorded a new lease with the new value: what a resumed
    // attempt must not be handed. The old lease stays refused.
    let Outcome::CredentialLeaseGranted { lease: fresh, .. } = grant(&mut fx, task) else {
        panic!("no grant")
    };
    assert_ne!(fresh, lease);
    let cmd = regrant(&fx, worker(), lease);
    let r = fx.rejected_as(&worker_subject(), cmd);
    assert!(
        matches!(&r, Rejection::Invalid(e) if e.field == "only_lease"),
        "{r:?}"
    );
}
