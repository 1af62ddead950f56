//! INV-10 lifecycle, INV-11 idempotency, INV-13 secrets, INV-14 authorization.

use super::*;
use crate::command::{Assignment, TransitionDetail};
use crate::limits::{IDEMPOTENCY_RETENTION_MS, TASK_ATTEMPTS_MAX};
use crate::task::TaskState::{self, *};

fn assign(fx: &mut Fx, task: TaskId) {
    let Outcome::TasksAssigned { results } = fx.ok(Command::AssignTasks(AssignTasks {
        assignments: vec![Assignment {
            task,
            worker: worker(),
        }],
    })) else {
        panic!()
    };
    assert_eq!(results[0].result, Ok(()), "{results:?}");
}

fn walk(fx: &mut Fx, task: TaskId, path: &[TaskState]) {
    for pair in path.windows(2) {
        let exit = (pair[1] == Completing).then_some(0);
        let r = report(fx, task, pair[0], pair[1], exit);
        assert!(r.is_ok(), "{} -> {}: {r:?}", pair[0], pair[1]);
    }
}

#[test]
fn inv_10_happy_path_records_each_state_with_its_time() {
    let mut fx = Fx::new();
    let t = fx.submit("");
    assign(&mut fx, t);
    walk(
        &mut fx,
        t,
        &[Staging, Provisioning, Ready, Running, Completing, Completed],
    );
    let task = fx.state.task(t).unwrap();
    assert_eq!(task.state, Completed);
    assert_eq!(task.exit_code, Some(0));
    assert_eq!(task.entered_at_ms.len(), 7);
    assert!(fx.state.worker(&worker()).unwrap().tasks.is_empty());
}

#[test]
fn inv_10_no_skipping_no_going_back_terminal_is_final() {
    let mut fx = Fx::new();
    let t = fx.submit("");
    assign(&mut fx, t);
    let before = fx.state.clone();
    let r = report(&mut fx, t, Staging, Running, None);
    assert!(matches!(
        r.rejection(),
        Some(Rejection::IllegalTransition { .. })
    ));
    walk(&mut fx, t, &[Staging, Provisioning]);
    let r = report(&mut fx, t, Provisioning, Staging, None);
    assert!(matches!(
        r.rejection(),
        Some(Rejection::IllegalTransition { .. })
    ));
    // A report on a state the task has left is stale, whatever it asks for.
    let r = report(&mut fx, t, Staging, Provisioning, None);
    assert!(matches!(
        r.rejection(),
        Some(Rejection::StaleTaskState { .. })
    ));
    walk(&mut fx, t, &[Provisioning, Failed]);
    for to in TaskState::ALL {
        let r = report(&mut fx, t, Failed, to, Some(0));
        assert!(!r.is_ok(), "FAILED -> {to} accepted");
    }
    assert!(matches!(
        fx.apply(Command::CancelTask(CancelTask {
            task: t,
            reason: "late".into()
        }))
        .rejection(),
        Some(Rejection::IllegalTransition { .. })
    ));
    drop(before);
}

#[test]
fn inv_10_completed_needs_a_success_exit_code() {
    let mut fx = Fx::new();
    let t = fx.submit("lifecycle:\n  success_exit_codes: [0, 3]\n");
    assign(&mut fx, t);
    walk(&mut fx, t, &[Staging, Provisioning, Ready, Running]);
    assert!(report(&mut fx, t, Running, Completing, None)
        .rejection()
        .is_some());
    assert!(report(&mut fx, t, Running, Completing, Some(1)).is_ok());
    let r = report(&mut fx, t, Completing, Completed, None);
    assert!(
        matches!(r.rejection(), Some(Rejection::IllegalTransition { reason, .. }) if reason.contains("exit code 1"))
    );
    assert!(report(&mut fx, t, Completing, Failed, None).is_ok());

    let t2 = fx.submit("lifecycle:\n  success_exit_codes: [0, 3]\n");
    assign(&mut fx, t2);
    walk(&mut fx, t2, &[Staging, Provisioning, Ready, Running]);
    assert!(report(&mut fx, t2, Running, Completing, Some(3)).is_ok());
    assert!(report(&mut fx, t2, Completing, Completed, None).is_ok());
}

#[test]
fn inv_10_failed_preserved_only_when_the_manifest_says_preserve() {
    let mut fx = Fx::new();
    let destroy = fx.submit("");
    let preserve = fx.submit("lifecycle:\n  failure_action: preserve\n");
    assign(&mut fx, destroy);
    assign(&mut fx, preserve);
    let r = report(&mut fx, destroy, Staging, FailedPreserved, None);
    assert!(matches!(
        r.rejection(),
        Some(Rejection::IllegalTransition { .. })
    ));
    assert!(report(&mut fx, preserve, Staging, FailedPreserved, None).is_ok());
}

#[test]
fn inv_10_cancel_ends_a_queued_task_and_asks_a_running_one_to_stop() {
    let mut fx = Fx::new();
    let queued = fx.submit("");
    let running = fx.submit("");
    assign(&mut fx, running);
    walk(&mut fx, running, &[Staging, Provisioning, Ready, Running]);
    // A worker may not invent a cancellation.
    let r = report(&mut fx, running, Running, Cancelled, None);
    assert!(matches!(
        r.rejection(),
        Some(Rejection::IllegalTransition { .. })
    ));
    let out = fx.ok(Command::CancelTask(CancelTask {
        task: queued,
        reason: "not needed".into(),
    }));
    assert_eq!(out, Outcome::CancelAccepted { state: Cancelled });
    assert_eq!(fx.state.pending_queue().count(), 0);
    let out = fx.ok(Command::CancelTask(CancelTask {
        task: running,
        reason: "operator".into(),
    }));
    assert_eq!(out, Outcome::CancelAccepted { state: Running });
    assert!(report(&mut fx, running, Running, Cancelled, None).is_ok());
}

#[test]
fn inv_10_reports_from_another_worker_or_a_stale_attempt_are_refused() {
    let mut fx = Fx::new();
    let t = fx.submit("");
    assign(&mut fx, t);
    let w2 = WorkerId::new("w2").unwrap();
    fx.register_worker(w2.clone());
    let r = fx.rejected(Command::ReportTransition(ReportTransition {
        task: t,
        worker: w2,
        attempt: 1,
        from: Staging,
        to: Provisioning,
        detail: TransitionDetail::default(),
    }));
    assert!(matches!(r, Rejection::NotTaskOwner { .. }));
    let r = fx.rejected(Command::ReportTransition(ReportTransition {
        task: t,
        worker: worker(),
        attempt: 2,
        from: Staging,
        to: Provisioning,
        detail: TransitionDetail::default(),
    }));
    assert!(matches!(r, Rejection::NotTaskOwner { .. }));
}

#[test]
fn inv_10_lost_worker_requeues_unstarted_tasks_and_fails_running_ones() {
    let mut fx = Fx::new();
    let staging = fx.submit("");
    let running = fx.submit("");
    assign(&mut fx, staging);
    assign(&mut fx, running);
    walk(&mut fx, running, &[Staging, Provisioning, Ready, Running]);
    fx.advance(WORKER_TTL);
    let Outcome::Swept(report) = fx.ok(Command::Sweep) else {
        panic!()
    };
    assert_eq!(report.workers_lost, vec!["w1".to_string()]);
    assert_eq!(report.tasks_requeued, vec![staging]);
    assert_eq!(report.tasks_failed, vec![running]);
    let t = fx.state.task(staging).unwrap();
    assert_eq!((t.state, t.attempt, t.worker.clone()), (Pending, 2, None));
    assert_eq!(fx.state.task(running).unwrap().state, Failed);
    // The old attempt's late report is refused.
    let r = fx.rejected(Command::ReportTransition(ReportTransition {
        task: staging,
        worker: worker(),
        attempt: 1,
        from: Staging,
        to: Provisioning,
        detail: TransitionDetail::default(),
    }));
    assert!(matches!(r, Rejection::NotTaskOwner { .. }));
}

#[test]
fn inv_10_requeues_are_bounded_by_the_attempt_limit() {
    let mut fx = Fx::new();
    let t = fx.submit("");
    for attempt in 1..=TASK_ATTEMPTS_MAX {
        fx.register_worker(worker());
        assign(&mut fx, t);
        fx.advance(WORKER_TTL);
        fx.ok(Command::Sweep);
        let task = fx.state.task(t).unwrap();
        if attempt < TASK_ATTEMPTS_MAX {
            assert_eq!(task.state, Pending);
        } else {
            assert_eq!(task.state, Failed);
            assert!(task.error.as_deref().unwrap_or("").contains("lost"));
        }
    }
}

#[test]
fn inv_11_keyed_command_is_applied_once_and_retry_gets_first_answer() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let acquire = fx.acquire_cmd(p, 0);
    let first = fx.apply_keyed("k-1", acquire.clone());
    assert!(first.is_ok());
    // Time passes and the lease is released; the retry still gets the first answer and does
    // not acquire a second time.
    let Response::Ok(Outcome::LeaseGranted(g)) = &first else {
        panic!()
    };
    fx.ok(Command::ReleaseLease(ReleaseLease { fence: token(g) }));
    fx.advance(1_000);
    let retry = fx.apply_keyed("k-1", acquire);
    assert_eq!(retry, first);
    assert_eq!(fx.state.profile(p).unwrap().generation, Generation::new(1));
}

#[test]
fn inv_11_a_rejection_is_replayed_too_never_a_blind_cas_retry() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    let stale = fx.acquire_cmd(p, 0);
    let first = fx.apply_keyed("k-2", stale.clone());
    assert!(matches!(
        first.rejection(),
        Some(Rejection::StaleGeneration { .. })
    ));
    fx.ok(Command::ReleaseLease(ReleaseLease { fence: token(&g) }));
    assert_eq!(fx.apply_keyed("k-2", stale), first);
}

#[test]
fn inv_11_key_reused_for_another_command_is_refused() {
    let mut fx = Fx::new();
    let a = fx.profile("a");
    let b = fx.profile("b");
    assert!(fx.apply_keyed("k-3", fx.acquire_cmd(a, 0)).is_ok());
    let r = fx.apply_keyed("k-3", fx.acquire_cmd(b, 0));
    assert_eq!(r, Response::Rejected(Rejection::IdempotencyKeyReused));
    assert_eq!(fx.state.profile(b).unwrap().generation, Generation::ZERO);
}

#[test]
fn inv_11_records_are_pruned_after_retention() {
    let mut fx = Fx::new();
    fx.apply_keyed(
        "old",
        Command::WorkerHeartbeat(WorkerHeartbeat { worker: worker() }),
    );
    assert_eq!(fx.state.idempotency().len(), 1);
    fx.advance(IDEMPOTENCY_RETENTION_MS);
    fx.register_worker(worker());
    let Outcome::Swept(report) = fx.ok(Command::Sweep) else {
        panic!()
    };
    assert_eq!(report.idempotency_pruned, 1);
    assert!(fx.state.idempotency().is_empty());
}

#[test]
fn inv_13_tasks_hold_credential_ids_never_secret_values() {
    let mut fx = Fx::new();
    let t = fx.submit(
        "startup_profile:\n  id: startup-a\n  trigger: on_instance_ready\n  session:\n    launcher: claude\n    workdir: /workspace\n    cols: 120\n    rows: 30\n  credential_refs:\n    - id: cred_anthropic_ci\n      mount: anthropic_api_key\n  observation:\n    retention_class: short\n    redaction_profile: provider-secrets-v1\n",
    );
    let spec = &fx.state.task(t).unwrap().spec;
    let refs = &spec.startup_profile.as_ref().unwrap().credential_refs;
    assert_eq!(refs[0].id.as_str(), "cred_anthropic_ci");
    // A secret in the repository URL never reaches the log.
    let err = crate::manifest::parse_manifest_yaml(
        "version: \"1\"\nkind: Task\nmetadata: {name: t}\nrepository: {url: \"https://bob:hunter2@git.example/r\"}\nagent: {prompt: p}\n",
    )
    .unwrap_err();
    assert_eq!(err.field, "repository.url");
    assert!(!err.reason.contains("hunter2"));
}

#[test]
fn inv_14_mcp_use_needs_the_relation_for_that_exact_profile() {
    let mut fx = Fx::new();
    let a = fx.profile("a");
    let b = fx.profile("b");
    let server = crate::ids::McpServerId::new("github").unwrap();
    assert!(!fx.state.mcp_use_allowed(a, &server));
    fx.ok(Command::GrantMcpUse(GrantMcpUse {
        profile: a,
        server: server.clone(),
    }));
    assert!(fx.state.mcp_use_allowed(a, &server));
    assert!(
        !fx.state.mcp_use_allowed(b, &server),
        "no fallback to a peer's grant"
    );
    let r = fx.rejected(Command::GrantMcpUse(GrantMcpUse {
        profile: a,
        server: server.clone(),
    }));
    assert!(matches!(r, Rejection::AlreadyExists { .. }));
    fx.ok(Command::RevokeMcpUse(RevokeMcpUse {
        profile: a,
        server: server.clone(),
    }));
    assert!(!fx.state.mcp_use_allowed(a, &server));
    assert_eq!(
        Rejection::PermissionDenied {
            reason: String::new()
        }
        .code()
        .http_status(),
        403
    );
}
