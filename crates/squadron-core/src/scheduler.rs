//! The pure scheduling function the leader calls to place PENDING tasks on workers.

use std::collections::{BTreeMap, BTreeSet};

use crate::apply_project_tasks::ProjectAdmission;
use crate::command::Assignment;
use crate::ids::{ProjectId, TenantId, WorkerId};
use crate::manifest::Placement;
use crate::state::State;
use crate::task::Task;

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
        let Some(task) = state.task(task_id) else {
            continue;
        };
        let project_task = task.spec.placement != Placement::Dedicated;
        let best = free
            .iter()
            .filter(|(_, n)| **n > 0)
            .filter(|(w, _)| {
                if project_task {
                    claimed.admits(state, now, task, w)
                } else {
                    state.assignment_refusal(now, task, w).is_none()
                }
            })
            // max_by_key keeps the last maximum; iterate in reverse id order so ties go to the
            // lowest id.
            .rev()
            .max_by_key(|(_, n)| **n)
            .map(|(w, _)| (*w).clone());
        let Some(worker) = best else {
            continue;
        };
        if let Some(n) = free.get_mut(&worker) {
            *n -= 1;
        }
        let assignment = Assignment {
            task: task_id,
            worker,
        };
        if project_task {
            claimed.take(state, task);
            plan.project.push(assignment);
        } else {
            plan.dedicated.push(assignment);
        }
    }
    plan
}

/// What the project tasks planned so far in this pass will take when applied: admission reads
/// the state before the pass, so two tasks of one profile, or more than the free slots of a
/// project, are not proposed together.
#[derive(Debug, Default)]
struct Claimed {
    profiles: BTreeSet<(TenantId, ProjectId, crate::ids::ProfileKey)>,
    slots: BTreeMap<(TenantId, ProjectId), u32>,
}

impl Claimed {
    fn admits(&self, state: &State, now: u64, task: &Task, worker: &WorkerId) -> bool {
        let Placement::Project {
            tenant,
            project,
            profile,
        } = &task.spec.placement
        else {
            return false;
        };
        if self
            .profiles
            .contains(&(tenant.clone(), project.clone(), profile.clone()))
        {
            return false;
        }
        let taken = self
            .slots
            .get(&(tenant.clone(), project.clone()))
            .copied()
            .unwrap_or(0);
        let room = state
            .project(tenant, project)
            .is_some_and(|p| p.slots_held.saturating_add(taken) < p.max_active);
        match state.project_admission(now, task, worker) {
            ProjectAdmission::Admit(..) => room,
            // Proposed so that apply fails the task instead of leaving it waiting forever.
            ProjectAdmission::Refuse(_) => true,
            ProjectAdmission::Wait(_) => false,
        }
    }

    fn take(&mut self, state: &State, task: &Task) {
        if let Placement::Project {
            tenant,
            project,
            profile,
        } = &task.spec.placement
        {
            if state.profile_by_key(tenant, project, profile).is_some() {
                self.profiles
                    .insert((tenant.clone(), project.clone(), profile.clone()));
                *self
                    .slots
                    .entry((tenant.clone(), project.clone()))
                    .or_default() += 1;
            }
        }
    }
}
