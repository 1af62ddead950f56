//! The retention of ended tasks (DESIGN §7: "terminal tasks are … retained by policy"). The
//! leader proposes [`PruneTasks`] with its node's policy; apply drops the tasks that ended
//! longest ago, past the policy's age or beyond its count, and keeps their figures in
//! [`crate::task_tally::TaskTally`]. What a task left on its worker (logs, artifacts, a
//! worktree) stays there: only the record goes.

use crate::command::PruneTasks;
use crate::ids::TaskId;
use crate::limits::TASKS_PRUNED_PER_COMMAND_MAX;
use crate::rejection::Rejection;
use crate::response::Outcome;
use crate::state::State;
use crate::task::{Task, TaskState};
use crate::task_tally::TaskTally;

/// The ended tasks by the time they ended, the order they are pruned in. Derived from the
/// tasks (rebuilt when a snapshot is decoded), so it is not part of the snapshot's encoding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EndedTasks {
    /// COMPLETED, FAILED and CANCELLED tasks: pruned by age and by count.
    ordinary: crate::state::PSet<(u64, TaskId)>,
    /// FAILED_PRESERVED tasks, pruned by age only: their record carries the break-glass line
    /// to a sandbox the worker keeps, which a burst of ordinary tasks must not push out.
    preserved: crate::state::PSet<(u64, TaskId)>,
    /// The figures of every task that ended, the pruned ones included: an ended task's never
    /// change, so a scrape adds only the live tasks' to these instead of decoding every
    /// ended one.
    figures: TaskTally,
}

impl EndedTasks {
    fn set_of(&mut self, state: TaskState) -> &mut crate::state::PSet<(u64, TaskId)> {
        if state == TaskState::FailedPreserved {
            &mut self.preserved
        } else {
            &mut self.ordinary
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.ordinary.len() + self.preserved.len()
    }

    pub(crate) fn contains(&self, state: TaskState, ended_at_ms: u64, id: TaskId) -> bool {
        let set = if state == TaskState::FailedPreserved {
            &self.preserved
        } else {
            &self.ordinary
        };
        set.contains(&(ended_at_ms, id))
    }
}

/// When an ended task entered its end state: its key in [`EndedTasks`].
pub(crate) fn ended_at_ms(task: &Task) -> u64 {
    task.entered_at_ms.get(&task.state).copied().unwrap_or(0)
}

impl State {
    /// Records that task `id` entered the terminal `state` at `at_ms`. Every handler that ends
    /// a task calls it; the full invariant check compares the index with the tasks.
    pub(crate) fn note_ended(&mut self, id: TaskId, state: TaskState, at_ms: u64) {
        assert!(state.is_terminal(), "task {id} noted as ended in {state}");
        let record = self.tasks.get_mut(&id).expect("an ended task is held");
        self.ended.figures.add(&record.view());
        record.seal();
        assert_eq!(
            record.ended_at_ms(),
            Some(at_ms),
            "task {id} ended at another time"
        );
        self.ended.set_of(state).insert((at_ms, id));
    }

    /// Builds the index of ended tasks from the tasks themselves.
    pub(crate) fn rebuild_ended_index(&mut self) {
        let mut ended = EndedTasks {
            figures: self.pruned_tasks.clone(),
            ..EndedTasks::default()
        };
        for (id, t) in &self.tasks {
            if let Some(at) = t.ended_at_ms() {
                ended.set_of(t.state()).insert((at, *id));
                ended.figures.add(&t.view());
            }
        }
        self.ended = ended;
    }

    /// The ended task `policy` prunes next at `now`, if any: the one that ended first among
    /// those past the age, or the first ordinary one while there are more than the count.
    fn next_to_prune(&self, now: u64, policy: &PruneTasks) -> Option<TaskId> {
        let too_old = |at: u64| at.saturating_add(policy.age_ms_max) <= now;
        let too_many = self.ended.ordinary.len() as u64 > policy.count_max;
        let ordinary = self
            .ended
            .ordinary
            .get_min()
            .filter(|(at, _)| too_many || too_old(*at));
        let preserved = self
            .ended
            .preserved
            .get_min()
            .filter(|(at, _)| too_old(*at));
        match (ordinary, preserved) {
            (Some(a), Some(b)) => Some(a.min(b).1),
            (a, b) => a.or(b).map(|(_, id)| *id),
        }
    }

    /// Whether a `PruneTasks` with `policy` would prune anything at `now` (the leader asks
    /// before proposing one).
    pub fn prune_due(&self, now_ms: u64, policy: &PruneTasks) -> bool {
        self.next_to_prune(now_ms.max(self.clock_ms), policy)
            .is_some()
    }

    /// Tasks pruned so far, summed.
    pub fn pruned_tasks(&self) -> &TaskTally {
        &self.pruned_tasks
    }

    /// Every task that ended so far, summed: the ended tasks held and the pruned ones.
    pub fn ended_tasks_tally(&self) -> &TaskTally {
        &self.ended.figures
    }

    /// Whether task `id` existed once and was pruned: ids are handed out in order and a task
    /// leaves the state only by pruning.
    pub fn task_was_pruned(&self, id: TaskId) -> bool {
        id < self.next_task_id && !self.tasks.contains_key(&id)
    }

    /// Prunes up to [`TASKS_PRUNED_PER_COMMAND_MAX`] tasks, oldest-ended first, so one
    /// command never holds apply for long; the leader proposes another while more are due.
    pub(crate) fn prune_tasks(
        &mut self,
        now: u64,
        policy: PruneTasks,
    ) -> Result<Outcome, Rejection> {
        let mut pruned = 0u64;
        while pruned < TASKS_PRUNED_PER_COMMAND_MAX {
            let Some(id) = self.next_to_prune(now, &policy) else {
                break;
            };
            self.remove_ended_task(id);
            pruned += 1;
        }
        Ok(Outcome::TasksPruned { count: pruned })
    }

    fn remove_ended_task(&mut self, id: TaskId) {
        let record = self.tasks.remove(&id).expect("the index lists only tasks");
        let at = record
            .ended_at_ms()
            .unwrap_or_else(|| panic!("pruning task {id} in {}", record.state()));
        let task = record.view();
        let removed = self.ended.set_of(task.state).remove(&(at, id));
        assert!(
            removed.is_some(),
            "task {id} was pruned but not indexed as ended at {at}"
        );
        self.unlink_pruned(id);
        self.provider_progress.remove(&id);
        self.pruned_tasks.add(&task);
    }

    /// The lineage of a pruned task. While its parent is held, its link stays: the parent's
    /// count of children is how many it ever submitted (`CHILD_TASKS_PER_TASK_MAX`), which
    /// pruning must not lower. Once the parent goes too, so do the links of its pruned
    /// children; its held children keep theirs, naming a parent that was pruned.
    fn unlink_pruned(&mut self, id: TaskId) {
        let lineage = &mut self.lineage;
        if let Some(parent) = lineage.parent_of.get(&id).copied() {
            if !self.tasks.contains_key(&parent) {
                lineage.parent_of.remove(&id);
                lineage.children.remove(&(parent, id));
            }
        }
        let pruned_children: Vec<TaskId> = lineage
            .children(id)
            .filter(|child| !self.tasks.contains_key(child))
            .collect();
        for child in pruned_children {
            lineage.parent_of.remove(&child);
            lineage.children.remove(&(id, child));
        }
    }

    /// The index of ended tasks lists exactly the ended tasks, each at its end time.
    pub(crate) fn check_ended_index(&self) -> Result<(), String> {
        let mut ended = 0;
        for (id, record) in &self.tasks {
            // A terminal task held live is `check_tasks`' to catch, which runs first.
            let Some(at) = record.ended_at_ms() else {
                continue;
            };
            let state = record.state();
            ended += 1;
            if !self.ended.contains(state, at, *id) {
                return Err(format!("retention: ended task {id} is not indexed at {at}"));
            }
        }
        if ended != self.ended.len() {
            return Err("retention: the index of ended tasks lists tasks that did not end".into());
        }
        let handed_out = self.next_task_id.get() - TaskId::FIRST.get();
        if self.pruned_tasks.count + self.tasks.len() as u64 != handed_out {
            return Err(format!(
                "retention: {} tasks held and {} pruned, but {handed_out} ids handed out",
                self.tasks.len(),
                self.pruned_tasks.count
            ));
        }
        self.pruned_tasks.check()
    }
}
