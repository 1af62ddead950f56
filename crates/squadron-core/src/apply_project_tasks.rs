//! `placement: project` tasks: each attempt runs under a runtime lease of the profile it names,
//! so it counts against its project's `max_active` (INV-5) and is the profile's one writer
//! (INV-4). The lease is granted with the assignment, in the same command: at full capacity, or
//! while the profile is held, the task stays PENDING; it is never a fifth process.
//!
//! - **Grant:** `AssignProjectTasks` (the leader's scheduler) admits the attempt as a plain
//!   acquire would (`check_acquire`: the profile's providers, its generation, one writer, the
//!   project's sandbox on the assigned worker, a free slot) and grants the next generation to
//!   the worker, holder `task {id} attempt {n}`.
//! - **Renewal:** each heartbeat of the worker renews the leases of its tasks, for as long as
//!   three heartbeats would keep the worker alive: a worker that falls silent loses them as it
//!   loses the worker's status, and the sweep fences them (their slots stay held).
//! - **End:** the worker's report of the task's end releases its lease. The driver reports an end
//!   only after it stopped the provider and tore its sandbox down (or preserved it stopped).
//!   Tasks that end otherwise (the worker lost or decommissioned) leave the lease to the lease
//!   rules: a fenced lease holds its slot until reap evidence or the worker's decommission, so a
//!   profile whose task may still run is not granted again (fail closed).
//!
//! Added with the command, never applied to what was assigned before it: `AssignTasks` of a
//! project task keeps its old meaning, so a log written by an earlier build replays to the state
//! it had.

use crate::command::{AssignTasks, Assignment, NextHolder};
use crate::ids::{LeaseId, ProfileId, TaskId, WorkerId};
use crate::lease::{LeaseHolder, LeaseState};
use crate::limits::{LEASE_TTL_MS_MAX, LEASE_TTL_MS_MIN};
use crate::manifest::Placement;
use crate::rejection::{Entity, Rejection};
use crate::response::{AssignmentResult, Outcome};
use crate::state::State;
use crate::task::{Task, TaskState, TransitionActor};
use crate::task_record::TaskRecord;

/// What admission says of a project task on a worker now.
#[derive(Debug)]
pub(crate) enum ProjectAdmission {
    /// It may start: the lease it would be granted.
    Admit(ProfileId, NextHolder),
    /// Not now (capacity, the profile held, the sandbox elsewhere): it stays PENDING.
    Wait(Rejection),
    /// Never: the task fails rather than wait forever.
    Refuse(Rejection),
}

impl State {
    pub(crate) fn assign_project_tasks(
        &mut self,
        now: u64,
        command: AssignTasks,
    ) -> Result<Outcome, Rejection> {
        let AssignTasks { assignments } = command;
        crate::apply_tasks::check_assignments(&assignments)?;
        let results = assignments
            .into_iter()
            .map(|Assignment { task, worker }| AssignmentResult {
                task,
                result: self.assign_project_task(now, task, worker),
            })
            .collect();
        Ok(Outcome::TasksAssigned { results })
    }

    fn assign_project_task(
        &mut self,
        now: u64,
        id: TaskId,
        worker: WorkerId,
    ) -> Result<(), Rejection> {
        let task = &self.task_ref(id)?;
        match self.project_admission(now, task, &worker) {
            ProjectAdmission::Wait(why) => Err(why),
            ProjectAdmission::Refuse(why) => {
                self.fail_pending(now, id, format!("the task cannot run: {why}"));
                Err(why)
            }
            ProjectAdmission::Admit(profile, next) => {
                self.start_assignment(now, id, &worker);
                let grant = self.grant(now, profile, next);
                self.task_leases.insert(id, grant.lease);
                Ok(())
            }
        }
    }

    /// Admission of a project task's attempt on `worker` at `now`: what the scheduler asks
    /// before proposing and what apply decides with.
    pub(crate) fn project_admission(
        &self,
        now: u64,
        task: &Task,
        worker: &WorkerId,
    ) -> ProjectAdmission {
        let Placement::Project {
            tenant,
            project,
            profile,
        } = &task.spec.placement
        else {
            // Not this command's task: refused, and left as it is.
            return ProjectAdmission::Wait(Rejection::invalid(
                "assignments",
                format!(
                    "task {} is placed dedicated; assign_tasks places it",
                    task.id
                ),
            ));
        };
        if let Some(why) = self.assignment_refusal(now, task, worker) {
            return ProjectAdmission::Wait(why);
        }
        let Some(profile) = self.profile_by_key(tenant, project, profile) else {
            return ProjectAdmission::Refuse(Rejection::not_found(
                Entity::Profile,
                format!("{tenant}/{project}/{profile}"),
            ));
        };
        let next = NextHolder {
            provider: task.spec.agent.provider,
            holder: LeaseHolder {
                worker: worker.clone(),
                process: format!("task {} attempt {}", task.id, task.attempt),
                cgroup: None,
            },
            ttl_ms: self.task_lease_ttl_ms(worker),
        };
        match self.check_acquire(profile.id, profile.generation, &next) {
            Ok(()) => ProjectAdmission::Admit(profile.id, next),
            Err(e @ Rejection::ProviderNotAllowed { .. }) => ProjectAdmission::Refuse(e),
            Err(e) => ProjectAdmission::Wait(e),
        }
    }

    /// A task lease lives as long as the worker's silence may last (three heartbeat
    /// intervals), within the lease bounds.
    fn task_lease_ttl_ms(&self, worker: &WorkerId) -> u64 {
        self.workers
            .get(worker)
            .map_or(LEASE_TTL_MS_MIN, |w| w.ttl_ms)
            .clamp(LEASE_TTL_MS_MIN, LEASE_TTL_MS_MAX)
    }

    /// A heartbeat of `worker` renews the active, unexpired leases of its tasks.
    pub(crate) fn renew_task_leases(&mut self, now: u64, worker: &WorkerId) {
        let Some(w) = self.workers.get(worker) else {
            return;
        };
        let due: Vec<LeaseId> = w
            .tasks
            .iter()
            .filter_map(|t| self.task_leases.get(t))
            .filter(|l| {
                self.leases
                    .get(*l)
                    .is_some_and(|l| l.state == LeaseState::Active && !l.is_expired(now))
            })
            .copied()
            .collect();
        let ttl = self.task_lease_ttl_ms(worker);
        for lease in due {
            self.renew(now, lease, ttl);
        }
    }

    /// The worker reported the task's end: its lease, if it still holds a slot, is released.
    pub(crate) fn release_task_lease(&mut self, now: u64, task: TaskId) {
        if let Some(lease) = self.task_leases.remove(&task) {
            if self
                .leases
                .get(&lease)
                .is_some_and(|l| l.state.holds_slot())
            {
                self.end(now, lease, LeaseState::Released { at_ms: now });
            }
        }
    }

    /// The task ended or went back to the queue without its worker's word: the lease stays
    /// under the lease rules (expiry, fencing, reap evidence), no longer bound to the task.
    pub(crate) fn unbind_task_lease(&mut self, task: TaskId) {
        self.task_leases.remove(&task);
    }

    /// PENDING → FAILED by the control plane, for a task that can never be placed.
    fn fail_pending(&mut self, now: u64, id: TaskId, error: String) {
        let task = &self.task_ref(id).expect("caller checked the task");
        assert!(task
            .state
            .can_move(TaskState::Failed, TransitionActor::ControlPlane));
        let key = crate::apply_tasks::queue_key(task);
        self.pending.remove(&key);
        let task = self
            .tasks
            .get_mut(&id)
            .map(TaskRecord::live_mut)
            .expect("checked above");
        task.state = TaskState::Failed;
        task.entered_at_ms.insert(TaskState::Failed, now);
        task.error = Some(error);
        self.note_ended(id, TaskState::Failed, now);
    }
}
