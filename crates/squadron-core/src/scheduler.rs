//! The pure scheduling function the leader calls to place PENDING tasks on workers.

use std::collections::{BTreeMap, BTreeSet};

use crate::apply_project_tasks::ProjectAdmission;
use crate::command::Assignment;
use crate::ids::{ProfileId, WorkerId};
use crate::manifest::Placement;
use crate::state::{ProjectKey, State};
use crate::task::Task;
use crate::task_record::TaskRecord;

/// What one scheduling pass proposes: dedicated tasks go in `AssignTasks`, project tasks in
/// `AssignProjectTasks` (each with its profile's lease).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub dedicated: Vec<Assignment>,
    pub project: Vec<Assignment>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.dedicated.is_empty() && self.project.is_empty()
    }

    pub fn len(&self) -> usize {
        self.dedicated.len() + self.project.len()
    }
}

/// Proposes up to `max` assignments, taking PENDING tasks by priority then age. A task goes to
/// the alive worker with the most free slots that offers its runtime (ties: lowest worker id);
/// a project-placed task goes only to the worker hosting its project's sandbox, and only when
/// its profile's lease would be granted now (a free slot, the profile not held). A task no
/// worker can take now is skipped, so it does not hold back those behind it.
///
/// The result is a proposal: apply re-checks every entry.
pub fn schedule(state: &State, now_ms: u64, max: usize) -> Plan {
    // The leader's clock, never behind the state's: apply re-checks with the stamped time.
    let now = now_ms.max(state.clock_ms());
    let mut free: BTreeMap<&WorkerId, u32> = state
        .workers()
        .filter(|w| w.accepts_work(now))
        .map(|w| (&w.id, w.free_slots()))
        .collect();
    let mut claimed = Claimed::default();
    let mut plan = Plan::default();
    for task_id in state.pending_queue() {
        if plan.len() >= max || free.values().all(|n| *n == 0) {
            break;
        }
        let Some(task) = state.task_record(task_id).map(TaskRecord::view) else {
            continue;
        };
        let (worker, claim) = if task.spec.placement == Placement::Dedicated {
            match best_worker(state, now, &task, &free) {
                Some(w) => (w, None),
                None => continue,
            }
        } else {
            match claimed.sandbox_worker(state, now, &task, &free) {
                Some((w, claim)) => (w, Some(claim)),
                None => continue,
            }
        };
        if let Some(n) = free.get_mut(&worker) {
            *n -= 1;
        }
        let assignment = Assignment {
            task: task_id,
            worker,
        };
        match claim {
            None => plan.dedicated.push(assignment),
            Some(claim) => {
                if let Some(profile) = claim {
                    claimed.take(profile, &task);
                }
                plan.project.push(assignment);
            }
        }
    }
    plan
}

/// The alive worker with the most free slots that may take a dedicated task (ties: lowest id).
fn best_worker(
    state: &State,
    now: u64,
    task: &Task,
    free: &BTreeMap<&WorkerId, u32>,
) -> Option<WorkerId> {
    free.iter()
        .filter(|(_, n)| **n > 0)
        .filter(|(w, _)| state.assignment_refusal(now, task, w).is_none())
        // max_by_key keeps the last maximum; iterate in reverse id order so ties go to the
        // lowest id.
        .rev()
        .max_by_key(|(_, n)| **n)
        .map(|(w, _)| (*w).clone())
}

/// What the project tasks planned so far in this pass will take when applied: admission reads
/// the state before the pass, so two tasks of one profile, or more than the free slots of a
/// project, are not proposed together.
#[derive(Debug, Default)]
struct Claimed {
    profiles: BTreeSet<ProfileId>,
    slots: BTreeMap<ProjectKey, u32>,
}

impl Claimed {
    /// The worker of the task's project sandbox, when it has a free slot and the task may go
    /// there now, with the profile the grant will take (`None`: proposed only so that apply
    /// fails a task that would otherwise wait forever). The sandbox's worker is the only one
    /// a project task can go to, so admission is asked of it alone.
    fn sandbox_worker(
        &self,
        state: &State,
        now: u64,
        task: &Task,
        free: &BTreeMap<&WorkerId, u32>,
    ) -> Option<(WorkerId, Option<ProfileId>)> {
        let key = task.spec.placement.project()?;
        let project = state.project(&key.0, &key.1)?;
        let worker = &project.sandbox.as_ref()?.worker;
        if free.get(worker).copied().unwrap_or(0) == 0 {
            return None;
        }
        match state.project_admission(now, task, worker) {
            ProjectAdmission::Admit(profile, _) => {
                let taken = self.slots.get(&key).copied().unwrap_or(0);
                let room = project.slots_held.saturating_add(taken) < project.max_active;
                (room && !self.profiles.contains(&profile)).then(|| (worker.clone(), Some(profile)))
            }
            ProjectAdmission::Refuse(_) => Some((worker.clone(), None)),
            ProjectAdmission::Wait(_) => None,
        }
    }

    fn take(&mut self, profile: ProfileId, task: &Task) {
        self.profiles.insert(profile);
        if let Some(key) = task.spec.placement.project() {
            *self.slots.entry(key).or_default() += 1;
        }
    }
}
