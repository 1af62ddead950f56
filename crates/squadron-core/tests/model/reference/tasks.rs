//! The model's task commands: submission, reports and cancellation (assignment is `assign`).

use crate::*;

impl Model {
    pub(crate) fn submit_task(&mut self, c: &SubmitTask) -> MResult<Outcome> {
        let SubmitTask { spec } = c;
        self.tasks.push(MTask {
            agent: None,
            state: TaskState::Pending,
            worker: None,
            exit_code: None,
            cancel_requested: false,
            preserve: spec.lifecycle.failure_action == FailureAction::Preserve,
            rank: spec.priority.rank(),
        });
        Ok(Outcome::TaskSubmitted {
            task: task_id(self.tasks.len() - 1),
        })
    }

    pub(crate) fn report_transition(&mut self, c: &ReportTransition) -> MResult<Outcome> {
        let ReportTransition {
            task,
            worker,
            attempt,
            from,
            to,
            detail,
        } = c;
        let Some(t) = self.task_idx(*task) else {
            return rej("NotFound");
        };
        let mt = &self.tasks[t];
        if mt.worker.map(worker_id).as_ref() != Some(worker) || *attempt != 1 {
            return rej("NotTaskOwner");
        }
        if *from != mt.state {
            return Err(Rej::Exact(Rejection::StaleTaskState {
                expected: *from,
                current: mt.state,
            }));
        }
        let legal = worker_may_move(mt.state, *to);
        if legal
            && *to == TaskState::Completed
            && detail.exit_code.is_some()
            && detail.exit_code != mt.exit_code
        {
            // Open: `apply` turns this into Expect::CompletedWithNewExitCode.
            return Err(Rej::Kind("either"));
        }
        let allowed = legal
            && match to {
                TaskState::Completing => detail.exit_code.is_some(),
                TaskState::Completed => mt.exit_code == Some(0),
                TaskState::FailedPreserved => mt.preserve,
                TaskState::Cancelled => mt.cancel_requested,
                _ => true,
            };
        if !allowed {
            return rej("IllegalTransition");
        }
        let mt = &mut self.tasks[t];
        mt.state = *to;
        if detail.exit_code.is_some() {
            mt.exit_code = detail.exit_code;
        }
        if is_terminal(*to) {
            mt.agent = None;
        }
        Ok(Outcome::TransitionRecorded { state: *to })
    }

    /// The sandbox's agent checks in (the model's commands are legacy entries, which any
    /// subject may send): for attempt 1, while the sandbox exists.
    pub(crate) fn agent_check_in(&mut self, c: &AgentCheckIn) -> MResult<Outcome> {
        let Some(t) = self.task_idx(c.task) else {
            return rej("NotFound");
        };
        if c.attempt != 1 {
            return rej("NotTaskOwner");
        }
        let now = self.now;
        let mt = &mut self.tasks[t];
        if !has_sandbox(mt.state) {
            return rej("IllegalTransition");
        }
        let agent = mt.agent.get_or_insert(MAgent {
            registered_at_ms: now,
            last_seen_ms: now,
            check_ins: 0,
            usage: None,
        });
        agent.last_seen_ms = now;
        agent.check_ins += 1;
        if c.usage.is_some() {
            agent.usage = c.usage;
        }
        Ok(Outcome::AgentCheckedIn {
            state: mt.state,
            registered_at_ms: agent.registered_at_ms,
        })
    }

    pub(crate) fn cancel_task(&mut self, c: &CancelTask) -> MResult<Outcome> {
        let CancelTask { task, .. } = c;
        let Some(t) = self.task_idx(*task) else {
            return rej("NotFound");
        };
        let mt = &mut self.tasks[t];
        if is_terminal(mt.state) {
            return rej("IllegalTransition");
        }
        if mt.state == TaskState::Pending {
            mt.state = TaskState::Cancelled;
        }
        mt.cancel_requested = true;
        Ok(Outcome::CancelAccepted { state: mt.state })
    }

    pub(crate) fn assign(
        &mut self,
        assignments: &[Assignment],
    ) -> MResult<Vec<(TaskId, Result<(), &'static str>)>> {
        if assignments.is_empty() {
            return rej("Invalid");
        }
        let mut out = Vec::new();
        for a in assignments {
            let w = WORKERS
                .iter()
                .position(|n| *n == a.worker.as_str())
                .expect("known worker");
            let result = match self.task_idx(a.task) {
                None => Err("NotFound"),
                Some(t) if self.tasks[t].state != TaskState::Pending => Err("StaleTaskState"),
                Some(_) if self.assigned_count(w) >= WORKER_CAPACITY as usize => {
                    Err("WorkerUnavailable")
                }
                Some(t) => {
                    self.tasks[t].state = TaskState::Staging;
                    self.tasks[t].worker = Some(w);
                    Ok(())
                }
            };
            out.push((a.task, result));
        }
        Ok(out)
    }

    /// The PENDING queue: higher priority first, then submission order.
    pub(crate) fn pending_queue(&self) -> Vec<TaskId> {
        let mut q: Vec<(std::cmp::Reverse<u8>, usize)> = self
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, t)| t.state == TaskState::Pending)
            .map(|(i, t)| (std::cmp::Reverse(t.rank), i))
            .collect();
        q.sort_unstable();
        q.into_iter().map(|(_, i)| task_id(i)).collect()
    }
}

/// The states in which a task's sandbox exists and its agent may check in.
pub(crate) fn has_sandbox(s: TaskState) -> bool {
    matches!(
        s,
        TaskState::Provisioning | TaskState::Ready | TaskState::Running | TaskState::Completing
    )
}

pub(crate) fn is_terminal(s: TaskState) -> bool {
    matches!(
        s,
        TaskState::Completed
            | TaskState::Failed
            | TaskState::FailedPreserved
            | TaskState::Cancelled
    )
}

pub(crate) fn is_assigned(s: TaskState) -> bool {
    !is_terminal(s) && s != TaskState::Pending
}

/// The lifecycle of DESIGN.md §3, as a worker may report it.
pub(crate) fn worker_may_move(from: TaskState, to: TaskState) -> bool {
    use TaskState::*;
    if is_terminal(from) {
        return false;
    }
    matches!(
        (from, to),
        (Staging, Provisioning)
            | (Provisioning, Ready)
            | (Ready, Running)
            | (Running, Completing)
            | (Completing, Completed)
            | (_, Failed | FailedPreserved)
    ) || (to == Cancelled && from != Pending)
}

/// Any move the lifecycle allows, by a worker or by the control plane (assign, cancel queued).
pub(crate) fn lifecycle_allows(from: TaskState, to: TaskState) -> bool {
    worker_may_move(from, to)
        || matches!(
            (from, to),
            (TaskState::Pending, TaskState::Staging) | (TaskState::Pending, TaskState::Cancelled)
        )
}

pub(crate) fn forward(s: TaskState) -> TaskState {
    use TaskState::*;
    match s {
        Staging => Provisioning,
        Provisioning => Ready,
        Ready => Running,
        Running => Completing,
        Completing => Completed,
        _ => Staging,
    }
}
