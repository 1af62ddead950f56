//! The trust boundary in the state machine: tokens, enrollment, certificates, the subject
//! rules ("a worker speaks only for itself", "only an admin mints"), child tasks, the audit
//! record, and reading what earlier versions wrote.

use crate::access::{
    AgentIdentity, BootstrapPurpose, CertSerial, Identity, ProjectScope, Role, Subject, TokenId,
};
use crate::codec::encode_command;
use crate::command::*;
use crate::error_code::ErrorCode;
use crate::ids::{Digest, IdempotencyKey, TaskId, WorkerId};
use crate::limits::{ACCESS_RECORD_RETENTION_MS, AUDIT_RECORDS_KEPT, CERT_VALIDITY_MS_MAX};
use crate::rejection::Rejection;
use crate::response::{Outcome, Response};
use crate::snapshot::{decode_snapshot, encode_snapshot};
use crate::task::TaskState;

use super::*;

const HOUR: u64 = 3_600_000;

fn tid(n: u8) -> TokenId {
    TokenId::new(format!("{n:016x}")).unwrap()
}

fn digest(n: u8) -> Digest {
    Digest::from_bytes([n; 32])
}

fn serial(s: &str) -> CertSerial {
    CertSerial::new(s).unwrap()
}

fn w(name: &str) -> WorkerId {
    WorkerId::new(name).unwrap()
}

fn create_token(id: u8, role: Role, scope: Vec<ProjectScope>) -> Command {
    Command::CreateOperatorToken(CreateOperatorToken {
        id: tid(id),
        digest: digest(id),
        role,
        scope,
        name: format!("token {id}"),
        expires_at_ms: None,
    })
}

fn acme() -> Vec<ProjectScope> {
    vec![ProjectScope {
        tenant: tenant(),
        project: None,
    }]
}

fn mint(id: u8, purpose: BootstrapPurpose, expires_at_ms: u64) -> Command {
    Command::MintBootstrapToken(MintBootstrapToken {
        id: tid(id),
        digest: digest(id),
        purpose,
        expires_at_ms,
    })
}

fn enroll(
    token: u8,
    presented: u8,
    identity: Identity,
    serial_hex: &str,
    not_after: u64,
) -> Command {
    Command::Enroll(Enroll {
        token: tid(token),
        presented: digest(presented),
        identity,
        serial: serial(serial_hex),
        not_after_ms: not_after,
    })
}

/// A fixture with an admin token (made by the cluster itself, as at first start).
fn fx_with_admin() -> (Fx, Subject) {
    let mut fx = Fx::new();
    fx.ok_as(&Subject::System, create_token(1, Role::Admin, vec![]));
    (fx, Subject::Operator(tid(1)))
}

#[test]
fn only_an_admin_creates_tokens_and_mints_bootstrap_tokens() {
    let (mut fx, admin) = fx_with_admin();
    fx.ok_as(&admin, create_token(2, Role::Operator, acme()));
    let operator = Subject::Operator(tid(2));
    let expires = fx.now + HOUR;
    for subject in [
        operator.clone(),
        Subject::Worker(worker()),
        Subject::Agent(AgentIdentity::Task(TaskId::new(1).unwrap())),
        Subject::Node(1),
        Subject::Operator(tid(99)),
    ] {
        let r = fx.rejected_as(&subject, create_token(3, Role::Admin, vec![]));
        assert_eq!(r.code(), ErrorCode::PermissionDenied, "{subject}: {r}");
        let r = fx.rejected_as(
            &subject,
            mint(3, BootstrapPurpose::Worker { worker: None }, expires),
        );
        assert_eq!(r.code(), ErrorCode::PermissionDenied, "{subject}: {r}");
    }
    // A revoked admin is no admin.
    fx.ok_as(&admin, create_token(4, Role::Admin, vec![]));
    fx.ok_as(
        &admin,
        Command::RevokeOperatorToken(RevokeOperatorToken { id: tid(4) }),
    );
    let r = fx.rejected_as(
        &Subject::Operator(tid(4)),
        create_token(5, Role::Viewer, vec![]),
    );
    assert_eq!(r.code(), ErrorCode::PermissionDenied);
    // An expired admin neither.
    fx.ok_as(
        &admin,
        Command::CreateOperatorToken(CreateOperatorToken {
            expires_at_ms: Some(fx.now + 10),
            ..match create_token(6, Role::Admin, vec![]) {
                Command::CreateOperatorToken(c) => c,
                _ => unreachable!(),
            }
        }),
    );
    fx.advance(10);
    let r = fx.rejected_as(
        &Subject::Operator(tid(6)),
        create_token(7, Role::Viewer, vec![]),
    );
    assert_eq!(r.code(), ErrorCode::PermissionDenied);
}

#[test]
fn token_records_are_checked_and_bad_ones_change_nothing() {
    let (mut fx, admin) = fx_with_admin();
    let cases: Vec<(Command, &str)> = vec![
        (create_token(2, Role::Admin, acme()), "scope"),
        (create_token(2, Role::Operator, vec![]), "scope"),
        (create_token(1, Role::Viewer, vec![]), "already exists"),
        (
            Command::CreateOperatorToken(CreateOperatorToken {
                name: " ".into(),
                ..match create_token(2, Role::Viewer, vec![]) {
                    Command::CreateOperatorToken(c) => c,
                    _ => unreachable!(),
                }
            }),
            "name",
        ),
        (
            Command::CreateOperatorToken(CreateOperatorToken {
                expires_at_ms: Some(fx.now),
                ..match create_token(2, Role::Viewer, vec![]) {
                    Command::CreateOperatorToken(c) => c,
                    _ => unreachable!(),
                }
            }),
            "expires_at_ms",
        ),
        (
            Command::RevokeOperatorToken(RevokeOperatorToken { id: tid(77) }),
            "not found",
        ),
    ];
    for (command, needle) in cases {
        let r = fx.rejected_as(&admin, command);
        assert!(r.to_string().contains(needle), "{r} lacks {needle:?}");
    }
    let token = fx.state.operator_token(&tid(1)).unwrap();
    assert_eq!(token.created_by, Subject::System);
    assert!(token.is_live(fx.now));
    // Scope: a tenant-wide entry covers its projects; a project entry only that project.
    fx.ok_as(
        &admin,
        create_token(
            3,
            Role::Operator,
            vec![ProjectScope {
                tenant: tenant(),
                project: Some(project()),
            }],
        ),
    );
    let t = fx.state.operator_token(&tid(3)).unwrap();
    assert!(t.covers(&tenant(), Some(&project())));
    assert!(!t.covers(&tenant(), Some(&crate::ids::ProjectId::new("api").unwrap())));
    assert!(!t.covers(&tenant(), None));
    assert!(!t.covers(
        &crate::ids::TenantId::new("other").unwrap(),
        Some(&project())
    ));
}

#[test]
fn a_bootstrap_token_enrolls_once_and_refusals_change_nothing() {
    let (mut fx, admin) = fx_with_admin();
    let expires = fx.now + 10 * 60_000;
    let not_after = fx.now + 24 * HOUR;
    fx.ok_as(
        &admin,
        mint(
            2,
            BootstrapPurpose::Worker {
                worker: Some(w("w9")),
            },
            expires,
        ),
    );
    // Wrong secret, wrong identity: refused, and the token still works afterwards.
    let r = fx.rejected_as(
        &Subject::Node(1),
        enroll(2, 3, Identity::Worker(w("w9")), "01", not_after),
    );
    assert_eq!(r.code(), ErrorCode::Unauthenticated);
    let r = fx.rejected_as(
        &Subject::Node(1),
        enroll(2, 2, Identity::Worker(w("w8")), "01", not_after),
    );
    assert_eq!(r.code(), ErrorCode::PermissionDenied);
    let r = fx.rejected_as(
        &Subject::Node(1),
        enroll(
            2,
            2,
            Identity::Worker(w("w9")),
            "01",
            fx.now + CERT_VALIDITY_MS_MAX + HOUR,
        ),
    );
    assert_eq!(r.code(), ErrorCode::InvalidArgument);
    match fx.ok_as(
        &Subject::Node(1),
        enroll(2, 2, Identity::Worker(w("w9")), "01", not_after),
    ) {
        Outcome::Enrolled {
            identity,
            serial: s,
            ..
        } => {
            assert_eq!(identity, Identity::Worker(w("w9")));
            assert_eq!(s, serial("01"));
        }
        o => panic!("{o:?}"),
    }
    // A replay is refused the same way as an unknown token.
    let r = fx.rejected_as(
        &Subject::Node(2),
        enroll(2, 2, Identity::Worker(w("w9")), "02", not_after),
    );
    assert_eq!(
        r,
        Rejection::unauthenticated("the bootstrap token is not accepted")
    );
    let r = fx.rejected_as(
        &Subject::Node(2),
        enroll(55, 55, Identity::Worker(w("w9")), "02", not_after),
    );
    assert_eq!(
        r,
        Rejection::unauthenticated("the bootstrap token is not accepted")
    );
    let cert = fx.state.certificate(&serial("01")).unwrap();
    assert!(cert.is_live(fx.now));
    // An expired token is refused.
    fx.ok_as(
        &admin,
        mint(
            3,
            BootstrapPurpose::Worker { worker: None },
            fx.now + 10_000,
        ),
    );
    fx.advance(10_000);
    let r = fx.rejected_as(
        &Subject::Node(1),
        enroll(3, 3, Identity::Worker(w("w7")), "03", fx.now + HOUR),
    );
    assert_eq!(r.code(), ErrorCode::Unauthenticated);
    // Lifetimes out of bounds are refused at minting.
    for ttl in [0, 9_999, 24 * HOUR + 1] {
        let r = fx.rejected_as(
            &admin,
            mint(4, BootstrapPurpose::Worker { worker: None }, fx.now + ttl),
        );
        assert_eq!(r.code(), ErrorCode::InvalidArgument, "{ttl}");
    }
}

#[test]
fn the_same_token_at_two_nodes_at_once_yields_exactly_one_certificate() {
    let (mut fx, admin) = fx_with_admin();
    fx.ok_as(
        &admin,
        mint(
            2,
            BootstrapPurpose::Worker {
                worker: Some(w("w9")),
            },
            fx.now + HOUR,
        ),
    );
    // Two nodes signed a certificate each and proposed; their commands share one entry.
    let batch = Command::Batch(Batch {
        commands: ["0a", "0b"]
            .iter()
            .enumerate()
            .map(|(i, s)| BatchedCommand {
                idempotency_key: None,
                subject: Subject::Node(i as u64 + 1),
                command: enroll(2, 2, Identity::Worker(w("w9")), s, fx.now + HOUR),
            })
            .collect(),
    });
    let Outcome::Batch { responses } = fx.ok_as(&Subject::Node(1), batch) else {
        panic!("batch");
    };
    let enrolled = responses.iter().filter(|r| r.is_ok()).count();
    assert_eq!(enrolled, 1, "{responses:?}");
    assert!(fx.state.certificate(&serial("0a")).is_some());
    assert!(fx.state.certificate(&serial("0b")).is_none());
}

#[test]
fn an_unbound_worker_token_cannot_take_a_known_worker_id() {
    let (mut fx, admin) = fx_with_admin();
    fx.ok_as(
        &admin,
        mint(2, BootstrapPurpose::Worker { worker: None }, fx.now + HOUR),
    );
    // w1 is registered in the fixture.
    let r = fx.rejected_as(
        &Subject::Node(1),
        enroll(2, 2, Identity::Worker(worker()), "01", fx.now + HOUR),
    );
    assert_eq!(r.code(), ErrorCode::PermissionDenied);
    assert!(r.to_string().contains("bound to it"), "{r}");
    // A new id enrolls; after that the id is known, so a second unbound token cannot take it.
    fx.ok_as(
        &Subject::Node(1),
        enroll(2, 2, Identity::Worker(w("w5")), "01", fx.now + HOUR),
    );
    fx.ok_as(
        &admin,
        mint(3, BootstrapPurpose::Worker { worker: None }, fx.now + HOUR),
    );
    let r = fx.rejected_as(
        &Subject::Node(1),
        enroll(3, 3, Identity::Worker(w("w5")), "02", fx.now + HOUR),
    );
    assert_eq!(r.code(), ErrorCode::PermissionDenied);
    // An agent token enrolls only its agent.
    let agent = AgentIdentity::Task(TaskId::new(4).unwrap());
    fx.ok_as(
        &admin,
        mint(4, BootstrapPurpose::Agent { agent }, fx.now + HOUR),
    );
    let r = fx.rejected_as(
        &Subject::Node(1),
        enroll(4, 4, Identity::Worker(w("w6")), "04", fx.now + HOUR),
    );
    assert_eq!(r.code(), ErrorCode::PermissionDenied);
    fx.ok_as(
        &Subject::Node(1),
        enroll(4, 4, Identity::Agent(agent), "04", fx.now + HOUR),
    );
}

#[test]
fn certificates_renew_only_for_their_own_live_identity_and_decommission_revokes() {
    let (mut fx, admin) = fx_with_admin();
    fx.ok_as(
        &admin,
        mint(
            2,
            BootstrapPurpose::Worker {
                worker: Some(worker()),
            },
            fx.now + HOUR,
        ),
    );
    fx.ok_as(
        &Subject::Node(1),
        enroll(2, 2, Identity::Worker(worker()), "01", fx.now + HOUR),
    );
    let renew = |s: &str, at: u64| {
        Command::RecordCertificate(RecordCertificate {
            identity: Identity::Worker(worker()),
            serial: serial(s),
            not_after_ms: at + 2 * HOUR,
        })
    };
    for other in [Subject::Worker(w("w2")), admin.clone(), Subject::Node(1)] {
        let r = fx.rejected_as(&other, renew("02", fx.now));
        assert_eq!(r.code(), ErrorCode::PermissionDenied, "{other}");
    }
    fx.ok_as(&Subject::Worker(worker()), renew("02", fx.now));
    let r = fx.rejected_as(&Subject::Worker(worker()), renew("02", fx.now));
    assert_eq!(r.code(), ErrorCode::AlreadyExists);
    // Decommissioning the worker revokes every certificate it holds.
    fx.ok_as(
        &admin,
        Command::DecommissionWorker(DecommissionWorker {
            worker: worker(),
            operator: "ops".into(),
            reason: "host gone".into(),
        }),
    );
    for s in ["01", "02"] {
        assert!(
            !fx.state.certificate(&serial(s)).unwrap().is_live(fx.now),
            "{s}"
        );
    }
    let r = fx.rejected_as(&Subject::Worker(worker()), renew("03", fx.now));
    assert_eq!(r.code(), ErrorCode::Unauthenticated);
    // Only an admin decommissions.
    fx.register_worker(w("w2"));
    let r = fx.rejected_as(
        &Subject::Worker(w("w2")),
        Command::DecommissionWorker(DecommissionWorker {
            worker: w("w2"),
            operator: "me".into(),
            reason: "x".into(),
        }),
    );
    assert_eq!(r.code(), ErrorCode::PermissionDenied);
    // The sweep forgets revoked certificates once the retention has passed.
    fx.advance(ACCESS_RECORD_RETENTION_MS + 1);
    fx.ok_as(&Subject::System, Command::Sweep);
    assert!(fx.state.certificate(&serial("01")).is_none());
}

/// A task's agent renews its own certificate while the task lives; once the task ended the
/// renewal is refused and nothing is recorded, so a key that leaked from the sandbox dies with
/// the certificate it holds.
#[test]
fn an_agent_renews_only_while_its_task_lives() {
    let (mut fx, admin) = fx_with_admin();
    let task = fx.submit("");
    let agent = AgentIdentity::Task(task);
    fx.ok_as(
        &admin,
        mint(2, BootstrapPurpose::Agent { agent }, fx.now + HOUR),
    );
    fx.ok_as(
        &Subject::Node(1),
        enroll(2, 2, Identity::Agent(agent), "01", fx.now + HOUR),
    );
    let renew = |s: &str, at: u64| {
        Command::RecordCertificate(RecordCertificate {
            identity: Identity::Agent(agent),
            serial: serial(s),
            not_after_ms: at + HOUR,
        })
    };
    let other = Subject::Agent(AgentIdentity::Task(TaskId::new(task.get() + 1).unwrap()));
    let r = fx.rejected_as(&other, renew("02", fx.now));
    assert_eq!(r.code(), ErrorCode::PermissionDenied, "{r}");
    fx.ok_as(&Subject::Agent(agent), renew("02", fx.now));
    assert!(fx.state.certificate(&serial("02")).is_some());
    fx.ok(Command::CancelTask(CancelTask {
        task,
        reason: "done with it".into(),
    }));
    assert!(fx.state.task(task).unwrap().state.is_terminal());
    let r = fx.rejected_as(&Subject::Agent(agent), renew("03", fx.now));
    assert_eq!(r.code(), ErrorCode::PermissionDenied, "{r}");
    assert!(r.to_string().contains("not renewed"), "{r}");
    assert!(fx.state.certificate(&serial("03")).is_none());
}

#[test]
fn a_worker_speaks_only_for_itself() {
    let mut fx = Fx::new();
    fx.register_worker(w("w2"));
    let p = fx.profile("a");
    let grant = fx.acquire(p);
    let other = Subject::Worker(w("w2"));
    let own = Subject::Worker(worker());
    let heartbeat = Command::WorkerHeartbeat(WorkerHeartbeat { worker: worker() });
    let r = fx.rejected_as(&other, heartbeat.clone());
    assert_eq!(r.code(), ErrorCode::PermissionDenied);
    fx.ok_as(&own, heartbeat);
    let renewals = Command::RenewLeases(RenewLeases {
        worker: worker(),
        fences: vec![token(&grant)],
        ttl_ms: TTL,
    });
    assert_eq!(
        fx.rejected_as(&other, renewals.clone()).code(),
        ErrorCode::PermissionDenied
    );
    fx.ok_as(&own, renewals);
    // Under a fence, too: only the holder's worker renews, releases or commits.
    let renew = Command::RenewLease(RenewLease {
        fence: token(&grant),
        ttl_ms: TTL,
    });
    assert_eq!(
        fx.rejected_as(&other, renew.clone()).code(),
        ErrorCode::PermissionDenied
    );
    fx.ok_as(&own, renew);
    let release = Command::ReleaseLease(ReleaseLease {
        fence: token(&grant),
    });
    assert_eq!(
        fx.rejected_as(&other, release.clone()).code(),
        ErrorCode::PermissionDenied
    );
    let register = Command::RegisterWorker(RegisterWorker {
        worker: worker(),
        address: "127.0.0.1:1".into(),
        runtimes: vec![RuntimeKind::Process],
        capacity: 1,
        labels: Default::default(),
        heartbeat_interval_ms: WORKER_TTL / 3,
    });
    assert_eq!(
        fx.rejected_as(&other, register.clone()).code(),
        ErrorCode::PermissionDenied
    );
    let admin_like = Subject::Operator(tid(1));
    assert_eq!(
        fx.rejected_as(&admin_like, register).code(),
        ErrorCode::PermissionDenied
    );
    // A lease for another worker's holder cannot be taken by a worker.
    let p2 = fx.profile("b");
    let r = fx.rejected_as(&other, fx.acquire_cmd(p2, 0));
    assert_eq!(r.code(), ErrorCode::PermissionDenied);
}

#[test]
fn reap_evidence_is_believed_only_from_the_holders_worker() {
    let mut fx = Fx::new();
    fx.register_worker(w("w2"));
    let p = fx.profile("a");
    let grant = fx.acquire(p);
    fx.advance(TTL + 1);
    let post = |e: crate::lease::ReapEvidence| {
        Command::RecordReapEvidence(RecordReapEvidence {
            profile: p,
            evidence: e,
        })
    };
    let good = evidence(&grant, fx.now);
    // A forged `populated: false` from anyone but the holder's worker changes nothing: the
    // attack that would let a crash takeover start a second writer.
    for forger in [
        Subject::Worker(w("w2")),
        Subject::Operator(tid(1)),
        Subject::Agent(AgentIdentity::Task(TaskId::new(1).unwrap())),
        Subject::Node(1),
        Subject::System,
    ] {
        let r = fx.rejected_as(&forger, post(good.clone()));
        assert_eq!(r.code(), ErrorCode::PermissionDenied, "{forger}: {r}");
    }
    // An operator-decommission source cannot be posted, not even by the holder.
    let mut forged = good.clone();
    forged.source = crate::lease::EvidenceSource::OperatorDecommission {
        operator: "me".into(),
        reason: "trust me".into(),
    };
    let r = fx.rejected_as(&Subject::Worker(worker()), post(forged));
    assert_eq!(r.code(), ErrorCode::FailedPrecondition);
    // Evidence inside a crash takeover is held to the same rule.
    let takeover = Command::CrashTakeover(CrashTakeover {
        profile: p,
        lease: grant.lease,
        generation: grant.generation,
        next: next(Provider::Claude),
        reap_evidence: Some(good.clone()),
    });
    let r = fx.rejected_as(&Subject::Worker(w("w2")), takeover.clone());
    assert_eq!(r.code(), ErrorCode::PermissionDenied);
    fx.ok_as(&Subject::Worker(worker()), takeover);
}

#[test]
fn an_agent_submits_children_of_its_own_task_and_nobody_else_sets_a_parent() {
    let mut fx = Fx::new();
    let parent = fx.submit("");
    let agent = Subject::Agent(AgentIdentity::Task(parent));
    let submit = || {
        Command::SubmitTask(SubmitTask {
            spec: Box::new(spec("")),
        })
    };
    let child = match fx.ok_as(&agent, submit()) {
        Outcome::TaskSubmitted { task } => task,
        o => panic!("{o:?}"),
    };
    assert_eq!(fx.state.lineage().parent(child), Some(parent));
    assert_eq!(
        fx.state.lineage().children(parent).collect::<Vec<_>>(),
        vec![child]
    );
    // An operator's task has no parent.
    let top = fx.submit("");
    assert_eq!(fx.state.lineage().parent(top), None);
    // Workers and profile agents do not submit; an ended task has no agent to speak for it.
    for s in [
        Subject::Worker(worker()),
        Subject::Agent(AgentIdentity::ProfileGeneration {
            profile: crate::ids::ProfileId::new(1).unwrap(),
            generation: crate::ids::Generation::new(1),
        }),
        Subject::Agent(AgentIdentity::Task(TaskId::new(999).unwrap())),
    ] {
        let r = fx.rejected_as(&s, submit());
        assert!(
            matches!(r.code(), ErrorCode::PermissionDenied | ErrorCode::NotFound),
            "{s}: {r}"
        );
    }
    fx.ok(Command::CancelTask(CancelTask {
        task: parent,
        reason: "done".into(),
    }));
    assert_eq!(fx.state.task(parent).unwrap().state, TaskState::Cancelled);
    let r = fx.rejected_as(&agent, submit());
    assert_eq!(r.code(), ErrorCode::PermissionDenied);
}

#[test]
fn the_audit_records_who_applied_what_and_stays_bounded() {
    let (mut fx, admin) = fx_with_admin();
    fx.ok_as(&admin, create_token(2, Role::Viewer, vec![]));
    fx.ok_as(
        &Subject::Worker(worker()),
        Command::WorkerHeartbeat(WorkerHeartbeat { worker: worker() }),
    );
    // A refusal changes nothing, the audit included (checked by `rejected_as`).
    fx.rejected_as(
        &Subject::Operator(tid(2)),
        create_token(3, Role::Viewer, vec![]),
    );
    let records: Vec<_> = fx.state.audit().after(0, usize::MAX).cloned().collect();
    let last = records.last().unwrap();
    assert_eq!(last.subject, admin);
    assert_eq!(last.command, "create_operator_token");
    assert_eq!(last.target, format!("token {}", tid(2)));
    assert!(
        records.iter().all(|r| r.command != "worker_heartbeat"),
        "routine commands stay out"
    );
    for _ in 0..AUDIT_RECORDS_KEPT + 5 {
        fx.ok_as(
            &admin,
            Command::RevokeOperatorToken(RevokeOperatorToken { id: tid(2) }),
        );
    }
    assert_eq!(fx.state.audit().len(), AUDIT_RECORDS_KEPT);
    let first = fx.state.audit().after(0, 1).next().unwrap().seq;
    assert!(first > 5, "the oldest were pruned");
}

#[test]
fn an_idempotency_key_is_bound_to_its_subject() {
    let mut fx = Fx::new();
    let key = IdempotencyKey::new("k-1").unwrap();
    let apply = |fx: &mut Fx, subject: Subject| {
        fx.state.apply(CommandEnvelope {
            at_ms: fx.now,
            idempotency_key: Some(key.clone()),
            subject,
            command: Command::WorkerHeartbeat(WorkerHeartbeat { worker: worker() }),
        })
    };
    assert!(apply(&mut fx, Subject::Worker(worker())).is_ok());
    assert!(
        apply(&mut fx, Subject::Worker(worker())).is_ok(),
        "a retry replays"
    );
    assert_eq!(
        apply(&mut fx, Subject::Worker(w("w2"))),
        Response::Rejected(Rejection::IdempotencyKeyReused)
    );
}

#[test]
fn a_version_1_snapshot_decodes_with_an_empty_trust_state() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    fx.acquire(p);
    fx.submit("");
    // What a version-1 build held: no trust records (this build audits even legacy commands).
    fx.state.access = crate::access::AccessState::default();
    let state = fx.state.clone();
    let v6 = encode_snapshot(&state);
    // Version 1 was this state without the ten trailing parts; empty, they take 24 bytes
    // (four empty maps, an empty audit of two zero counters, two empty lineage maps, the
    // credentials' three empty maps and first lease id, the empty map of policies, the
    // empty map of agent sessions, the empty map of task leases, the profile credentials'
    // three empty maps, the empty map of egress bindings, the pruned tasks' zero count and
    // three empty maps, and the empty map of providers' progress).
    let mut v1 = v6[..v6.len() - 24].to_vec();
    v1[8..12].copy_from_slice(&1u32.to_be_bytes());
    let decoded = decode_snapshot(&v1).expect("version 1 decodes");
    assert_eq!(decoded, state);
    // A version-1 log entry (no subject) decodes as a legacy command.
    let entry = encode_command(&CommandEnvelope {
        at_ms: 5,
        idempotency_key: None,
        subject: Subject::Legacy,
        command: Command::Sweep,
    });
    assert_eq!(entry[0], 2);
}

#[test]
fn an_operators_agent_request_is_audited_and_changes_nothing_else() {
    let (mut fx, admin) = fx_with_admin();
    let profile = fx.profile("agent-a");
    let ask = |operation| {
        Command::RequestAgentOperation(RequestAgentOperation {
            profile,
            operation,
            worker: worker(),
        })
    };
    let before = fx.state.clone();
    assert_eq!(
        fx.ok_as(&admin, ask(AgentOperation::Takeover)),
        Outcome::AgentOperationRequested
    );
    let last = fx
        .state
        .audit()
        .after(0, usize::MAX)
        .last()
        .cloned()
        .unwrap();
    assert_eq!(last.subject, admin);
    assert_eq!(last.command, "request_agent_operation");
    assert_eq!(
        last.target,
        format!("profile {profile}: takeover on worker {}", worker())
    );
    // Only the audit moved: the profile, its leases and the rest are as they were.
    assert_eq!(fx.state.profile(profile), before.profile(profile));
    assert_eq!(fx.state.leases().count(), before.leases().count());
    // The worker's and the agent's own acts are theirs; a profile that does not exist is
    // refused (and `rejected_as` checks that nothing changed).
    let r = fx.rejected_as(&Subject::Worker(worker()), ask(AgentOperation::Launch));
    assert_eq!(r.code(), ErrorCode::PermissionDenied);
    let agent = Subject::Agent(AgentIdentity::Task(TaskId::new(1).unwrap()));
    let r = fx.rejected_as(&agent, ask(AgentOperation::Stop));
    assert_eq!(r.code(), ErrorCode::PermissionDenied);
    let missing = Command::RequestAgentOperation(RequestAgentOperation {
        profile: crate::ids::ProfileId::new(999).unwrap(),
        operation: AgentOperation::Reap,
        worker: worker(),
    });
    assert_eq!(fx.rejected_as(&admin, missing).code(), ErrorCode::NotFound);
}
