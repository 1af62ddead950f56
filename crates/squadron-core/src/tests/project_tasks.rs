//! `placement: project` tasks run under their profile's lease: INV-4 (one writer) and INV-5
//! (capacity) hold for them as for agents, and a task waits PENDING rather than be a fifth.

use super::*;
use crate::lease::LeaseState;
use crate::scheduler::schedule;
use crate::snapshot::{decode_snapshot, encode_snapshot};
use crate::task::TaskState::{self, *};

fn project_task(fx: &mut Fx, profile: &str) -> TaskId {
    fx.submit(&format!(
        "placement:\n  kind: project\n  tenant: acme\n  project: web\n  profile: {profile}\n"
    ))
}

/// One scheduling pass, proposed and applied as the leader does; the tasks it placed.
fn place(fx: &mut Fx) -> Vec<TaskId> {
    let plan = schedule(&fx.state, fx.now, 64);
    assert!(plan.dedicated.is_empty(), "{plan:?}");
    if plan.project.is_empty() {
        return Vec::new();
    }
    let Outcome::TasksAssigned { results } = fx.ok(Command::AssignProjectTasks(AssignTasks {
        assignments: plan.project,
    })) else {
        panic!()
    };
    results
        .into_iter()
        .filter(|r| r.result.is_ok())
        .map(|r| r.task)
        .collect()
}

fn walk(fx: &mut Fx, task: TaskId, path: &[TaskState]) {
    for pair in path.windows(2) {
        let exit = (pair[1] == Completing).then_some(0);
        let r = report(fx, task, pair[0], pair[1], exit);
        assert!(r.is_ok(), "{} -> {}: {r:?}", pair[0], pair[1]);
    }
}

fn lease_of(fx: &Fx, task: TaskId) -> crate::lease::RuntimeLease {
    let id = fx.state.task_lease(task).expect("the task holds a lease");
    fx.state.lease(id).expect("the lease exists").clone()
}

#[test]
fn inv_5_a_fifth_project_task_waits_pending_until_a_slot_frees() {
    let mut fx = Fx::new();
    // Capacity 2 on the worker would hide the project's cap: give it room.
    fx.ok(Command::RegisterWorker(RegisterWorker {
        worker: worker(),
        address: "127.0.0.1:9000".into(),
        runtimes: vec![RuntimeKind::Process],
        capacity: 16,
        labels: BTreeMap::new(),
        heartbeat_interval_ms: WORKER_TTL / 3,
    }));
    let keys = ["a", "b", "c", "d", "e"];
    for k in keys {
        fx.profile(k);
    }
    let tasks: Vec<TaskId> = keys.iter().map(|k| project_task(&mut fx, k)).collect();

    let placed = place(&mut fx);
    assert_eq!(placed, tasks[..4].to_vec(), "four slots, four tasks");
    assert_eq!(fx.slots_held(), 4);
    assert_eq!(fx.state.task(tasks[4]).unwrap().state, Pending);
    assert!(
        place(&mut fx).is_empty(),
        "at capacity nothing more is proposed"
    );
    // Asked directly, apply refuses it too and leaves it PENDING.
    let Outcome::TasksAssigned { results } = fx.ok(Command::AssignProjectTasks(AssignTasks {
        assignments: vec![Assignment {
            task: tasks[4],
            worker: worker(),
        }],
    })) else {
        panic!()
    };
    assert!(
        matches!(
            results[0].result,
            Err(Rejection::CapacityFull { held: 4, max: 4 })
        ),
        "{results:?}"
    );
    assert_eq!(fx.state.task(tasks[4]).unwrap().state, Pending);

    // Each placed task runs under its own profile's next generation, held by the worker.
    for t in &tasks[..4] {
        let lease = lease_of(&fx, *t);
        assert_eq!(lease.state, LeaseState::Active);
        assert_eq!(lease.holder.worker, worker());
        assert_eq!(lease.holder.process, format!("task {t} attempt 1"));
        assert_eq!(lease.generation, Generation::new(1));
        assert_eq!(lease.provider, Provider::Claude);
    }

    // The first ends: its lease is released and the fifth goes.
    let first = lease_of(&fx, tasks[0]).id;
    walk(
        &mut fx,
        tasks[0],
        &[Staging, Provisioning, Ready, Running, Completing, Completed],
    );
    assert!(matches!(
        fx.state.lease(first).unwrap().state,
        LeaseState::Released { .. }
    ));
    assert_eq!(fx.state.task_lease(tasks[0]), None);
    assert_eq!(fx.slots_held(), 3);
    assert_eq!(place(&mut fx), vec![tasks[4]]);
    assert_eq!(fx.slots_held(), 4);
    let peak = fx
        .state
        .project(&tenant(), &project())
        .unwrap()
        .stats
        .peak_slots_held;
    assert_eq!(peak, 4);
}

#[test]
fn inv_4_a_project_task_waits_while_its_profile_has_a_writer() {
    let mut fx = Fx::new();
    let a = fx.profile("a");
    let agent = fx.acquire(a);
    let t = project_task(&mut fx, "a");
    assert!(place(&mut fx).is_empty(), "the profile is held by an agent");
    let Outcome::TasksAssigned { results } = fx.ok(Command::AssignProjectTasks(AssignTasks {
        assignments: vec![Assignment {
            task: t,
            worker: worker(),
        }],
    })) else {
        panic!()
    };
    assert!(
        matches!(results[0].result, Err(Rejection::ProfileBusy { .. })),
        "{results:?}"
    );
    assert_eq!(fx.state.task(t).unwrap().state, Pending);

    // Once the agent releases, the task gets the next generation.
    fx.ok(Command::ReleaseLease(ReleaseLease {
        fence: token(&agent),
    }));
    assert_eq!(place(&mut fx), vec![t]);
    assert_eq!(lease_of(&fx, t).generation, Generation::new(2));
    // And while the task holds it, an agent's acquire is refused: one writer.
    let r = fx.rejected(fx.acquire_cmd(a, 2));
    assert!(matches!(r, Rejection::ProfileBusy { .. }), "{r:?}");
}

#[test]
fn heartbeats_renew_a_task_lease_and_silence_fences_it_holding_the_slot() {
    let mut fx = Fx::new();
    fx.profile("a");
    let t = project_task(&mut fx, "a");
    assert_eq!(place(&mut fx), vec![t]);
    let lease = lease_of(&fx, t);
    assert_eq!(lease.ttl_ms, WORKER_TTL, "three heartbeats of the worker");
    for _ in 0..4 {
        fx.advance(WORKER_TTL / 3);
        fx.ok(Command::WorkerHeartbeat(WorkerHeartbeat {
            worker: worker(),
        }));
        fx.ok(Command::Sweep);
    }
    let renewed = lease_of(&fx, t);
    assert_eq!(renewed.state, LeaseState::Active);
    assert_eq!(renewed.expires_at_ms, fx.now + WORKER_TTL);

    // The worker falls silent: the lease is fenced, the task goes back to the queue, and the
    // slot stays held: the provider may still run on the silent worker.
    fx.advance(WORKER_TTL + 1);
    fx.ok(Command::Sweep);
    let task = fx.state.task(t).unwrap();
    assert_eq!((task.state, task.attempt), (Pending, 2));
    assert_eq!(fx.state.task_lease(t), None);
    assert!(matches!(
        fx.state.lease(lease.id).unwrap().state,
        LeaseState::Fenced { .. }
    ));
    assert_eq!(fx.slots_held(), 1);
    fx.register_worker(worker());
    assert!(
        place(&mut fx).is_empty(),
        "no second generation without the first's reap evidence"
    );

    // Reap evidence for that generation frees the profile, and the second attempt runs.
    let evidence = crate::lease::ReapEvidence {
        lease: lease.id,
        generation: lease.generation,
        cgroup: "/sys/fs/cgroup/squadron/task-1".into(),
        populated: false,
        observed_at_ms: fx.now,
        source: EvidenceSource::CgroupEvents,
    };
    fx.ok(Command::RecordReapEvidence(RecordReapEvidence {
        profile: lease.profile,
        evidence,
    }));
    assert_eq!(fx.slots_held(), 0);
    assert_eq!(place(&mut fx), vec![t]);
    assert_eq!(
        lease_of(&fx, t).holder.process,
        format!("task {t} attempt 2")
    );
}

#[test]
fn a_failed_or_cancelled_project_task_frees_its_slot() {
    let mut fx = Fx::new();
    fx.profile("a");
    fx.profile("b");
    let failing = project_task(&mut fx, "a");
    let cancelled = project_task(&mut fx, "b");
    assert_eq!(place(&mut fx), vec![failing, cancelled]);
    assert_eq!(fx.slots_held(), 2);
    walk(&mut fx, failing, &[Staging, Provisioning, Failed]);
    fx.ok(Command::CancelTask(CancelTask {
        task: cancelled,
        reason: "not needed".into(),
    }));
    walk(&mut fx, cancelled, &[Staging, Cancelled]);
    assert_eq!(fx.slots_held(), 0);
    for t in [failing, cancelled] {
        assert_eq!(fx.state.task_lease(t), None);
    }
}

#[test]
fn a_project_task_whose_provider_the_profile_refuses_fails_instead_of_waiting() {
    let mut fx = Fx::new();
    fx.profile_with("codex-only", vec![Provider::Codex]);
    let t = project_task(&mut fx, "codex-only");
    assert!(place(&mut fx).is_empty());
    let task = fx.state.task(t).unwrap();
    assert_eq!(task.state, Failed);
    let error = task.error.clone().unwrap_or_default();
    assert!(error.contains("claude"), "{error}");
    assert_eq!(fx.slots_held(), 0);
    assert!(fx.state.pending_queue().next().is_none());
}

#[test]
fn assign_project_tasks_leaves_dedicated_tasks_alone_and_assign_tasks_keeps_its_meaning() {
    let mut fx = Fx::new();
    fx.profile("a");
    let dedicated = fx.submit("");
    let Outcome::TasksAssigned { results } = fx.ok(Command::AssignProjectTasks(AssignTasks {
        assignments: vec![Assignment {
            task: dedicated,
            worker: worker(),
        }],
    })) else {
        panic!()
    };
    assert!(results[0].result.is_err());
    assert_eq!(fx.state.task(dedicated).unwrap().state, Pending);

    // What an earlier build's leader proposed still applies as it did: no lease.
    let t = project_task(&mut fx, "a");
    let Outcome::TasksAssigned { results } = fx.ok(Command::AssignTasks(AssignTasks {
        assignments: vec![Assignment {
            task: t,
            worker: worker(),
        }],
    })) else {
        panic!()
    };
    assert_eq!(results[0].result, Ok(()));
    assert_eq!(fx.state.task_lease(t), None);
    assert_eq!(fx.slots_held(), 0);
}

#[test]
fn task_leases_survive_a_snapshot() {
    let mut fx = Fx::new();
    fx.profile("a");
    let t = project_task(&mut fx, "a");
    assert_eq!(place(&mut fx), vec![t]);
    let decoded = decode_snapshot(&encode_snapshot(&fx.state)).expect("decodes");
    assert_eq!(decoded, fx.state);
    assert_eq!(decoded.task_lease(t), fx.state.task_lease(t));
}
