//! Task properties: the lifecycle through submission, assignment, reports and cancellation
//! (INV-10).

use crate::*;
use squadron_core::access::Subject;

const TASKS: Mix = Mix {
    acquire: 2,
    renew: 0,
    release: 1,
    fence: 0,
    reap: 0,
    graceful: 0,
    crash: 0,
    commit: 0,
    sweep: 2,
    submit: 8,
    assign: 10,
    report: 22,
    cancel: 3,
    check_in: 6,
    keyed: 10,
    max_len: 80,
    dt_max: 3_000,
};

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The task lifecycle (INV-10): submission, assignment, worker reports, cancellation.
    #[test]
    fn inv_10_task_lifecycle_agrees_with_model(u in universe(), s in steps(TASKS)) {
        run(&u, &s, Checks::default());
    }
}

/// INV-10, found by the model test: a worker reports COMPLETING -> COMPLETED with an exit code
/// other than the success code it recorded on leaving RUNNING. The report must be refused, or
/// the task must still end with a success exit code; a COMPLETED task with exit code 1 breaks
/// the invariant `check_invariants` enforces.
#[test]
fn inv_10_completed_task_keeps_a_success_exit_code() {
    let mut s = State::new();
    let mut apply = |command: Command| {
        s.apply(CommandEnvelope {
            subject: Subject::Legacy,
            at_ms: SETUP_AT_MS,
            idempotency_key: None,
            command,
        })
    };
    let w = worker_id(0);
    assert!(apply(Command::RegisterWorker(RegisterWorker {
        worker: w.clone(),
        address: "10.0.0.0:7000".into(),
        runtimes: vec![RuntimeKind::Process],
        capacity: WORKER_CAPACITY,
        labels: BTreeMap::new(),
        heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS,
    }))
    .is_ok());
    assert!(apply(Command::SubmitTask(SubmitTask {
        spec: Box::new(specs()[0].clone()),
    }))
    .is_ok());
    assert!(apply(Command::AssignTasks(AssignTasks {
        assignments: vec![Assignment {
            task: task_id(0),
            worker: w.clone(),
        }],
    }))
    .is_ok());
    let mut report = |from, to, exit_code| {
        apply(Command::ReportTransition(ReportTransition {
            task: task_id(0),
            worker: w.clone(),
            attempt: 1,
            from,
            to,
            detail: TransitionDetail {
                exit_code,
                error: None,
                artifacts: Vec::new(),
            },
        }))
    };
    use TaskState::*;
    for (from, to, exit) in [
        (Staging, Provisioning, None),
        (Provisioning, Ready, None),
        (Ready, Running, None),
        (Running, Completing, Some(0)),
    ] {
        assert!(report(from, to, exit).is_ok(), "{from} -> {to}");
    }
    let last = report(Completing, Completed, Some(1));
    let task = s.task(task_id(0)).expect("task");
    assert!(
        !last.is_ok() || task.exit_code == Some(0),
        "INV-10: COMPLETED accepted with exit code {:?}: {last:?}",
        task.exit_code
    );
    assert_eq!(s.check_invariants(), Ok(()));
}
