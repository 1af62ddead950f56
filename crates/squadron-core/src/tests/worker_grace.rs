//! A worker's grace after a leader change: its heartbeats go to the leader, so it is judged
//! silent from no earlier than the proposing leader's term start (`LeaderSweep`).

use super::*;
use crate::command::{LeaderSweep, WorkerHeartbeat};
use crate::response::SweepReport;
use crate::worker::WorkerStatus;

fn leader_sweep(fx: &mut Fx, term_started_ms: u64) -> SweepReport {
    match fx.ok(Command::LeaderSweep(LeaderSweep { term_started_ms })) {
        Outcome::Swept(report) => report,
        other => panic!("expected a sweep report, got {other:?}"),
    }
}

fn status(fx: &Fx) -> WorkerStatus {
    fx.state.worker(&worker()).expect("registered").status
}

#[test]
fn a_worker_silent_through_an_election_is_not_lost_before_its_ttl_from_the_term_start() {
    let mut fx = Fx::new();
    let task = fx.submit("");
    fx.ok(Command::AssignTasks(crate::command::AssignTasks {
        assignments: vec![crate::command::Assignment {
            task,
            worker: worker(),
        }],
    }));
    let heard_ms = fx.now;
    // The old leader dies; the new one leads from 2 s later, and the worker is silent past its
    // TTL counted from its last heartbeat, but not from the term start.
    let term_started_ms = heard_ms + 2_000;
    fx.advance(WORKER_TTL + 1_000);
    assert!(!fx.state.sweep_due(fx.now, term_started_ms));
    let report = leader_sweep(&mut fx, term_started_ms);
    assert!(report.workers_lost.is_empty(), "{report:?}");
    assert!(report.tasks_requeued.is_empty());
    assert_eq!(status(&fx), WorkerStatus::Alive);
    assert_eq!(fx.state.task(task).expect("task").attempt, 1);
    // It finds the new leader and is heard: alive, its task still its own.
    fx.ok(Command::WorkerHeartbeat(WorkerHeartbeat {
        worker: worker(),
    }));
    assert_eq!(status(&fx), WorkerStatus::Alive);
}

#[test]
fn a_worker_still_silent_a_ttl_after_the_term_start_is_lost() {
    let mut fx = Fx::new();
    let term_started_ms = fx.now + 2_000;
    fx.now = term_started_ms + WORKER_TTL - 1;
    assert!(!fx.state.sweep_due(fx.now, term_started_ms));
    assert!(leader_sweep(&mut fx, term_started_ms)
        .workers_lost
        .is_empty());
    fx.advance(1);
    assert!(fx.state.sweep_due(fx.now, term_started_ms));
    let report = leader_sweep(&mut fx, term_started_ms);
    assert_eq!(report.workers_lost, vec![worker().to_string()]);
    assert_eq!(status(&fx), WorkerStatus::Lost);
}

#[test]
fn the_older_sweep_in_a_log_still_judges_from_the_last_heartbeat_alone() {
    let mut fx = Fx::new();
    fx.advance(WORKER_TTL);
    let Outcome::Swept(report) = fx.ok(Command::Sweep) else {
        panic!("expected a sweep report")
    };
    assert_eq!(report.workers_lost, vec![worker().to_string()]);
}

#[test]
fn a_grace_never_delays_the_fencing_of_an_expired_lease() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    let g = fx.acquire(p);
    fx.now = g.expires_at_ms;
    let term_started_ms = fx.now;
    let report = leader_sweep(&mut fx, term_started_ms);
    assert_eq!(report.leases_fenced.len(), 1, "{report:?}");
}
