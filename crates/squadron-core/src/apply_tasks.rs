//! Task submission, assignment, transitions (INV-10), progress and cancellation.

use std::collections::BTreeMap;

use crate::access::{AgentIdentity, Subject};
use crate::command::{
    AssignTasks, Assignment, CancelTask, ReportProgress, ReportProgressV2, ReportTransition,
    SubmitTask, TransitionDetail,
};
use crate::ids::{TaskId, WorkerId};
use crate::limits::CHILD_TASKS_PER_TASK_MAX;
use crate::limits::{
    ARTIFACT_NAME_BYTES_MAX, ASSIGNMENTS_PER_BATCH_MAX, PENDING_TASKS_MAX, REASON_BYTES_MAX,
    TASK_ARTIFACTS_MAX, TASK_ATTEMPTS_MAX, TASK_ERROR_BYTES_MAX,
};
use crate::manifest::{FailureAction, Placement};
use crate::rejection::{Entity, Rejection};
use crate::response::{AssignmentResult, Outcome};
use crate::state::State;
use crate::task::{AttemptProviderProgress, Task, TaskProgress, TaskState, TransitionActor};
use crate::task_record::TaskRecord;

/// The pending-queue key: higher priority first, then submission order.
pub(crate) fn queue_key(task: &Task) -> (u8, TaskId) {
    (u8::MAX - task.spec.priority.rank(), task.id)
}

/// An assignment command holds between one and `ASSIGNMENTS_PER_BATCH_MAX` assignments.
pub(crate) fn check_assignments(assignments: &[Assignment]) -> Result<(), Rejection> {
    if assignments.is_empty() || assignments.len() > ASSIGNMENTS_PER_BATCH_MAX {
        return Err(Rejection::invalid(
            "assignments",
            format!(
                "must hold between 1 and {ASSIGNMENTS_PER_BATCH_MAX} assignments, got {}",
                assignments.len()
            ),
        ));
    }
    Ok(())
}

fn check_artifacts(artifacts: &[String]) -> Result<(), Rejection> {
    if artifacts.len() > TASK_ARTIFACTS_MAX {
        return Err(Rejection::invalid(
            "detail.artifacts",
            format!(
                "must list at most {TASK_ARTIFACTS_MAX} artifacts, got {}",
                artifacts.len()
            ),
        ));
    }
    for (i, name) in artifacts.iter().enumerate() {
        let field = format!("detail.artifacts[{i}]");
        if name.is_empty() || name.len() > ARTIFACT_NAME_BYTES_MAX {
            return Err(Rejection::invalid(
                field,
                format!("must be 1 to {ARTIFACT_NAME_BYTES_MAX} bytes"),
            ));
        }
        if name.starts_with('/')
            || name.split('/').any(|seg| seg == ".." || seg.is_empty())
            || name.chars().any(char::is_control)
        {
            return Err(Rejection::invalid(
                field,
                format!("must be a relative path without '..' or empty segments, got {name:?}"),
            ));
        }
    }
    Ok(())
}

fn check_text(field: &str, text: &str, max: usize) -> Result<(), Rejection> {
    if text.len() > max {
        return Err(Rejection::invalid(
            field,
            format!("must be at most {max} bytes, got {}", text.len()),
        ));
    }
    Ok(())
}

/// INV-10: a worker may move `task` from `from` to `to` with this report.
fn check_transition(
    task: &Task,
    from: TaskState,
    to: TaskState,
    detail: &TransitionDetail,
) -> Result<(), Rejection> {
    if from != task.state {
        return Err(Rejection::StaleTaskState {
            expected: from,
            current: task.state,
        });
    }
    let illegal = |reason: &str| Rejection::IllegalTransition {
        from,
        to,
        reason: reason.to_string(),
    };
    if !from.can_move(to, TransitionActor::Worker) {
        return Err(illegal("not in the lifecycle's transition table"));
    }
    match to {
        TaskState::Completing if detail.exit_code.is_none() => {
            Err(illegal("leaving RUNNING needs the provider's exit code"))
        }
        TaskState::Completed => {
            // The code the task ends with is the one this report records, if it brings one.
            let code = detail.exit_code.or(task.exit_code).unwrap_or(-1);
            if task.spec.lifecycle.success_exit_codes.contains(&code) {
                Ok(())
            } else {
                Err(illegal(&format!(
                    "exit code {code} is not one of the task's success codes"
                )))
            }
        }
        TaskState::FailedPreserved
            if task.spec.lifecycle.failure_action != FailureAction::Preserve =>
        {
            Err(illegal("the task's failure_action is destroy"))
        }
        TaskState::Cancelled if task.cancel_requested.is_none() => {
            Err(illegal("nobody asked to cancel this task"))
        }
        _ => Ok(()),
    }
}

impl State {
    pub(crate) fn submit_task(
        &mut self,
        now: u64,
        subject: &Subject,
        command: SubmitTask,
    ) -> Result<Outcome, Rejection> {
        let parent = self.parent_for(subject)?;
        let spec = *command.spec;
        spec.validate()?;
        if self.pending.len() >= PENDING_TASKS_MAX {
            return Err(Rejection::QueueFull {
                max: PENDING_TASKS_MAX,
            });
        }
        if let Placement::Project {
            tenant,
            project,
            profile,
        } = &spec.placement
        {
            if self.profile_by_key(tenant, project, profile).is_none() {
                return Err(Rejection::not_found(
                    Entity::Profile,
                    format!("{tenant}/{project}/{profile}"),
                ));
            }
        }
        let id = self.next_task_id;
        self.next_task_id = id.next();
        let task = Task {
            id,
            spec,
            state: TaskState::Pending,
            attempt: 1,
            worker: None,
            submitted_at_ms: now,
            entered_at_ms: BTreeMap::from([(TaskState::Pending, now)]),
            exit_code: None,
            error: None,
            cancel_requested: None,
            progress: TaskProgress::default(),
            artifacts: Vec::new(),
        };
        self.pending.insert(queue_key(&task));
        self.tasks.insert(id, TaskRecord::new(task));
        if let Some(parent) = parent {
            self.lineage.link(parent, id);
        }
        Ok(Outcome::TaskSubmitted { task: id })
    }

    /// The parent of a task this subject submits: an agent's task submits children of itself
    /// (the seed's parent/child pattern); operators submit top-level tasks; nobody else
    /// submits.
    fn parent_for(&self, subject: &Subject) -> Result<Option<TaskId>, Rejection> {
        match subject {
            Subject::Agent(AgentIdentity::Task(parent)) => {
                let task = &self.task_ref(*parent)?;
                if task.state.is_terminal() {
                    return Err(Rejection::denied(format!(
                        "task {parent} has ended; it cannot submit children"
                    )));
                }
                if self.lineage.children(*parent).count() >= CHILD_TASKS_PER_TASK_MAX {
                    return Err(Rejection::QueueFull {
                        max: CHILD_TASKS_PER_TASK_MAX,
                    });
                }
                Ok(Some(*parent))
            }
            Subject::Agent(other) => Err(Rejection::denied(format!(
                "agent {other} is not a task's agent; only a task's agent submits child tasks"
            ))),
            Subject::Worker(w) => Err(Rejection::denied(format!(
                "worker {w} may not submit tasks"
            ))),
            _ => Ok(None),
        }
    }

    /// Why `worker` cannot take `task` now, if it cannot.
    pub(crate) fn assignment_refusal(
        &self,
        now: u64,
        task: &Task,
        worker: &WorkerId,
    ) -> Option<Rejection> {
        if task.state != TaskState::Pending {
            return Some(Rejection::StaleTaskState {
                expected: TaskState::Pending,
                current: task.state,
            });
        }
        let w = match self.worker_ref(worker) {
            Ok(w) => w,
            Err(e) => return Some(e),
        };
        if !w.accepts_work(now) {
            return Some(Rejection::WorkerUnavailable {
                reason: format!("worker {worker} is not alive, is silent, or is full"),
            });
        }
        if let Some(refused) = self
            .worker_policies
            .get(worker)
            .and_then(|p| p.refusal(&task.spec))
        {
            return Some(Rejection::WorkerUnavailable {
                reason: format!(
                    "worker {worker}'s policy refuses {}: {}",
                    refused.field, refused.reason
                ),
            });
        }
        if !w.runtimes.contains(&task.spec.sandbox.runtime) {
            return Some(Rejection::WorkerUnavailable {
                reason: format!(
                    "worker {worker} does not offer the {} runtime",
                    task.spec.sandbox.runtime
                ),
            });
        }
        if let Placement::Project {
            tenant, project, ..
        } = &task.spec.placement
        {
            let on_sandbox = self
                .project(tenant, project)
                .and_then(|p| p.sandbox.as_ref())
                .is_some_and(|s| &s.worker == worker);
            if !on_sandbox {
                return Some(Rejection::SandboxMismatch {
                    sandbox_worker: self
                        .project(tenant, project)
                        .and_then(|p| p.sandbox.as_ref())
                        .map_or_else(|| "none".into(), |s| s.worker.to_string()),
                });
            }
        }
        None
    }

    pub(crate) fn assign_tasks(
        &mut self,
        now: u64,
        command: AssignTasks,
    ) -> Result<Outcome, Rejection> {
        let AssignTasks { assignments } = command;
        check_assignments(&assignments)?;
        let mut results = Vec::with_capacity(assignments.len());
        for Assignment { task, worker } in assignments {
            let refusal = match self.task_ref(task) {
                Ok(t) => self.assignment_refusal(now, &t, &worker),
                Err(e) => Some(e),
            };
            if let Some(r) = refusal {
                results.push(AssignmentResult {
                    task,
                    result: Err(r),
                });
                continue;
            }
            self.start_assignment(now, task, &worker);
            results.push(AssignmentResult {
                task,
                result: Ok(()),
            });
        }
        Ok(Outcome::TasksAssigned { results })
    }

    /// PENDING → STAGING on `worker`, for an assignment that passed its checks.
    pub(crate) fn start_assignment(&mut self, now: u64, task: TaskId, worker: &WorkerId) {
        let t = self
            .tasks
            .get_mut(&task)
            .map(TaskRecord::live_mut)
            .expect("caller checked the task");
        self.pending.remove(&queue_key(t));
        t.state = TaskState::Staging;
        t.worker = Some(worker.clone());
        t.entered_at_ms.insert(TaskState::Staging, now);
        self.workers
            .get_mut(worker)
            .expect("caller checked the worker")
            .tasks
            .insert(task);
    }

    /// The worker's report must come from the task's owner, for its current attempt.
    pub(crate) fn check_owner(
        &self,
        task: &Task,
        worker: &WorkerId,
        attempt: u32,
    ) -> Result<(), Rejection> {
        if task.worker.as_ref() != Some(worker) {
            return Err(Rejection::NotTaskOwner {
                reason: format!(
                    "task {} is assigned to {}",
                    task.id,
                    task.worker.as_ref().map_or("no worker", |w| w.as_str())
                ),
            });
        }
        if attempt != task.attempt {
            return Err(Rejection::NotTaskOwner {
                reason: format!(
                    "attempt {attempt} is stale; task {} is on attempt {}",
                    task.id, task.attempt
                ),
            });
        }
        Ok(())
    }

    pub(crate) fn report_transition(
        &mut self,
        now: u64,
        subject: &Subject,
        command: ReportTransition,
    ) -> Result<Outcome, Rejection> {
        self.require_worker(subject, &command.worker)?;
        let ReportTransition {
            task: id,
            worker,
            attempt,
            from,
            to,
            detail,
        } = command;
        if let Some(e) = &detail.error {
            check_text("detail.error", e, TASK_ERROR_BYTES_MAX)?;
        }
        check_artifacts(&detail.artifacts)?;
        let task = &self.task_ref(id)?;
        self.check_owner(task, &worker, attempt)?;
        check_transition(task, from, to, &detail)?;
        let task = self
            .tasks
            .get_mut(&id)
            .map(TaskRecord::live_mut)
            .expect("checked above");
        task.state = to;
        task.entered_at_ms.insert(to, now);
        if detail.exit_code.is_some() {
            task.exit_code = detail.exit_code;
        }
        if detail.error.is_some() {
            task.error = detail.error;
        }
        if !detail.artifacts.is_empty() {
            task.artifacts = detail.artifacts;
        }
        if to.is_terminal() {
            self.note_ended(id, to, now);
            if let Some(w) = self.workers.get_mut(&worker) {
                w.tasks.remove(&id);
            }
            self.end_credential_lease(now, id, &format!("task ended {to}"));
            self.end_agent_session(id);
            self.release_task_lease(now, id);
        }
        Ok(Outcome::TransitionRecorded { state: to })
    }

    pub(crate) fn report_progress(
        &mut self,
        subject: &Subject,
        command: ReportProgress,
    ) -> Result<Outcome, Rejection> {
        self.require_worker(subject, &command.worker)?;
        let (id, progress) = (command.task, command.progress());
        let task = &self.task_ref(id)?;
        self.check_owner(task, &command.worker, command.attempt)?;
        if task.state.is_terminal() {
            return Err(Rejection::IllegalTransition {
                from: task.state,
                to: task.state,
                reason: "a finished task takes no more progress".into(),
            });
        }
        let old = task.progress;
        for (field, new, cur) in [
            ("stdout_bytes", progress.stdout_bytes, old.stdout_bytes),
            ("stderr_bytes", progress.stderr_bytes, old.stderr_bytes),
            ("lines", progress.lines, old.lines),
            ("events", progress.events, old.events),
        ] {
            if new < cur {
                return Err(Rejection::invalid(
                    field,
                    format!("counters only grow: {new} is below the recorded {cur}"),
                ));
            }
        }
        self.tasks
            .get_mut(&id)
            .map(TaskRecord::live_mut)
            .expect("checked above")
            .progress = progress;
        Ok(Outcome::ProgressRecorded)
    }

    /// The counters as `report_progress` takes them, and the provider's progress: validated
    /// first, so a rejection changes nothing; it replaces the attempt's last.
    pub(crate) fn report_progress_v2(
        &mut self,
        subject: &Subject,
        command: ReportProgressV2,
    ) -> Result<Outcome, Rejection> {
        let ReportProgressV2 { counts, provider } = command;
        if let Some(p) = &provider {
            p.validate()?;
        }
        let (task, attempt) = (counts.task, counts.attempt);
        let outcome = self.report_progress(subject, counts)?;
        if let Some(progress) = provider {
            self.provider_progress
                .insert(task, AttemptProviderProgress { attempt, progress });
        }
        Ok(outcome)
    }

    pub(crate) fn cancel_task(
        &mut self,
        now: u64,
        command: CancelTask,
    ) -> Result<Outcome, Rejection> {
        let CancelTask { task: id, reason } = command;
        check_text("reason", &reason, REASON_BYTES_MAX)?;
        let task = &self.task_ref(id)?;
        if task.state.is_terminal() {
            return Err(Rejection::IllegalTransition {
                from: task.state,
                to: TaskState::Cancelled,
                reason: "the task has already ended".into(),
            });
        }
        let key = queue_key(task);
        let task = self
            .tasks
            .get_mut(&id)
            .map(TaskRecord::live_mut)
            .expect("checked above");
        if task.state == TaskState::Pending {
            // Nothing runs yet: the control plane ends it at once.
            self.pending.remove(&key);
            task.state = TaskState::Cancelled;
            task.entered_at_ms.insert(TaskState::Cancelled, now);
        }
        task.cancel_requested = Some(reason);
        let state = task.state;
        if state.is_terminal() {
            self.note_ended(id, state, now);
        }
        Ok(Outcome::CancelAccepted { state })
    }

    /// Tasks of a worker that is gone: those that never started running go back to the queue
    /// (bounded by `TASK_ATTEMPTS_MAX`); the others fail, since what the agent did is unknown.
    pub(crate) fn orphan_tasks_of(
        &mut self,
        now: u64,
        worker: &WorkerId,
        why: &str,
    ) -> (Vec<TaskId>, Vec<TaskId>) {
        let Some(w) = self.workers.get_mut(worker) else {
            return (Vec::new(), Vec::new());
        };
        let ids = std::mem::take(&mut w.tasks);
        let (mut requeued, mut failed) = (Vec::new(), Vec::new());
        for id in ids {
            let task = self
                .tasks
                .get_mut(&id)
                .map(TaskRecord::live_mut)
                .expect("worker tasks exist");
            let before_running = matches!(
                task.state,
                TaskState::Staging | TaskState::Provisioning | TaskState::Ready
            );
            let cancelled = task.cancel_requested.is_some();
            if before_running && !cancelled && task.attempt < TASK_ATTEMPTS_MAX {
                assert!(task
                    .state
                    .can_move(TaskState::Pending, TransitionActor::ControlPlane));
                task.state = TaskState::Pending;
                task.attempt += 1;
                task.worker = None;
                task.entered_at_ms.insert(TaskState::Pending, now);
                self.pending.insert(queue_key(task));
                requeued.push(id);
            } else {
                let to = if cancelled {
                    TaskState::Cancelled
                } else {
                    TaskState::Failed
                };
                assert!(task.state.can_move(to, TransitionActor::ControlPlane));
                task.error = Some(format!(
                    "worker {worker} {why} while the task was {}",
                    task.state
                ));
                task.state = to;
                task.entered_at_ms.insert(to, now);
                self.note_ended(id, to, now);
                failed.push(id);
            }
        }
        for id in requeued.iter().chain(&failed) {
            self.end_credential_lease(now, *id, &format!("worker {worker} {why}"));
            self.end_agent_session(*id);
            self.unbind_task_lease(*id);
        }
        (requeued, failed)
    }

    /// An operator name or reason: present, bounded, printable.
    pub(crate) fn check_reason(field: &str, text: &str) -> Result<(), Rejection> {
        if text.trim().is_empty() {
            return Err(Rejection::invalid(field, "must not be empty"));
        }
        if text.chars().any(|c| c.is_control() && c != '\n') {
            return Err(Rejection::invalid(
                field,
                "must not contain control characters",
            ));
        }
        check_text(field, text, REASON_BYTES_MAX)
    }
}
