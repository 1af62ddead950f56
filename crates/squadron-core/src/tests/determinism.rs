//! INV-12: determinism, snapshots and log encoding.

use super::*;
use crate::access::Subject;
use crate::codec::{decode_command, decode_response, encode_command, encode_response, CodecError};
use crate::snapshot::{decode_snapshot, encode_snapshot, state_digest, SnapshotError};

pub(super) fn commands() -> Vec<CommandEnvelope> {
    let env = |at_ms, command| CommandEnvelope {
        subject: Subject::Legacy,
        at_ms,
        idempotency_key: None,
        command,
    };
    let p1 = ProfileId::new(1).unwrap();
    let lease1 = crate::ids::LeaseId::new(1).unwrap();
    let fence = FencingToken {
        profile: p1,
        lease: lease1,
        generation: Generation::new(1),
    };
    vec![
        env(
            1,
            Command::RegisterWorker(RegisterWorker {
                worker: worker(),
                address: "127.0.0.1:1".into(),
                runtimes: vec![RuntimeKind::Process],
                capacity: 4,
                labels: BTreeMap::from([("zone".into(), "a".into())]),
                heartbeat_interval_ms: 1_000,
            }),
        ),
        env(
            2,
            Command::CreateProject(CreateProject {
                tenant: tenant(),
                project: project(),
                max_profiles: None,
                max_active: None,
            }),
        ),
        env(
            3,
            Command::AttachSandbox(AttachSandbox {
                tenant: tenant(),
                project: project(),
                worker: worker(),
                runtime: RuntimeKind::Process,
                sandbox_ref: "s".into(),
            }),
        ),
        env(
            4,
            Command::CreateProfile(CreateProfile {
                tenant: tenant(),
                project: project(),
                key: ProfileKey::new("a").unwrap(),
                providers: vec![Provider::Codex, Provider::Claude],
                context_ref: Some("ctx".into()),
            }),
        ),
        env(
            5,
            Command::AcquireLease(AcquireLease {
                profile: p1,
                expected_generation: Generation::ZERO,
                provider: Provider::Codex,
                holder: holder(),
                ttl_ms: TTL,
            }),
        ),
        env(
            6,
            Command::CommitCapsule(CommitCapsule {
                fence,
                capsule: draft(1, None, "one"),
            }),
        ),
        env(
            7,
            Command::SubmitTask(SubmitTask {
                spec: Box::new(spec("lifecycle:\n  artifact_patterns: [\"**/*.md\"]\n")),
            }),
        ),
        env(8, Command::Sweep),
        env(
            9,
            Command::GracefulTakeover(GracefulTakeover {
                fence,
                capsule: draft(2, None, "wrong previous"),
                next: next(Provider::Claude),
                old_reap_evidence: None,
            }),
        ),
    ]
}

#[test]
fn inv_12_same_commands_same_digest_on_every_replica() {
    let mut a = State::new();
    let mut b = State::new();
    for env in commands() {
        let ra = a.apply(env.clone());
        let rb = b.apply(env);
        assert_eq!(ra, rb);
        assert_eq!(state_digest(&a), state_digest(&b));
    }
    // And the digest moves when the state does.
    let before = state_digest(&a);
    a.apply(CommandEnvelope {
        subject: Subject::Legacy,
        at_ms: 10,
        idempotency_key: None,
        command: Command::WorkerHeartbeat(WorkerHeartbeat { worker: worker() }),
    });
    assert_ne!(state_digest(&a), before);
}

#[test]
fn inv_12_snapshot_round_trip_keeps_the_digest() {
    let mut s = State::new();
    for env in commands() {
        s.apply(env);
    }
    let bytes = encode_snapshot(&s);
    let restored = decode_snapshot(&bytes).unwrap();
    assert_eq!(restored, s);
    assert_eq!(state_digest(&restored), state_digest(&s));
    assert_eq!(encode_snapshot(&restored), bytes);
}

#[test]
fn inv_12_corrupt_snapshots_are_refused() {
    let mut s = State::new();
    for env in commands() {
        s.apply(env);
    }
    let bytes = encode_snapshot(&s);
    assert_eq!(
        decode_snapshot(b"nope").unwrap_err(),
        SnapshotError::BadMagic
    );
    // A version this build does not know (the current one is 10; 1 to 9 still decode).
    let mut v11 = bytes.clone();
    v11[11] = 11;
    assert!(matches!(
        decode_snapshot(&v11),
        Err(SnapshotError::UnsupportedVersion { found: 11, .. })
    ));
    assert!(matches!(
        decode_snapshot(&bytes[..bytes.len() - 3]),
        Err(SnapshotError::Malformed(_))
    ));
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert_eq!(
        decode_snapshot(&trailing),
        Err(SnapshotError::Malformed("1 trailing bytes".into()))
    );
    // Streamed from a reader (a snapshot file): only the `len` bytes given are read, and a
    // source that ends before them is refused, saying so.
    let mut file = bytes.clone();
    file.extend_from_slice(b"the next record");
    assert_eq!(
        crate::snapshot::decode_snapshot_from(&file[..], bytes.len() as u64)
            .map(|s| state_digest(&s)),
        Ok(state_digest(&s))
    );
    assert_eq!(
        crate::snapshot::decode_snapshot_from(&bytes[..], bytes.len() as u64 + 2),
        Err(SnapshotError::Malformed(
            "the source ended 2 bytes short of its length".into()
        ))
    );
    // Well-formed but inconsistent: a slot counter that disagrees with the leases.
    let mut forged = s.clone();
    forged.projects = forged
        .projects
        .into_iter()
        .map(|(key, mut p)| {
            p.slots_held += 1;
            (key, p)
        })
        .collect();
    assert!(matches!(
        decode_snapshot(&encode_snapshot(&forged)),
        Err(SnapshotError::Inconsistent(e)) if e.starts_with("INV-5")
    ));
}

#[test]
fn inv_12_every_command_and_response_round_trips_the_log_encoding() {
    let mut s = State::new();
    for mut env in commands() {
        env.idempotency_key =
            Some(crate::ids::IdempotencyKey::new(format!("k{}", env.at_ms)).unwrap());
        let bytes = encode_command(&env);
        assert_eq!(decode_command(&bytes).unwrap(), env);
        let response = s.apply(env);
        assert_eq!(
            decode_response(&encode_response(&response)).unwrap(),
            response
        );
    }
    assert_eq!(decode_command(&[]), Err(CodecError::Empty));
    assert!(matches!(
        decode_command(&[9, 0]),
        Err(CodecError::UnsupportedVersion { found: 9, .. })
    ));
    assert!(matches!(
        decode_command(&[1, 0xff, 0xff]),
        Err(CodecError::Malformed(_))
    ));
    let mut trailing = encode_command(&commands()[0]);
    trailing.push(7);
    assert_eq!(decode_command(&trailing), Err(CodecError::TrailingBytes(1)));
}
