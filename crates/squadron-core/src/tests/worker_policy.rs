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
