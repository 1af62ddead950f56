//! The retention of ended tasks (`apply_retention`): what is pruned, in what order, what is
//! never pruned, and what the state keeps of the pruned.

use proptest::prelude::*;

use super::*;
use crate::access::AgentIdentity;
use crate::command::{Assignment, CancelTask, PruneTasks, WorkerHeartbeat};
use crate::limits::TASKS_PRUNED_PER_COMMAND_MAX;
use crate::snapshot::{decode_snapshot, encode_snapshot};
use crate::task::TaskState::*;

const PRESERVE: &str = "lifecycle:\n  failure_action: preserve\n";

fn policy(age_ms_max: u64, count_max: u64) -> PruneTasks {
    PruneTasks {
        age_ms_max,
        count_max,
    }
}

fn prune(fx: &mut Fx, policy: PruneTasks) -> u64 {
    match fx.ok(Command::PruneTasks(policy)) {
        Outcome::TasksPruned { count } => count,
        o => panic!("unexpected {o:?}"),
    }
}

/// A task submitted and cancelled while queued: it ends at once, CANCELLED.
fn cancelled(fx: &mut Fx) -> TaskId {
    let t = fx.submit("");
    fx.ok(Command::CancelTask(CancelTask {
        task: t,
        reason: "test".into(),
    }));
    t
}

/// A task whose sandbox the worker kept: FAILED_PRESERVED.
fn preserved(fx: &mut Fx) -> TaskId {
    let t = fx.submit(PRESERVE);
    // Time may have passed since the worker was last heard: it must not look silent.
    fx.ok(Command::WorkerHeartbeat(WorkerHeartbeat {
        worker: worker(),
    }));
    fx.ok(Command::AssignTasks(AssignTasks {
        assignments: vec![Assignment {
            task: t,
            worker: worker(),
        }],
    }));
    // The provider's account goes with the task when it is pruned (the checker refuses one
    // of an unknown task).
    fx.ok(Command::ReportProgressV2(
        crate::command::ReportProgressV2 {
            counts: crate::command::ReportProgress {
                task: t,
                worker: worker(),
                attempt: 1,
                stdout_bytes: 1,
                stderr_bytes: 0,
                lines: 1,
                events: 0,
            },
            provider: Some(crate::task::ProviderProgress {
                tool_calls: 1,
                current_tool: Some("Bash".into()),
                ..Default::default()
            }),
        },
    ));
    assert!(report(fx, t, Staging, FailedPreserved, None).is_ok());
    t
}

fn held(fx: &Fx) -> Vec<TaskId> {
    fx.state.tasks(None).map(|t| t.id).collect()
}

#[test]
fn tasks_ended_past_the_age_are_pruned_and_the_rest_are_kept() {
    let mut fx = Fx::new();
    let old = cancelled(&mut fx);
    fx.advance(10_000);
    let newer = cancelled(&mut fx);
    let queued = fx.submit("");
    fx.advance(45_000);
    assert!(!fx.state.prune_due(fx.now, &policy(60_000, 100)));
    assert_eq!(
        prune(&mut fx, policy(60_000, 100)),
        0,
        "nothing is 60 s old yet"
    );
    fx.advance(5_000);
    assert!(fx.state.prune_due(fx.now, &policy(60_000, 100)));
    assert_eq!(prune(&mut fx, policy(60_000, 100)), 1);
    assert_eq!(held(&fx), vec![newer, queued]);
    assert!(fx.state.task_was_pruned(old));
    assert!(!fx.state.task_was_pruned(newer));
    assert!(
        !fx.state.task_was_pruned(TaskId::new(99).unwrap()),
        "never existed"
    );

    fx.advance(3_600_000);
    assert_eq!(prune(&mut fx, policy(60_000, 100)), 1);
    assert_eq!(held(&fx), vec![queued], "a queued task is never pruned");
    let pruned = fx.state.pruned_tasks();
    assert_eq!(pruned.count, 2);
    assert_eq!(pruned.entered.get(&Pending), Some(&2));
    assert_eq!(pruned.entered.get(&Cancelled), Some(&2));
    assert_eq!(pruned.durations[&Cancelled].count, 2);
}

#[test]
fn the_count_prunes_the_first_ended_and_spares_preserved_sandboxes_until_their_age() {
    let mut fx = Fx::new();
    let kept_sandbox = preserved(&mut fx);
    let ordinary: Vec<TaskId> = (0..3)
        .map(|_| {
            fx.advance(1_000);
            cancelled(&mut fx)
        })
        .collect();
    assert_eq!(prune(&mut fx, policy(3_600_000, 1)), 2);
    assert_eq!(held(&fx), vec![kept_sandbox, ordinary[2]]);
    assert_eq!(prune(&mut fx, policy(3_600_000, 0)), 1);
    assert_eq!(
        held(&fx),
        vec![kept_sandbox],
        "a count of 0 keeps no ordinary task, and never pushes out a preserved one"
    );
    fx.advance(3_600_000);
    assert_eq!(prune(&mut fx, policy(3_600_000, 0)), 1);
    assert!(fx.state.task_was_pruned(kept_sandbox));
    assert_eq!(fx.state.pruned_tasks().durations[&FailedPreserved].count, 1);
}

#[test]
fn one_command_prunes_at_most_its_bound_and_more_stay_due() {
    let mut fx = Fx::new();
    let n = TASKS_PRUNED_PER_COMMAND_MAX + 5;
    for _ in 0..n {
        cancelled(&mut fx);
    }
    assert_eq!(
        prune(&mut fx, policy(3_600_000, 0)),
        TASKS_PRUNED_PER_COMMAND_MAX
    );
    assert!(fx.state.prune_due(fx.now, &policy(3_600_000, 0)));
    assert_eq!(prune(&mut fx, policy(3_600_000, 0)), 5);
    assert!(!fx.state.prune_due(fx.now, &policy(3_600_000, 0)));
    assert_eq!(fx.state.pruned_tasks().count, n);
}

#[test]
fn a_pruned_child_still_counts_against_its_running_parent_until_the_parent_goes() {
    let mut fx = Fx::new();
    let parent = fx.submit("");
    fx.ok(Command::AssignTasks(AssignTasks {
        assignments: vec![Assignment {
            task: parent,
            worker: worker(),
        }],
    }));
    let agent = Subject::Agent(AgentIdentity::Task(parent));
    let Outcome::TaskSubmitted { task: child } = fx.ok_as(
        &agent,
        Command::SubmitTask(SubmitTask {
            spec: Box::new(spec("")),
        }),
    ) else {
        panic!()
    };
    fx.ok(Command::CancelTask(CancelTask {
        task: child,
        reason: "test".into(),
    }));
    assert_eq!(prune(&mut fx, policy(3_600_000, 0)), 1);
    assert_eq!(held(&fx), vec![parent]);
    assert_eq!(
        fx.state.lineage().children(parent).collect::<Vec<_>>(),
        vec![child],
        "the parent's count of submitted children does not drop"
    );
    fx.ok(Command::CancelTask(CancelTask {
        task: parent,
        reason: "test".into(),
    }));
    assert!(report(&mut fx, parent, Staging, Cancelled, None).is_ok());
    assert_eq!(prune(&mut fx, policy(3_600_000, 0)), 1);
    assert!(fx.state.task_was_pruned(parent));
    assert_eq!(fx.state.lineage().children(parent).count(), 0);
    assert_eq!(fx.state.lineage().parent(child), None);
}

#[test]
fn a_snapshot_after_pruning_decodes_to_the_same_state_and_prunes_the_same_next() {
    let mut fx = Fx::new();
    for _ in 0..4 {
        fx.advance(1_000);
        cancelled(&mut fx);
    }
    preserved(&mut fx);
    assert_eq!(prune(&mut fx, policy(3_600_000, 2)), 2);
    let decoded = decode_snapshot(&encode_snapshot(&fx.state)).expect("decodes");
    assert_eq!(
        decoded, fx.state,
        "the index is rebuilt, the figures travel"
    );
    let mut other = Fx {
        state: decoded,
        now: fx.now,
    };
    assert_eq!(prune(&mut other, policy(3_600_000, 0)), 2);
    assert_eq!(prune(&mut fx, policy(3_600_000, 0)), 2);
    assert_eq!(other.state, fx.state);
}

#[test]
fn a_snapshot_whose_figures_are_malformed_is_refused() {
    let mut fx = Fx::new();
    cancelled(&mut fx);
    prune(&mut fx, policy(3_600_000, 0));
    let mut broken = fx.state.clone();
    broken.pruned_tasks.count += 1;
    let e = decode_snapshot(&encode_snapshot(&broken)).unwrap_err();
    assert!(e.to_string().contains("ids handed out"), "{e}");
    let mut broken = fx.state.clone();
    broken
        .pruned_tasks
        .durations
        .get_mut(&Cancelled)
        .expect("tallied")
        .buckets
        .pop();
    let e = decode_snapshot(&encode_snapshot(&broken)).unwrap_err();
    assert!(e.to_string().contains("malformed"), "{e}");
}

/// What a test step does.
#[derive(Debug, Clone)]
enum Step {
    Submit,
    CancelQueued(usize),
    Preserve,
    Advance(u64),
    Prune { age_ms_max: u64, count_max: u64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => Just(Step::Submit),
        3 => (0usize..8).prop_map(Step::CancelQueued),
        1 => Just(Step::Preserve),
        2 => (1u64..20_000).prop_map(Step::Advance),
        2 => (1u64..40_000, 0u64..6).prop_map(|(age_ms_max, count_max)| Step::Prune {
            age_ms_max,
            count_max,
        }),
    ]
}

/// The reference: every ended task with its end time and whether its sandbox was kept. Pruning
/// is written out plainly: sort, then take from the front while the policy says so.
#[derive(Debug, Default)]
struct Model {
    ended: Vec<(u64, TaskId, bool)>,
}

impl Model {
    fn prune(&mut self, now: u64, age_ms_max: u64, count_max: u64) -> u64 {
        let mut pruned = 0;
        while pruned < TASKS_PRUNED_PER_COMMAND_MAX {
            self.ended.sort();
            let ordinary = self.ended.iter().filter(|e| !e.2).count() as u64;
            let next = self.ended.iter().position(|(at, _, kept)| {
                at + age_ms_max <= now || (!kept && ordinary > count_max)
            });
            // The first candidate in end order is the one pruned: an old preserved task goes
            // before a younger ordinary one, and a young preserved one is skipped.
            let Some(i) = next else { break };
            self.ended.remove(i);
            pruned += 1;
        }
        pruned
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn pruning_matches_the_reference(steps in prop::collection::vec(step(), 1..60)) {
        let mut fx = Fx::new();
        let mut model = Model::default();
        let mut queued: Vec<TaskId> = Vec::new();
        for s in steps {
            match s {
                Step::Submit => queued.push(fx.submit("")),
                Step::CancelQueued(i) if !queued.is_empty() => {
                    let t = queued.remove(i % queued.len());
                    fx.ok(Command::CancelTask(CancelTask { task: t, reason: "p".into() }));
                    model.ended.push((fx.now, t, false));
                }
                Step::CancelQueued(_) => {}
                Step::Preserve => {
                    let t = preserved(&mut fx);
                    model.ended.push((fx.now, t, true));
                }
                Step::Advance(ms) => fx.advance(ms),
                Step::Prune { age_ms_max, count_max } => {
                    let want = model.prune(fx.now, age_ms_max, count_max);
                    prop_assert_eq!(prune(&mut fx, policy(age_ms_max, count_max)), want);
                }
            }
            let mut expect: Vec<TaskId> = model.ended.iter().map(|e| e.1).collect();
            expect.extend(&queued);
            expect.sort();
            prop_assert_eq!(held(&fx), expect);
        }
    }
}
