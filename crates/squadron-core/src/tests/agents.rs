//! The agent inside a task's sandbox: only it checks in, for the current attempt, while the
//! sandbox exists; its session ends with the attempt; only the provisioning worker (or an
//! admin) mints its token.

use super::*;
use crate::access::{AgentIdentity, BootstrapPurpose};
use crate::agent_session::SandboxUsage;
use crate::command::{AgentCheckIn, Assignment, MintBootstrapToken};
use crate::ids::Digest;
use crate::task::TaskState::{self, *};

fn agent_of(task: TaskId) -> Subject {
    Subject::Agent(AgentIdentity::Task(task))
}

fn check_in(task: TaskId, attempt: u32, usage: Option<SandboxUsage>) -> Command {
    Command::AgentCheckIn(AgentCheckIn {
        task,
        attempt,
        usage,
        exit_code: None,
    })
}

fn exit(task: TaskId, code: i32) -> Command {
    Command::AgentCheckIn(AgentCheckIn {
        task,
        attempt: 1,
        usage: None,
        exit_code: Some(code),
    })
}

/// A task assigned to the fixture's worker and walked to `to`.
fn task_at(fx: &mut Fx, to: TaskState) -> TaskId {
    let task = fx.submit("");
    fx.ok(Command::AssignTasks(AssignTasks {
        assignments: vec![Assignment {
            task,
            worker: worker(),
        }],
    }));
    let path = [Staging, Provisioning, Ready, Running, Completing];
    for pair in path.windows(2) {
        if fx.state.task(task).unwrap().state == to {
            break;
        }
        assert!(report(fx, task, pair[0], pair[1], None).is_ok());
    }
    task
}

fn mint(task: TaskId, id: &str) -> Command {
    Command::MintBootstrapToken(MintBootstrapToken {
        id: crate::access::TokenId::new(id).unwrap(),
        digest: Digest::from_bytes([7; 32]),
        purpose: BootstrapPurpose::Agent {
            agent: AgentIdentity::Task(task),
        },
        expires_at_ms: 1_000_000,
    })
}

#[test]
fn the_first_check_in_registers_the_agent_and_later_ones_keep_its_time() {
    let mut fx = Fx::new();
    let task = task_at(&mut fx, Provisioning);
    let Outcome::AgentCheckedIn {
        state,
        registered_at_ms,
    } = fx.ok_as(&agent_of(task), check_in(task, 1, None))
    else {
        panic!()
    };
    assert_eq!((state, registered_at_ms), (Provisioning, fx.now));
    fx.advance(30_000);
    let usage = SandboxUsage {
        cpu_usec: 10,
        memory_bytes: 20,
        disk_bytes: 30,
    };
    fx.ok_as(&agent_of(task), check_in(task, 1, Some(usage)));
    let session = *fx.state.agent_session(task).unwrap();
    assert_eq!(session.registered_at_ms, fx.now - 30_000);
    assert_eq!(session.last_seen_ms, fx.now);
    assert_eq!((session.check_ins, session.usage), (2, Some(usage)));
}

#[test]
fn the_exit_code_is_reported_once_the_provider_ran_and_never_changes() {
    let mut fx = Fx::new();
    let provisioning = task_at(&mut fx, Provisioning);
    let r = fx.rejected_as(&agent_of(provisioning), exit(provisioning, 0));
    assert!(
        matches!(&r, Rejection::Invalid(e) if e.field == "exit_code"),
        "{r:?}"
    );
    let task = task_at(&mut fx, Running);
    fx.ok_as(&agent_of(task), exit(task, 3));
    fx.ok_as(&agent_of(task), exit(task, 3));
    let r = fx.rejected_as(&agent_of(task), exit(task, 0));
    assert!(
        matches!(&r, Rejection::Invalid(e) if e.field == "exit_code"),
        "{r:?}"
    );
    // A heartbeat without one keeps it.
    fx.ok_as(&agent_of(task), check_in(task, 1, None));
    assert_eq!(fx.state.agent_session(task).unwrap().exit_code, Some(3));
}

#[test]
fn only_the_tasks_own_agent_checks_in() {
    let mut fx = Fx::new();
    let task = task_at(&mut fx, Provisioning);
    let other = task_at(&mut fx, Provisioning);
    for subject in [
        agent_of(other),
        Subject::Worker(worker()),
        Subject::Operator(crate::access::TokenId::new("0123456789abcdef").unwrap()),
        Subject::Agent(AgentIdentity::ProfileGeneration {
            profile: ProfileId::new(1).unwrap(),
            generation: Generation::new(1),
        }),
    ] {
        let r = fx.rejected_as(&subject, check_in(task, 1, None));
        assert!(matches!(r, Rejection::PermissionDenied { .. }), "{r:?}");
    }
    assert!(fx.state.agent_session(task).is_none());
}

#[test]
fn a_stale_attempt_or_a_task_without_a_sandbox_is_refused() {
    let mut fx = Fx::new();
    let task = task_at(&mut fx, Provisioning);
    let r = fx.rejected_as(&agent_of(task), check_in(task, 2, None));
    assert!(matches!(r, Rejection::NotTaskOwner { .. }), "{r:?}");
    let staging = task_at(&mut fx, Staging);
    let r = fx.rejected_as(&agent_of(staging), check_in(staging, 1, None));
    assert!(matches!(r, Rejection::IllegalTransition { .. }), "{r:?}");
    let missing = TaskId::new(999).unwrap();
    let r = fx.rejected_as(&agent_of(missing), check_in(missing, 1, None));
    assert!(matches!(r, Rejection::NotFound { .. }), "{r:?}");
}

#[test]
fn the_session_ends_with_the_task_and_a_check_in_after_the_end_is_refused() {
    let mut fx = Fx::new();
    let task = task_at(&mut fx, Running);
    fx.ok_as(&agent_of(task), check_in(task, 1, None));
    assert!(report(&mut fx, task, Running, Failed, Some(1)).is_ok());
    assert!(fx.state.agent_session(task).is_none());
    let r = fx.rejected_as(&agent_of(task), check_in(task, 1, None));
    assert!(matches!(r, Rejection::IllegalTransition { .. }), "{r:?}");
}

#[test]
fn a_requeued_task_drops_the_old_attempts_agent() {
    let mut fx = Fx::new();
    let task = task_at(&mut fx, Provisioning);
    fx.ok_as(&agent_of(task), check_in(task, 1, None));
    fx.advance(WORKER_TTL * 2);
    fx.ok(Command::Sweep);
    let t = fx.state.task(task).unwrap();
    assert_eq!((t.state, t.attempt), (Pending, 2));
    assert!(fx.state.agent_session(task).is_none());
    let r = fx.rejected_as(&agent_of(task), check_in(task, 1, None));
    assert!(matches!(r, Rejection::NotTaskOwner { .. }), "{r:?}");
}

#[test]
fn a_worker_mints_an_agent_token_only_for_a_task_it_provisions() {
    let mut fx = Fx::new();
    let w = Subject::Worker(worker());
    let provisioning = task_at(&mut fx, Provisioning);
    fx.ok_as(&w, mint(provisioning, "aaaaaaaaaaaaaaaa"));

    let running = task_at(&mut fx, Running);
    let r = fx.rejected_as(&w, mint(running, "bbbbbbbbbbbbbbbb"));
    assert!(matches!(r, Rejection::PermissionDenied { .. }), "{r:?}");

    let w2 = WorkerId::new("w2").unwrap();
    fx.register_worker(w2.clone());
    let r = fx.rejected_as(&Subject::Worker(w2), mint(provisioning, "cccccccccccccccc"));
    assert!(matches!(r, Rejection::PermissionDenied { .. }), "{r:?}");

    let profile_agent = Command::MintBootstrapToken(MintBootstrapToken {
        id: crate::access::TokenId::new("dddddddddddddddd").unwrap(),
        digest: Digest::from_bytes([7; 32]),
        purpose: BootstrapPurpose::Agent {
            agent: AgentIdentity::ProfileGeneration {
                profile: ProfileId::new(1).unwrap(),
                generation: Generation::new(1),
            },
        },
        expires_at_ms: 1_000_000,
    });
    let r = fx.rejected_as(&w, profile_agent);
    assert!(matches!(r, Rejection::PermissionDenied { .. }), "{r:?}");
    let worker_token = Command::MintBootstrapToken(MintBootstrapToken {
        id: crate::access::TokenId::new("eeeeeeeeeeeeeeee").unwrap(),
        digest: Digest::from_bytes([7; 32]),
        purpose: BootstrapPurpose::Worker { worker: None },
        expires_at_ms: 1_000_000,
    });
    let r = fx.rejected_as(&w, worker_token);
    assert!(matches!(r, Rejection::PermissionDenied { .. }), "{r:?}");
}

#[test]
fn the_sweep_drops_the_agent_tokens_of_ended_tasks() {
    let mut fx = Fx::new();
    let w = Subject::Worker(worker());
    let task = task_at(&mut fx, Provisioning);
    fx.ok_as(&w, mint(task, "aaaaaaaaaaaaaaaa"));
    let live = task_at(&mut fx, Provisioning);
    fx.ok_as(&w, mint(live, "bbbbbbbbbbbbbbbb"));
    fx.ok(Command::Sweep);
    assert_eq!(fx.state.bootstrap_tokens().count(), 2);
    assert!(report(&mut fx, task, Provisioning, Failed, None).is_ok());
    fx.ok(Command::Sweep);
    let left: Vec<_> = fx
        .state
        .bootstrap_tokens()
        .map(|t| t.id.to_string())
        .collect();
    assert_eq!(left, ["bbbbbbbbbbbbbbbb"]);
}
