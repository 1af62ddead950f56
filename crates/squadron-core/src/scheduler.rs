//! The pure scheduling function the leader calls to place PENDING tasks on workers.

use std::collections::BTreeMap;

use crate::command::Assignment;
use crate::ids::WorkerId;
use crate::state::State;

/// Proposes up to `max` assignments, taking PENDING tasks by priority then age. A task goes to
/// the alive worker with the most free slots that offers its runtime (ties: lowest worker id);
/// a project-placed task goes only to the worker hosting its project's sandbox. A task no worker
/// can take now is skipped, so it does not hold back those behind it.
///
/// The result is a proposal: `AssignTasks` re-checks every entry when it is applied.
pub fn schedule(state: &State, now_ms: u64, max: usize) -> Vec<Assignment> {
    // The leader's clock, never behind the state's: apply re-checks with the stamped time.
    let now = now_ms.max(state.clock_ms());
    let mut free: BTreeMap<&WorkerId, u32> = state
        .workers()
        .filter(|w| w.accepts_work(now))
        .map(|w| (&w.id, w.free_slots()))
        .collect();
    let mut out = Vec::new();
    for task_id in state.pending_queue() {
        if out.len() >= max || free.values().all(|n| *n == 0) {
            break;
        }
        let Some(task) = state.task(task_id) else {
            continue;
        };
        let best = free
            .iter()
            .filter(|(_, n)| **n > 0)
            .filter(|(w, _)| state.assignment_refusal(now, task, w).is_none())
            // max_by_key keeps the last maximum; iterate in reverse id order so ties go to the
            // lowest id.
            .rev()
            .max_by_key(|(_, n)| **n)
            .map(|(w, _)| (*w).clone());
        if let Some(worker) = best {
            if let Some(n) = free.get_mut(&worker) {
                *n -= 1;
            }
            out.push(Assignment {
                task: task_id,
                worker,
            });
        }
    }
    out
}
