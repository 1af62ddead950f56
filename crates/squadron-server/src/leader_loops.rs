//! Work only the leader does: proposing sweeps (lease expiry, lost workers, idempotency
//! pruning) and assignments from the scheduler. Both re-check on apply, so a stale view or a
//! deposed leader can at worst propose a no-op.

use std::sync::Arc;
use std::time::Duration;

use squadron_core::access::Subject;
use squadron_core::command::{AssignTasks, LeaderSweep};
use squadron_core::limits::ASSIGNMENTS_PER_BATCH_MAX;
use squadron_core::scheduler::{schedule, Plan};
use squadron_core::Command;
use tokio::sync::watch;

use crate::node::ControlNode;
use crate::raft_view;

/// The shortest time between two scheduler rounds that commands woke.
const PLACEMENT_ROUND_GAP_MS: u64 = 10;

pub fn spawn(
    node: Arc<ControlNode>,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut sweep =
            tokio::time::interval(Duration::from_millis(node.config.server.sweep_interval_ms));
        let mut place = tokio::time::interval(Duration::from_millis(
            node.config.server.schedule_interval_ms,
        ));
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        place.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut term_start = TermStart::default();
        let mut last_woken = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = sweep.tick() => {
                    let Some(term) = raft_view::led_term(&node.raft, node.id) else {
                        continue;
                    };
                    let term_started_ms = term_start.observe(term, node.clock.now_ms());
                    if sweep_due(&node, term_started_ms) {
                        let command = Command::LeaderSweep(LeaderSweep { term_started_ms });
                        if let Err(e) = node.propose_here(Subject::System, command, None).await {
                            tracing::debug!(error = ?e, "sweep not proposed");
                        }
                    }
                    prune_ended_tasks(&node).await;
                }
                _ = place.tick() => place_tasks(&node).await,
                // A submission or a freed slot is placed now, not at the next tick (up to
                // `schedule_interval_ms` later); rounds at most every `PLACEMENT_ROUND_GAP_MS`,
                // so a stream of submissions that cannot be placed does not rescan the
                // queue for each one.
                _ = node.writes.placement_wake().notified() => {
                    let gap = Duration::from_millis(PLACEMENT_ROUND_GAP_MS);
                    tokio::time::sleep(gap.saturating_sub(last_woken.elapsed())).await;
                    last_woken = tokio::time::Instant::now();
                    place_tasks(&node).await;
                }
            }
        }
    })
}

/// One scheduler round on the leader: the plan, proposed.
async fn place_tasks(node: &ControlNode) {
    if !node.is_leader() {
        return;
    }
    let now = node.clock.now_ms();
    let plan = node
        .state
        .with_state(|s| schedule(s, now, ASSIGNMENTS_PER_BATCH_MAX));
    for command in plan_commands(plan) {
        if let Err(e) = node.propose_here(Subject::System, command, None).await {
            tracing::debug!(error = ?e, "assignments not proposed");
        }
    }
}

/// The commands that carry a plan: dedicated and project tasks are assigned by commands of their
/// own (a project task's assignment grants its profile's lease).
fn plan_commands(plan: Plan) -> Vec<Command> {
    let Plan { dedicated, project } = plan;
    let mut out = Vec::new();
    if !dedicated.is_empty() {
        out.push(Command::AssignTasks(AssignTasks {
            assignments: dedicated,
        }));
    }
    if !project.is_empty() {
        out.push(Command::AssignProjectTasks(AssignTasks {
            assignments: project,
        }));
    }
    out
}

/// Most `PruneTasks` proposed per sweep tick: each prunes up to
/// `TASKS_PRUNED_PER_COMMAND_MAX` (1,000), so a backlog (a lowered `count_max`) drains at up to
/// 8,000 tasks a tick, each command a short apply between other writes.
const PRUNE_COMMANDS_PER_TICK_MAX: usize = 8;

/// The retention of ended tasks, by this node's `[retention.terminal_tasks]`.
async fn prune_ended_tasks(node: &ControlNode) {
    let policy = node.config.retention.terminal_tasks.command();
    for _ in 0..PRUNE_COMMANDS_PER_TICK_MAX {
        let now = node.clock.now_ms();
        if !node.state.with_state(|s| s.prune_due(now, &policy)) {
            return;
        }
        let command = Command::PruneTasks(policy.clone());
        match node.propose_here(Subject::System, command, None).await {
            Ok(response) => tracing::debug!(?response, "ended tasks pruned"),
            Err(e) => {
                tracing::debug!(error = ?e, "pruning not proposed");
                return;
            }
        }
    }
}

/// Whether the leader proposes a sweep now: something is due, or the replicated clock is a
/// tick old (`clock::CLOCK_TICK_MS`: a node starting its clock never starts further back).
fn sweep_due(node: &ControlNode, term_started_ms: u64) -> bool {
    let now = node.clock.now_ms();
    let replicated = node.state.clock_ms();
    now.saturating_sub(replicated) >= crate::clock::CLOCK_TICK_MS
        || node.state.with_state(|s| s.sweep_due(now, term_started_ms))
}

/// When this process first saw itself lead its current term, on the cluster clock. Seen at a
/// sweep tick, so up to one interval late: the grace it gives workers errs long, never short.
/// A restarted leader that openraft resumes in the same term starts afresh, as it should: its
/// workers could not reach it while it was down.
#[derive(Debug, Default)]
struct TermStart {
    seen: Option<(u64, u64)>,
}

impl TermStart {
    fn observe(&mut self, term: u64, now_ms: u64) -> u64 {
        match self.seen {
            Some((t, since_ms)) if t == term => since_ms,
            _ => {
                self.seen = Some((term, now_ms));
                now_ms
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TermStart;

    #[test]
    fn a_term_starts_when_first_seen_and_a_new_term_starts_again() {
        let mut start = TermStart::default();
        assert_eq!(start.observe(3, 1_000), 1_000);
        assert_eq!(start.observe(3, 5_000), 1_000);
        assert_eq!(
            start.observe(4, 9_000),
            9_000,
            "a later term is a new start"
        );
        assert_eq!(start.observe(4, 12_000), 9_000);
    }
}
