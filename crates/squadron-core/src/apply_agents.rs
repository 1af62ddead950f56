//! The agent inside a task's sandbox: its check-ins, and who may mint its bootstrap token.

use crate::access::{AgentIdentity, BootstrapPurpose, Subject};
use crate::agent_session::AgentSession;
use crate::command::AgentCheckIn;
use crate::rejection::Rejection;
use crate::response::Outcome;
use crate::state::State;
use crate::task::TaskState;

/// The states in which a task's sandbox exists and its agent may check in.
pub(crate) const AGENT_STATES: [TaskState; 4] = [
    TaskState::Provisioning,
    TaskState::Ready,
    TaskState::Running,
    TaskState::Completing,
];

impl State {
    /// Records the agent's registration (its first check-in for an attempt) or heartbeat.
    pub(crate) fn agent_check_in(
        &mut self,
        now: u64,
        subject: &Subject,
        c: AgentCheckIn,
    ) -> Result<Outcome, Rejection> {
        match subject {
            Subject::Agent(AgentIdentity::Task(t)) if *t == c.task => {}
            Subject::Legacy => {}
            other => {
                return Err(Rejection::denied(format!(
                    "only the agent of task {} checks in for it, not {other}",
                    c.task
                )))
            }
        }
        let task = &self.task_ref(c.task)?;
        if c.attempt != task.attempt {
            return Err(Rejection::NotTaskOwner {
                reason: format!(
                    "attempt {} is stale; task {} is on attempt {}",
                    c.attempt, c.task, task.attempt
                ),
            });
        }
        if !AGENT_STATES.contains(&task.state) {
            return Err(Rejection::IllegalTransition {
                from: task.state,
                to: task.state,
                reason: "an agent checks in only while its sandbox exists (PROVISIONING to \
                         COMPLETING)"
                    .into(),
            });
        }
        let state = task.state;
        let reported = self.agent_sessions.get(&c.task).and_then(|s| s.exit_code);
        if let Some(code) = c.exit_code {
            if !matches!(state, TaskState::Running | TaskState::Completing) {
                return Err(Rejection::invalid(
                    "exit_code",
                    format!("the provider has not run yet: the task is {state}"),
                ));
            }
            if reported.is_some_and(|r| r != code) {
                return Err(Rejection::invalid(
                    "exit_code",
                    format!(
                        "exit code {} was reported already",
                        reported.unwrap_or(code)
                    ),
                ));
            }
        }
        let session = self
            .agent_sessions
            .entry(c.task)
            .and_modify(|s| {
                s.last_seen_ms = now;
                s.check_ins = s.check_ins.saturating_add(1);
            })
            .or_insert(AgentSession {
                attempt: c.attempt,
                registered_at_ms: now,
                last_seen_ms: now,
                check_ins: 1,
                usage: None,
                exit_code: None,
            });
        assert_eq!(
            session.attempt, c.attempt,
            "sessions end with their attempt"
        );
        if c.usage.is_some() {
            session.usage = c.usage;
        }
        if c.exit_code.is_some() {
            session.exit_code = c.exit_code;
        }
        Ok(Outcome::AgentCheckedIn {
            state,
            registered_at_ms: session.registered_at_ms,
        })
    }

    /// A bootstrap token is minted by an admin, or by a worker for the agent of a task it
    /// is provisioning (the token goes into that sandbox only).
    pub(crate) fn require_minter(
        &self,
        now: u64,
        subject: &Subject,
        purpose: &BootstrapPurpose,
    ) -> Result<(), Rejection> {
        let (Subject::Worker(w), BootstrapPurpose::Agent { agent }) = (subject, purpose) else {
            return self.require_admin(now, subject);
        };
        let AgentIdentity::Task(t) = agent else {
            return Err(Rejection::denied(format!(
                "worker {w} mints tokens only for the agents of its tasks, not {agent}"
            )));
        };
        let task = &self.task_ref(*t)?;
        if task.worker.as_ref() != Some(w) || task.state != TaskState::Provisioning {
            return Err(Rejection::denied(format!(
                "worker {w} may mint an agent token for task {t} only while it provisions it \
                 (the task is {} on {})",
                task.state,
                task.worker.as_ref().map_or("no worker", |w| w.as_str())
            )));
        }
        Ok(())
    }

    /// A task left its sandbox behind (ended, or went back to the queue): so did its agent.
    pub(crate) fn end_agent_session(&mut self, task: crate::ids::TaskId) {
        self.agent_sessions.remove(&task);
    }

    /// Agent tokens of tasks that have ended are of no further use: the sweep drops them
    /// rather than keeping one per task for the retention period.
    pub(crate) fn prune_agent_tokens(&mut self) -> u64 {
        let before = self.access.bootstrap_tokens.len();
        let tasks = &self.tasks;
        self.access
            .bootstrap_tokens
            .retain(|_, t| match &t.purpose {
                BootstrapPurpose::Agent {
                    agent: AgentIdentity::Task(id),
                } => tasks
                    .get(id)
                    .is_some_and(|task| !task.state().is_terminal()),
                _ => true,
            });
        (before - self.access.bootstrap_tokens.len()) as u64
    }
}
