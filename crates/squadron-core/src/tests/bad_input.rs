//! Every validated field of every command: refused with the field named, state unchanged.

use super::*;
use crate::command::{Assignment, TransitionDetail};
use crate::ids::{McpServerId, SkillId};
use crate::limits::*;
use crate::mailbox::{MessageKind, MessageSender};
use crate::task::TaskState;

#[track_caller]
fn refused_naming(fx: &mut Fx, command: Command, field: &str) {
    let name = command.name();
    match fx.rejected(command) {
        Rejection::Invalid(e) => assert_eq!(e.field, field, "{name}: {e}"),
        other => panic!("{name}: expected invalid {field}, got {other:?}"),
    }
}

#[test]
fn project_and_profile_fields() {
    let mut fx = Fx::new();
    let other = ProjectId::new("other").unwrap();
    for (max_profiles, max_active, field) in [
        (Some(0), None, "max_profiles"),
        (Some(PROFILES_PER_PROJECT_MAX + 1), None, "max_profiles"),
        (None, Some(0), "max_active"),
        (None, Some(ACTIVE_LEASES_PER_PROJECT_MAX + 1), "max_active"),
    ] {
        refused_naming(
            &mut fx,
            Command::CreateProject(CreateProject {
                tenant: tenant(),
                project: other.clone(),
                max_profiles,
                max_active,
            }),
            field,
        );
    }
    for (providers, context_ref) in [
        (vec![], None),
        (vec![Provider::Codex, Provider::Codex], None),
        (
            vec![
                Provider::Codex,
                Provider::Claude,
                Provider::Script,
                Provider::Codex,
                Provider::Claude,
            ],
            None,
        ),
    ] {
        refused_naming(
            &mut fx,
            Command::CreateProfile(CreateProfile {
                tenant: tenant(),
                project: project(),
                key: ProfileKey::new("k").unwrap(),
                providers,
                context_ref,
            }),
            "providers",
        );
    }
    refused_naming(
        &mut fx,
        Command::CreateProfile(CreateProfile {
            tenant: tenant(),
            project: project(),
            key: ProfileKey::new("k").unwrap(),
            providers: vec![Provider::Codex],
            context_ref: Some("x".repeat(DESCRIPTOR_BYTES_MAX + 1)),
        }),
        "context_ref",
    );
    refused_naming(
        &mut fx,
        Command::AttachSandbox(AttachSandbox {
            tenant: tenant(),
            project: other,
            worker: worker(),
            runtime: RuntimeKind::Process,
            sandbox_ref: String::new(),
        }),
        "sandbox_ref",
    );
    let p = fx.profile("a");
    let many_skills: Vec<SkillId> = (0..=CAPABILITY_ENTRIES_MAX)
        .map(|i| SkillId::new(format!("s{i}")).unwrap())
        .collect();
    refused_naming(
        &mut fx,
        Command::SetCapabilityManifest(SetCapabilityManifest {
            profile: p,
            expected_version: 0,
            required_skills: many_skills,
            mcp_servers: vec![],
        }),
        "required_skills",
    );
    let r = fx.rejected(Command::SetCapabilityManifest(SetCapabilityManifest {
        profile: p,
        expected_version: 3,
        required_skills: vec![],
        mcp_servers: vec![McpServerId::new("github").unwrap()],
    }));
    assert_eq!(
        r,
        Rejection::ManifestVersionConflict {
            expected: 3,
            current: 0
        }
    );
    assert_eq!(
        fx.ok(Command::SetCapabilityManifest(SetCapabilityManifest {
            profile: p,
            expected_version: 0,
            required_skills: vec![SkillId::new("rust").unwrap()],
            mcp_servers: vec![McpServerId::new("github").unwrap()],
        })),
        Outcome::CapabilityManifestSet { version: 1 }
    );
}

#[test]
fn lease_fields() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    for ttl in [0, LEASE_TTL_MS_MIN - 1, LEASE_TTL_MS_MAX + 1] {
        refused_naming(
            &mut fx,
            Command::AcquireLease(AcquireLease {
                profile: p,
                expected_generation: Generation::ZERO,
                provider: Provider::Codex,
                holder: holder(),
                ttl_ms: ttl,
            }),
            "ttl_ms",
        );
    }
    let mut long_process = holder();
    long_process.process = "x".repeat(DESCRIPTOR_BYTES_MAX + 1);
    let mut control = holder();
    control.process = "pid\n1".into();
    let mut empty_cgroup = holder();
    empty_cgroup.cgroup = Some(String::new());
    for (h, field) in [
        (long_process, "holder.process"),
        (control, "holder.process"),
        (empty_cgroup, "holder.cgroup"),
    ] {
        refused_naming(
            &mut fx,
            Command::AcquireLease(AcquireLease {
                profile: p,
                expected_generation: Generation::ZERO,
                provider: Provider::Codex,
                holder: h,
                ttl_ms: TTL,
            }),
            field,
        );
    }
    let r = fx.rejected(Command::AcquireLease(AcquireLease {
        profile: p,
        expected_generation: Generation::ZERO,
        provider: Provider::Script,
        holder: holder(),
        ttl_ms: TTL,
    }));
    assert!(matches!(r, Rejection::ProviderNotAllowed { .. }));
    let g = fx.acquire(p);
    refused_naming(
        &mut fx,
        Command::RenewLease(RenewLease {
            fence: token(&g),
            ttl_ms: LEASE_TTL_MS_MAX + 1,
        }),
        "ttl_ms",
    );
    refused_naming(
        &mut fx,
        Command::RenewLeases(RenewLeases {
            worker: worker(),
            fences: vec![],
            ttl_ms: TTL,
        }),
        "fences",
    );
    refused_naming(
        &mut fx,
        Command::FenceLease(FenceLease {
            fence: token(&g),
            reason: crate::lease::FenceReason::Takeover,
        }),
        "reason",
    );
    fx.advance(TTL);
    let mut ev = evidence(&g, fx.now);
    ev.cgroup = String::new();
    refused_naming(
        &mut fx,
        Command::RecordReapEvidence(RecordReapEvidence {
            profile: p,
            evidence: ev,
        }),
        "evidence.cgroup",
    );
    // Unknown ids are not-found, not invalid.
    let ghost = ProfileId::new(999).unwrap();
    assert!(matches!(
        fx.rejected(fx.acquire_cmd(ghost, 0)),
        Rejection::NotFound { .. }
    ));
}

#[test]
fn capsule_and_mailbox_fields() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    let mut big = draft(1, None, "x");
    big.payload.pending_work = vec![String::new(); CAPSULE_LIST_ITEMS_MAX + 1];
    refused_naming(
        &mut fx,
        Command::CommitCapsule(CommitCapsule {
            fence: token(&g),
            capsule: big,
        }),
        "capsule.payload.pending_work",
    );
    let mut zero = draft(1, None, "x");
    zero.sequence = 0;
    refused_naming(
        &mut fx,
        Command::CommitCapsule(CommitCapsule {
            fence: token(&g),
            capsule: zero,
        }),
        "capsule.sequence",
    );
    refused_naming(
        &mut fx,
        Command::PostMessage(PostMessage {
            to: p,
            sender: MessageSender::Operator("alice".into()),
            kind: MessageKind::Note,
            body: "x".repeat(MESSAGE_BODY_BYTES_MAX + 1),
        }),
        "body",
    );
    refused_naming(
        &mut fx,
        Command::PostMessage(PostMessage {
            to: p,
            sender: MessageSender::Operator(String::new()),
            kind: MessageKind::Note,
            body: "hello".into(),
        }),
        "sender.operator",
    );
    refused_naming(
        &mut fx,
        Command::PostMessage(PostMessage {
            to: p,
            sender: MessageSender::System,
            kind: MessageKind::Note,
            body: "hello".into(),
        }),
        "sender",
    );
}

#[test]
fn task_and_worker_fields() {
    let mut fx = Fx::new();
    let register = |address: &str, runtimes: Vec<RuntimeKind>, capacity, interval, labels| {
        Command::RegisterWorker(RegisterWorker {
            worker: WorkerId::new("w9").unwrap(),
            address: address.into(),
            runtimes,
            capacity,
            labels,
            heartbeat_interval_ms: interval,
        })
    };
    let rt = || vec![RuntimeKind::Process];
    let bad_label = std::collections::BTreeMap::from([("bad key".to_string(), "v".to_string())]);
    let too_many: std::collections::BTreeMap<String, String> = (0..=LABELS_MAX)
        .map(|i| (format!("k{i}"), "v".into()))
        .collect();
    for (cmd, field) in [
        (register("", rt(), 1, 1_000, Default::default()), "address"),
        (
            register("a", vec![], 1, 1_000, Default::default()),
            "runtimes",
        ),
        (
            register("a", rt(), 0, 1_000, Default::default()),
            "capacity",
        ),
        (
            register(
                "a",
                rt(),
                WORKER_CAPACITY_MAX + 1,
                1_000,
                Default::default(),
            ),
            "capacity",
        ),
        (
            register("a", rt(), 1, 1, Default::default()),
            "heartbeat_interval_ms",
        ),
        (register("a", rt(), 1, 1_000, bad_label), "labels.bad key"),
        (register("a", rt(), 1, 1_000, too_many), "labels"),
    ] {
        refused_naming(&mut fx, cmd, field);
    }
    refused_naming(
        &mut fx,
        Command::AssignTasks(AssignTasks {
            assignments: vec![],
        }),
        "assignments",
    );
    let t = fx.submit("");
    fx.ok(Command::AssignTasks(AssignTasks {
        assignments: vec![Assignment {
            task: t,
            worker: worker(),
        }],
    }));
    let transition = |detail: TransitionDetail| {
        Command::ReportTransition(ReportTransition {
            task: t,
            worker: worker(),
            attempt: 1,
            from: TaskState::Staging,
            to: TaskState::Provisioning,
            detail,
        })
    };
    for (detail, field) in [
        (
            TransitionDetail {
                error: Some("e".repeat(TASK_ERROR_BYTES_MAX + 1)),
                ..Default::default()
            },
            "detail.error",
        ),
        (
            TransitionDetail {
                artifacts: vec!["../etc/passwd".into()],
                ..Default::default()
            },
            "detail.artifacts[0]",
        ),
        (
            TransitionDetail {
                artifacts: vec!["ok.txt".into(), "/abs".into()],
                ..Default::default()
            },
            "detail.artifacts[1]",
        ),
    ] {
        refused_naming(&mut fx, transition(detail), field);
    }
    let counts = |stdout_bytes| ReportProgress {
        task: t,
        worker: worker(),
        attempt: 1,
        stdout_bytes,
        stderr_bytes: 0,
        lines: 0,
        events: 0,
    };
    let progress = |stdout_bytes| Command::ReportProgress(counts(stdout_bytes));
    fx.ok(progress(100));
    refused_naming(&mut fx, progress(99), "stdout_bytes");
    let v2 = |stdout_bytes, tool: &str| {
        Command::ReportProgressV2(crate::command::ReportProgressV2 {
            counts: counts(stdout_bytes),
            provider: Some(crate::task::ProviderProgress {
                tool_calls: 2,
                current_tool: Some(tool.into()),
                ..Default::default()
            }),
        })
    };
    let long = "x".repeat(crate::task::PROVIDER_NAME_BYTES_MAX + 1);
    for (command, field) in [
        (v2(200, "a\nb"), "provider.current_tool"),
        (v2(200, &long), "provider.current_tool"),
        (v2(200, ""), "provider.current_tool"),
        (v2(99, "Bash"), "stdout_bytes"),
    ] {
        refused_naming(&mut fx, command, field);
    }
    assert!(fx.state.provider_progress(t).is_none(), "nothing recorded");
    fx.ok(v2(200, "Bash"));
    let p = fx.state.provider_progress(t).expect("recorded");
    assert_eq!(
        (
            p.attempt,
            p.progress.tool_calls,
            p.progress.current_tool.as_deref()
        ),
        (1, 2, Some("Bash"))
    );
    assert_eq!(fx.state.task(t).unwrap().progress.stdout_bytes, 200);
    // The checker refuses progress of a task or an attempt that never was.
    let mut broken = fx.state.clone();
    let p = broken.provider_progress.remove(&t).unwrap();
    broken
        .provider_progress
        .insert(crate::ids::TaskId::new(t.get() + 1_000).unwrap(), p.clone());
    assert!(broken
        .check_invariants()
        .unwrap_err()
        .contains("unknown task"));
    let mut broken = fx.state.clone();
    broken.provider_progress.get_mut(&t).unwrap().attempt = 2;
    assert!(broken.check_invariants().unwrap_err().contains("attempt 2"));
    refused_naming(
        &mut fx,
        Command::CancelTask(CancelTask {
            task: t,
            reason: "x".repeat(REASON_BYTES_MAX + 1),
        }),
        "reason",
    );
    for (operator, reason, field) in [("", "r", "operator"), ("alice", " ", "reason")] {
        refused_naming(
            &mut fx,
            Command::DecommissionWorker(DecommissionWorker {
                worker: worker(),
                operator: operator.into(),
                reason: reason.into(),
            }),
            field,
        );
    }
}

#[test]
fn id_constructors_name_their_field() {
    use crate::ids::*;
    let cases: Vec<(Result<(), crate::ValidationError>, &str)> = vec![
        (TenantId::new("").map(drop), "tenant"),
        (TenantId::new("Acme").map(drop), "tenant"),
        (ProjectId::new("-web").map(drop), "project"),
        (ProjectId::new("a/b").map(drop), "project"),
        (ProfileKey::new("a..b").map(drop), "profile_key"),
        (ProfileKey::new("x".repeat(64)).map(drop), "profile_key"),
        (WorkerId::new("w 1").map(drop), "worker"),
        (CredentialId::new("cred$").map(drop), "credential_id"),
        (McpServerId::new("").map(drop), "mcp_server"),
        (SkillId::new("UPPER").map(drop), "skill"),
        (ProfileId::new(0).map(drop), "profile_id"),
        (LeaseId::new(0).map(drop), "lease_id"),
        (TaskId::new(0).map(drop), "task_id"),
        ("x".parse::<TaskId>().map(drop), "task_id"),
        ("-1".parse::<Generation>().map(drop), "generation"),
        (Digest::parse("digest", "abc").map(drop), "digest"),
        (Digest::parse("digest", &"G".repeat(64)).map(drop), "digest"),
        (IdempotencyKey::new("").map(drop), "idempotency_key"),
        (
            IdempotencyKey::new("has space").map(drop),
            "idempotency_key",
        ),
        (
            IdempotencyKey::new("k".repeat(IDEMPOTENCY_KEY_BYTES_MAX + 1)).map(drop),
            "idempotency_key",
        ),
        ("gpt".parse::<Provider>().map(drop), "provider"),
    ];
    for (i, (result, field)) in cases.into_iter().enumerate() {
        let err = result.expect_err(&format!("case {i} accepted"));
        assert_eq!(err.field, field, "case {i}: {err}");
    }
    assert!(TenantId::new("acme-1.prod_x").is_ok());
    assert_eq!(
        Digest::parse("d", &"ab".repeat(32)).unwrap().to_hex(),
        "ab".repeat(32)
    );
}

#[test]
fn ids_are_validated_when_decoded_from_the_log_too() {
    use crate::codec::{decode_versioned, encode_versioned};
    let zero = encode_versioned(1, &0u64);
    assert!(decode_versioned::<ProfileId>(1, &zero).is_err());
    let bad_name = encode_versioned(1, &"Not A Name".to_string());
    assert!(decode_versioned::<TenantId>(1, &bad_name).is_err());
    let good = encode_versioned(1, &"acme".to_string());
    assert_eq!(decode_versioned::<TenantId>(1, &good).unwrap(), tenant());
}
