//! The task-lifecycle client (`tasks` workload): submits dedicated tasks, which the scheduler
//! assigns to the harness's worker, and as that worker reports their transitions — mostly the
//! next step of the lifecycle from the state it last saw, sometimes a failure, sometimes a
//! step the lifecycle does not have — and reads them back. `model_task.rs` judges each task.

use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};
use squadron_client::{Consistency, OutcomeExt, ReportTransition, SquadronClient};
use squadron_core::command::TransitionDetail;
use squadron_core::ids::TaskId;
use squadron_core::task::TaskState;
use squadron_core::Outcome;

use crate::driver::Driver;
use crate::event::EventType;
use crate::outcome::{read_failure, write_failure};
use crate::workload_context::WorkloadContext;

/// Tasks the clients keep between submission and their end; more are submitted below it
/// (the worker takes 8 at once).
pub const TASKS_LIVE_TARGET: usize = 6;
/// The key of submissions (no model: the task's own key starts with its id).
pub const SUBMIT_KEY: &str = "tasks-submit";

/// What the workload submits: a task the harness's worker is assigned and never runs.
const MANIFEST: &str = "version: \"1\"\nkind: Task\nmetadata:\n  name: jepsen\n\
                        repository:\n  url: https://example.invalid/jepsen.git\n\
                        agent:\n  prompt: p\n  provider: script\n  script: \"true\"\n\
                        vm:\n  runtime: process\n";

/// The key a task's operations are recorded under.
pub fn task_key(task: TaskId) -> String {
    format!("tasks/{}", task.get())
}

/// The lifecycle's next forward step, if any.
fn next_step(s: TaskState) -> Option<TaskState> {
    use TaskState::*;
    match s {
        Staging => Some(Provisioning),
        Provisioning => Some(Ready),
        Ready => Some(Running),
        Running => Some(Completing),
        Completing => Some(Completed),
        _ => None,
    }
}

/// One task client.
#[derive(Debug)]
pub struct TaskClient {
    ctx: Arc<WorkloadContext>,
    client: SquadronClient,
    pub driver: Driver,
    pub reads: Consistency,
    seen: std::collections::HashMap<TaskId, TaskState>,
}

impl TaskClient {
    pub fn new(ctx: Arc<WorkloadContext>, client: SquadronClient, driver: Driver) -> Self {
        let reads = ctx.reads;
        Self {
            ctx,
            client,
            driver,
            reads,
            seen: Default::default(),
        }
    }

    pub async fn run(mut self) {
        while !self.driver.done() {
            self.driver.pace().await;
            if self.driver.done() {
                break;
            }
            let live = self.ctx.live_tasks();
            let short = live.len() < TASKS_LIVE_TARGET;
            match live.choose(&mut self.driver.rng).copied() {
                Some(task) if !short || self.driver.rng.gen_bool(0.7) => {
                    if self.driver.rng.gen_bool(0.4) {
                        self.read(task, Value::Null).await;
                    } else {
                        self.transition(task).await;
                    }
                }
                _ => self.submit().await,
            }
        }
    }

    async fn submit(&mut self) {
        let client = self.client.clone();
        let (kind, out) = self
            .driver
            .op("submit", SUBMIT_KEY, Value::Null, async {
                match client.submit_task_yaml(MANIFEST, None).await {
                    Ok(o) => o
                        .task_id()
                        .map(|t| json!({"task": t.get()}))
                        .ok_or_else(|| (EventType::Info, json!({"unexpected": format!("{o:?}")}))),
                    Err(e) => Err(write_failure(&e)),
                }
            })
            .await;
        let task = out["task"].as_u64().and_then(|t| TaskId::new(t).ok());
        if let (EventType::Ok, Some(task)) = (kind, task) {
            self.ctx.add_task(task);
        }
    }

    /// Reads the task's state; `Some` when it answered.
    pub async fn read(&mut self, task: TaskId, input: Value) -> Option<TaskState> {
        let client = self.client.clone();
        let reads = self.reads;
        let (_, out) = self
            .driver
            .op("read", &task_key(task), input, async {
                match client.get_task(task, reads).await {
                    Ok(t) => Ok(json!({"state": t.state.as_str()})),
                    Err(e) => Err(read_failure(&e)),
                }
            })
            .await;
        let state = out["state"]
            .as_str()
            .and_then(|s| TaskState::parse("state", s).ok())?;
        self.saw(task, state);
        Some(state)
    }

    fn saw(&mut self, task: TaskId, state: TaskState) {
        self.seen.insert(task, state);
        if state.is_terminal() {
            self.ctx.end_task(task);
        }
    }

    async fn transition(&mut self, task: TaskId) {
        let from = self.seen.get(&task).copied().unwrap_or(TaskState::Staging);
        let roll: f64 = self.driver.rng.gen();
        let to = match next_step(from) {
            Some(next) if roll < 0.7 => next,
            _ if roll < 0.8 => TaskState::Failed,
            _ => *TaskState::ALL
                .choose(&mut self.driver.rng)
                .unwrap_or(&TaskState::Failed),
        };
        let req = ReportTransition {
            worker: self.ctx.worker.clone(),
            attempt: 1,
            from,
            to,
            detail: TransitionDetail {
                exit_code: (to == TaskState::Completing).then_some(0),
                ..TransitionDetail::default()
            },
        };
        let as_worker = self.ctx.as_worker.clone();
        let input = json!({"from": from.as_str(), "to": to.as_str()});
        let (kind, out) = self
            .driver
            .op("transition", &task_key(task), input, async {
                // Not keyed: a report names the state it leaves, a compare-and-swap that
                // must never be resent blindly.
                match as_worker.report_transition(task, &req, None).await {
                    Ok(Outcome::TransitionRecorded { state }) => {
                        Ok(json!({"state": state.as_str()}))
                    }
                    Ok(other) => Err((
                        EventType::Info,
                        json!({"error": "unexpected", "message": format!("{other:?}")}),
                    )),
                    Err(e) => Err(write_failure(&e)),
                }
            })
            .await;
        let now = match kind {
            EventType::Ok => Some(to),
            _ => out["current"]
                .as_str()
                .and_then(|s| TaskState::parse("current", s).ok()),
        };
        if let Some(state) = now {
            self.saw(task, state);
        }
    }
}
