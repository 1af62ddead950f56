//! Worker policies: the scheduler places a task only where the worker's policy accepts it;
//! a worker states only its own.

use super::*;
use crate::scheduler::schedule;
use crate::worker_policy::{RepositorySource, WorkerPolicy};

fn set(fx: &mut Fx, worker: WorkerId, policy: WorkerPolicy) -> Response {
    fx.apply_as(
        &Subject::Worker(worker.clone()),
        Command::SetWorkerPolicy(SetWorkerPolicy { worker, policy }),
    )
}

#[test]
fn a_task_goes_only_to_a_worker_whose_policy_accepts_it() {
    let mut fx = Fx::new();
    // The fixture's manifests clone file:///srv/repo: a local repository.
    assert!(set(&mut fx, worker(), WorkerPolicy::default()).is_ok());
    let task = fx.submit("");
    assert!(
        schedule(&fx.state, fx.now, 10).is_empty(),
        "w1 refuses local repositories"
    );
    let Outcome::TasksAssigned { results } = fx.ok(Command::AssignTasks(AssignTasks {
        assignments: vec![crate::command::Assignment {
            task,
            worker: worker(),
        }],
    })) else {
        panic!()
    };
    let refused = format!("{:?}", results[0].result);
    assert!(refused.contains("repository.url"), "{refused}");

    // A second worker that allows them (and one that never sent a policy) may take it.
    let w2 = WorkerId::new("w2").unwrap();
    fx.register_worker(w2.clone());
    let mut local = WorkerPolicy::default();
    local.repository_sources.insert(RepositorySource::Local);
    assert!(set(&mut fx, w2.clone(), local).is_ok());
    let plan = schedule(&fx.state, fx.now, 10).dedicated;
    assert_eq!(plan.len(), 1);
    assert_eq!(plan[0].worker, w2);
    assert_eq!(
        fx.state.worker_policy(&worker()),
        Some(&WorkerPolicy::default())
    );
}

#[test]
fn a_worker_states_only_its_own_policy_and_must_be_registered() {
    let mut fx = Fx::new();
    let r = fx.apply_as(
        &Subject::Worker(WorkerId::new("w9").unwrap()),
        Command::SetWorkerPolicy(SetWorkerPolicy {
            worker: worker(),
            policy: WorkerPolicy::default(),
        }),
    );
    assert!(
        matches!(r, Response::Rejected(Rejection::PermissionDenied { .. })),
        "{r:?}"
    );
    let unknown = WorkerId::new("w9").unwrap();
    let r = set(&mut fx, unknown.clone(), WorkerPolicy::default());
    assert!(
        matches!(r, Response::Rejected(Rejection::NotFound { .. })),
        "{r:?}"
    );
    assert!(fx.state.worker_policy(&unknown).is_none());
}

#[test]
fn a_manifest_no_live_worker_accepts_is_named_with_its_field() {
    use crate::worker_policy::no_worker_accepts;
    let mut fx = Fx::new();
    let local = spec("");
    // No policy yet: w1 is held to nothing.
    assert!(no_worker_accepts(&fx.state, &local, fx.now).is_none());
    set(&mut fx, worker(), WorkerPolicy::default());
    let refused = no_worker_accepts(&fx.state, &local, fx.now).expect("refused");
    assert_eq!(refused.field, "repository.url");
    assert!(refused.reason.contains("w1"), "{refused}");
    // A manifest for a runtime no live worker offers waits instead.
    let kvm = spec("vm:\n  runtime: kvm\n");
    assert!(no_worker_accepts(&fx.state, &kvm, fx.now).is_none());
    // A silent worker's policy does not count.
    fx.advance(WORKER_TTL * 2);
    assert!(no_worker_accepts(&fx.state, &local, fx.now).is_none());
}

fn registration(worker: WorkerId, capacity: u32) -> RegisterWorker {
    RegisterWorker {
        worker,
        address: "127.0.0.1:9001".into(),
        runtimes: vec![RuntimeKind::Process],
        capacity,
        labels: BTreeMap::new(),
        heartbeat_interval_ms: WORKER_TTL / 3,
    }
}

fn register_with(fx: &mut Fx, worker: WorkerId, capacity: u32, policy: WorkerPolicy) -> Response {
    fx.apply_as(
        &Subject::Worker(worker.clone()),
        Command::RegisterWorkerWithPolicy(crate::command::RegisterWorkerWithPolicy {
            registration: registration(worker, capacity),
            policy,
        }),
    )
}

#[test]
fn a_worker_registered_with_its_policy_is_never_alive_without_it() {
    let mut fx = Fx::new();
    let _local = fx.submit("");
    let w2 = WorkerId::new("w2").unwrap();
    // w1 (the fixture's) allows local repositories; w2 registers refusing them, in one entry.
    let mut local = WorkerPolicy::default();
    local.repository_sources.insert(RepositorySource::Local);
    assert!(set(&mut fx, worker(), local.clone()).is_ok());
    assert!(register_with(&mut fx, w2.clone(), 2, WorkerPolicy::default()).is_ok());
    assert_eq!(fx.state.worker_policy(&w2), Some(&WorkerPolicy::default()));
    let plan = schedule(&fx.state, fx.now, 10).dedicated;
    assert!(plan.iter().all(|a| a.worker != w2), "{plan:?}");

    // Registering again with another policy replaces the old one in the same entry.
    assert!(register_with(&mut fx, w2.clone(), 2, local.clone()).is_ok());
    assert_eq!(fx.state.worker_policy(&w2), Some(&local));
}

#[test]
fn a_refused_registration_with_a_policy_sets_neither() {
    let mut fx = Fx::new();
    let w3 = WorkerId::new("w3").unwrap();
    let workers_before = fx.state.workers().count();
    let r = register_with(&mut fx, w3.clone(), 0, WorkerPolicy::default());
    assert!(
        matches!(&r, Response::Rejected(Rejection::Invalid(e)) if e.field == "capacity"),
        "{r:?}"
    );
    // Another worker may not register w3 with a policy either.
    let r = fx.apply_as(
        &Subject::Worker(worker()),
        Command::RegisterWorkerWithPolicy(crate::command::RegisterWorkerWithPolicy {
            registration: registration(w3.clone(), 1),
            policy: WorkerPolicy::default(),
        }),
    );
    assert!(
        matches!(r, Response::Rejected(Rejection::PermissionDenied { .. })),
        "{r:?}"
    );
    assert!(fx.state.worker_policy(&w3).is_none());
    assert!(fx.state.workers().all(|w| w.id != w3));
    assert_eq!(fx.state.workers().count(), workers_before);
}
