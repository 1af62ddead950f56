//! The WGL search against a brute-force checker (issue 17 item 6): on thousands of random
//! small histories of the CAS register, of the lease register, of a project's shared slots
//! over several profiles' leases and of a task's lifecycle — about half of them made wrong on
//! purpose — both must give the same verdict. The brute force tries every order of
//! the operations that respects real time (an operation that returned before another was
//! called comes first), with each operation of unknown outcome either placed after its call
//! or left out, and accepts when the model accepts one of them. For the expiring lease the
//! brute force also lets the lease be fenced at any moment, as the leader's sweep may, where
//! the model fences lazily — only when an operation needs it —, so the two also check that
//! laziness loses no linearization.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::model::Model;
use crate::model_cas::{CasRegister, CasState, CasStep};
use crate::model_expiry::{ExpiringLease, ExpiryState, ExpiryStep, Phase};
use crate::model_lease::{LeaseRegister, LeaseState, LeaseStep};
use crate::model_project::{ProjectCapacity, ProjectStep};
use crate::model_task::{is_legal, TaskLifecycle, TaskStep};
use crate::wgl::{TimedStep, Verdict, WglSearch};
use squadron_core::task::TaskState;

/// Histories per model.
const HISTORIES: u64 = 3_000;
/// Operations per history, at most: 7! orders is what a brute force can afford.
const OPS_MAX: usize = 7;

/// Whether some real-time-respecting order of `ops` (unknown outcomes optional) is accepted.
fn brute_force<M: Model>(model: &M, ops: &[TimedStep<M::Step>]) -> bool {
    brute_force_with(model, ops, &|_| None)
}

/// A change of state between operations that no operation asks for (the lease fenced by
/// its expiry), if one may happen in this state.
type Moment<'a, M> = &'a dyn Fn(&<M as Model>::State) -> Option<<M as Model>::State>;

/// [`brute_force`], where `moment` may also change the state between any two operations.
fn brute_force_with<M: Model>(model: &M, ops: &[TimedStep<M::Step>], moment: Moment<M>) -> bool {
    let mut placed = vec![false; ops.len()];
    let mut skipped = vec![false; ops.len()];
    search(
        model,
        ops,
        &model.init(),
        (&mut placed, &mut skipped),
        moment,
    )
}

/// Every operation that may come next, placed (if `model` accepts it in `state`) or, unknown,
/// left out; then the moment's change, and all of that again. A moment must lead to a state
/// where it gives none, so the search ends.
fn search<M: Model>(
    model: &M,
    ops: &[TimedStep<M::Step>],
    state: &M::State,
    (placed, skipped): (&mut [bool], &mut [bool]),
    moment: Moment<M>,
) -> bool {
    let done = |i: usize, placed: &[bool], skipped: &[bool]| placed[i] || skipped[i];
    if (0..ops.len()).all(|i| done(i, placed, skipped) || ops[i].complete_ms.is_none()) {
        return true;
    }
    for i in 0..ops.len() {
        if done(i, placed, skipped) {
            continue;
        }
        // Every known operation that returned before this one's call must be placed first.
        let ready = (0..ops.len()).all(|j| {
            j == i
                || done(j, placed, skipped)
                || ops[j].complete_ms.is_none_or(|c| c >= ops[i].invoke_ms)
        });
        if !ready {
            continue;
        }
        if let Some(next) = model.step(state, &ops[i].step) {
            placed[i] = true;
            let found = search(model, ops, &next, (placed, skipped), moment);
            placed[i] = false;
            if found {
                return true;
            }
        }
        if ops[i].complete_ms.is_none() {
            // An unknown outcome that never took effect.
            skipped[i] = true;
            let found = search(model, ops, state, (placed, skipped), moment);
            skipped[i] = false;
            if found {
                return true;
            }
        }
    }
    moment(state).is_some_and(|next| search(model, ops, &next, (placed, skipped), moment))
}

/// Random call and return times for `n` operations, and each one's linearization point.
fn intervals(rng: &mut StdRng, n: usize) -> Vec<(f64, f64, f64)> {
    (0..n)
        .map(|_| {
            let invoke = rng.gen_range(0.0..10.0);
            let complete = invoke + rng.gen_range(0.1..4.0);
            (invoke, complete, rng.gen_range(invoke..complete))
        })
        .collect()
}

/// Up to [`OPS_MAX`] operations' times ([`intervals`]), and their indices in the order of
/// their linearization points: the order a generator runs them in.
fn schedule(rng: &mut StdRng) -> (Vec<(f64, f64, f64)>, Vec<usize>) {
    let n = rng.gen_range(1..=OPS_MAX);
    let times = intervals(rng, n);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|a, b| times[*a].2.total_cmp(&times[*b].2));
    (times, order)
}

/// Each step run at operation `i`, timed by `times[i]`; an unknown outcome has no return.
fn timed<S>(steps: Vec<Option<(S, bool)>>, times: &[(f64, f64, f64)]) -> Vec<TimedStep<S>> {
    steps
        .into_iter()
        .enumerate()
        .filter_map(|(i, s)| s.map(|s| (i, s)))
        .map(|(i, (step, unknown))| TimedStep {
            id: i,
            step,
            invoke_ms: times[i].0,
            complete_ms: (!unknown).then_some(times[i].1),
        })
        .collect()
}

/// A CAS register history: run at the linearization points, outcomes recorded truthfully,
/// some unknown, then (about half the time) one outcome falsified.
fn cas_history(rng: &mut StdRng) -> Vec<TimedStep<CasStep>> {
    let (times, order) = schedule(rng);
    let n = times.len();
    let mut state = CasState {
        version: 0,
        value: None,
    };
    let mut steps: Vec<Option<CasStep>> = vec![None; n];
    for i in order {
        let step = if rng.gen_bool(0.4) {
            CasStep::Read(state)
        } else {
            let expected = rng.gen_range(0..=2);
            let value = rng.gen_range(0..=3);
            if state.version == expected {
                state = CasState {
                    version: expected + 1,
                    value: Some(value),
                };
                let unknown = rng.gen_bool(0.2);
                CasStep::Cas {
                    expected,
                    value,
                    version: (!unknown).then_some(expected + 1),
                }
            } else {
                CasStep::Conflict {
                    expected,
                    current: Some(state.version),
                }
            }
        };
        steps[i] = Some(step);
    }
    let mut ops: Vec<TimedStep<CasStep>> = steps
        .into_iter()
        .enumerate()
        .map(|(i, step)| {
            let step = step.unwrap_or(CasStep::Read(CasState {
                version: 0,
                value: None,
            }));
            let unknown = matches!(step, CasStep::Cas { version: None, .. });
            TimedStep {
                id: i,
                step,
                invoke_ms: times[i].0,
                complete_ms: (!unknown).then_some(times[i].1),
            }
        })
        .collect();
    if rng.gen_bool(0.5) {
        let i = rng.gen_range(0..n);
        ops[i].step = match ops[i].step.clone() {
            CasStep::Read(s) => CasStep::Read(CasState {
                version: s.version + rng.gen_range(1..=2),
                value: s.value,
            }),
            CasStep::Cas { expected, .. } => CasStep::Conflict {
                expected,
                current: None,
            },
            CasStep::Conflict { expected, .. } => CasStep::Cas {
                expected,
                value: 9,
                version: Some(expected + 1),
            },
        };
    }
    ops
}

/// A lease register history built the same way from random reads, acquires and releases.
fn lease_history(rng: &mut StdRng) -> Vec<TimedStep<LeaseStep>> {
    history(rng, LeaseRegister.init(), lease_step, falsified)
}

/// A history of one register: operations made by `step` on the true state from `state` in the
/// order of their linearization points, outcomes recorded truthfully, some unknown; then,
/// about half the time, one outcome made wrong by `falsify`.
fn history<St: Copy, S: Clone>(
    rng: &mut StdRng,
    mut state: St,
    step: fn(&mut StdRng, St) -> (S, St, bool),
    falsify: fn(&S) -> S,
) -> Vec<TimedStep<S>> {
    let (times, order) = schedule(rng);
    let mut steps: Vec<Option<(S, bool)>> = vec![None; times.len()];
    for i in order {
        let (made, next, unknown) = step(rng, state);
        state = next;
        steps[i] = Some((made, unknown));
    }
    let mut ops = timed(steps, &times);
    if rng.gen_bool(0.5) {
        let i = rng.gen_range(0..ops.len());
        ops[i].step = falsify(&ops[i].step);
    }
    ops
}

/// One random operation on `s`, its true outcome, the state after it, and whether its
/// outcome is recorded as unknown.
fn lease_step(rng: &mut StdRng, s: LeaseState) -> (LeaseStep, LeaseState, bool) {
    let near = |rng: &mut StdRng| s.generation.saturating_sub(1) + rng.gen_range(0..=2);
    match rng.gen_range(0..3) {
        0 => (LeaseStep::Read(s), s, false),
        1 => {
            let expected = near(rng);
            if s.generation != expected {
                let step = LeaseStep::AcquireStale {
                    expected,
                    current: Some(s.generation),
                };
                (step, s, false)
            } else if s.live {
                (LeaseStep::AcquireBusy { expected }, s, false)
            } else if rng.gen_bool(0.1) {
                (LeaseStep::AcquireCapacityFull { expected }, s, false)
            } else {
                let unknown = rng.gen_bool(0.2);
                let step = LeaseStep::Acquire {
                    expected,
                    granted: (!unknown).then_some(expected + 1),
                };
                let next = LeaseState {
                    generation: expected + 1,
                    live: true,
                };
                (step, next, unknown)
            }
        }
        _ => {
            let generation = near(rng);
            if s.live && s.generation == generation {
                let next = LeaseState {
                    generation,
                    live: false,
                };
                (LeaseStep::Release { generation }, next, rng.gen_bool(0.2))
            } else {
                let step = LeaseStep::ReleaseFenced {
                    generation,
                    current: Some(s.generation),
                };
                (step, s, false)
            }
        }
    }
}

/// Slots of the project histories: fewer than the profiles, so admission refuses often.
const PROJECT_SLOTS: u64 = 1;
/// Profiles of the project histories.
const PROJECT_PROFILES: u64 = 3;

/// A project's history: lease operations on random profiles, run against the shared slots
/// (an acquisition beyond them refused `capacity_full` with the true `held`), then, about half
/// the time, one outcome or one reported `held` made wrong.
fn project_history(rng: &mut StdRng) -> Vec<TimedStep<ProjectStep>> {
    let (times, order) = schedule(rng);
    let n = times.len();
    let mut state: BTreeMap<u64, LeaseState> = BTreeMap::new();
    let mut steps: Vec<Option<(ProjectStep, bool)>> = vec![None; n];
    for i in order {
        let profile = rng.gen_range(0..PROJECT_PROFILES);
        let live = state.values().filter(|s| s.live).count() as u64;
        let current = state
            .get(&profile)
            .copied()
            .unwrap_or_else(|| LeaseRegister.init());
        // Half the time a free profile asks while the slots are full: refusals to judge.
        let (step, next, unknown) = if live >= PROJECT_SLOTS && !current.live && rng.gen_bool(0.5) {
            let expected = current.generation;
            let granted = Some(expected + 1);
            (LeaseStep::Acquire { expected, granted }, current, false)
        } else {
            lease_step(rng, current)
        };
        let (step, next, unknown, held) = match step {
            LeaseStep::Acquire { expected, .. } | LeaseStep::AcquireCapacityFull { expected }
                if live >= PROJECT_SLOTS =>
            {
                let full = LeaseStep::AcquireCapacityFull { expected };
                (full, current, false, Some(live))
            }
            // A refusal the register drew at random is a grant while a slot is free.
            LeaseStep::AcquireCapacityFull { expected } => {
                let grant = LeaseStep::Acquire {
                    expected,
                    granted: Some(expected + 1),
                };
                let held = LeaseState {
                    generation: expected + 1,
                    live: true,
                };
                (grant, held, false, None)
            }
            other => (other, next, unknown, None),
        };
        state.insert(profile, next);
        steps[i] = Some((
            ProjectStep {
                profile,
                step,
                held,
            },
            unknown,
        ));
    }
    let mut ops = timed(steps, &times);
    if rng.gen_bool(0.5) {
        let i = rng.gen_range(0..ops.len());
        let op = &mut ops[i].step;
        match op.held {
            Some(held) if rng.gen_bool(0.5) => op.held = Some(held + 1),
            _ => op.step = falsified(&op.step),
        }
    }
    ops
}

/// A task's history: reads and worker reports in a true run of the lifecycle, the scheduler's
/// assignment (PENDING → STAGING, no operation of its own) at a random point, reports mostly
/// from the state the task is in and to its next step, then (about half the time) one answer
/// made wrong.
fn task_history(rng: &mut StdRng) -> Vec<TimedStep<TaskStep>> {
    let (times, order) = schedule(rng);
    let n = times.len();
    let mut state = TaskLifecycle.init();
    let mut steps: Vec<Option<(TaskStep, bool)>> = vec![None; n];
    let any = |rng: &mut StdRng| TaskState::ALL[rng.gen_range(0..TaskState::ALL.len())];
    for i in order {
        if state == TaskState::Pending && rng.gen_bool(0.5) {
            state = TaskState::Staging;
        }
        let step = if rng.gen_bool(0.3) {
            (TaskStep::Read(state), false)
        } else {
            let from = if rng.gen_bool(0.7) { state } else { any(rng) };
            let next = TaskState::ALL
                .into_iter()
                .filter(|to| is_legal(from, *to))
                .nth(rng.gen_range(0..3));
            let to = match next {
                Some(to) if rng.gen_bool(0.8) => to,
                _ => any(rng),
            };
            if state == TaskState::Pending {
                (TaskStep::NotOwner, false)
            } else if from != state {
                let current = Some(state);
                (TaskStep::Stale { from, current }, false)
            } else if is_legal(from, to) {
                state = to;
                (TaskStep::Move { from, to }, rng.gen_bool(0.2))
            } else {
                (TaskStep::Illegal { from, to }, false)
            }
        };
        steps[i] = Some(step);
    }
    let mut ops = timed(steps, &times);
    if rng.gen_bool(0.5) {
        let i = rng.gen_range(0..ops.len());
        ops[i].step = match ops[i].step {
            TaskStep::Read(seen) => TaskStep::Read(
                TaskState::ALL
                    .into_iter()
                    .find(|s| *s != seen && rng.gen_bool(0.3))
                    .unwrap_or(TaskState::Cancelled),
            ),
            TaskStep::Move { from, to } => TaskStep::Illegal { from, to },
            TaskStep::Illegal { from, to } => TaskStep::Move { from, to },
            TaskStep::Stale { from, .. } => TaskStep::Move { from, to: any(rng) },
            TaskStep::NotOwner => TaskStep::Read(TaskState::Running),
        };
        // Only a move may be of unknown outcome: a refusal or a read always returned.
        if !matches!(ops[i].step, TaskStep::Move { .. }) && ops[i].complete_ms.is_none() {
            ops[i].complete_ms = Some(ops[i].invoke_ms + 0.1);
        }
    }
    ops
}

/// The step with its outcome made wrong.
fn falsified(step: &LeaseStep) -> LeaseStep {
    match step.clone() {
        LeaseStep::Read(s) => LeaseStep::Read(LeaseState {
            generation: s.generation,
            live: !s.live,
        }),
        LeaseStep::Acquire { expected, granted } => LeaseStep::Acquire {
            expected,
            granted: Some(granted.unwrap_or(expected) + 2),
        },
        LeaseStep::AcquireStale { expected, current } => LeaseStep::AcquireStale {
            expected,
            current: Some(current.unwrap_or(expected) + 1),
        },
        LeaseStep::AcquireBusy { expected } => LeaseStep::AcquireCapacityFull { expected },
        LeaseStep::AcquireCapacityFull { expected } => LeaseStep::AcquireBusy { expected },
        LeaseStep::Release { generation } => LeaseStep::ReleaseFenced {
            generation,
            current: None,
        },
        LeaseStep::ReleaseFenced { generation, .. } => LeaseStep::Release { generation },
    }
}

fn agree<M: Model>(model: &M, ops: &[TimedStep<M::Step>], seed: u64) -> bool {
    agree_with(model, ops, seed, brute_force(model, ops))
}

/// The search's verdict on `ops` equals `brute`, the brute force's; returns it.
fn agree_with<M: Model>(model: &M, ops: &[TimedStep<M::Step>], seed: u64, brute: bool) -> bool {
    let wgl = WglSearch::default().check(model, ops);
    assert!(
        !matches!(wgl, Verdict::Unknown { .. }),
        "seed {seed}: the search gave up on {} operations",
        ops.len()
    );
    assert_eq!(
        wgl.is_linearizable(),
        brute,
        "seed {seed}: WGL says {wgl:?}, the brute force {brute}, on {ops:#?}"
    );
    brute
}

#[test]
fn wgl_agrees_with_brute_force_on_random_cas_histories() {
    let mut valid = 0;
    for seed in 0..HISTORIES {
        let mut rng = StdRng::seed_from_u64(seed);
        valid += u64::from(agree(&CasRegister, &cas_history(&mut rng), seed));
    }
    // Both kinds were met in numbers, or the comparison proves little.
    assert!(
        (HISTORIES / 5..HISTORIES * 4 / 5).contains(&valid),
        "{valid} of {HISTORIES} linearizable"
    );
}

#[test]
fn wgl_agrees_with_brute_force_on_random_lease_histories() {
    let mut valid = 0;
    for seed in 0..HISTORIES {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x1ea5e);
        valid += u64::from(agree(&LeaseRegister, &lease_history(&mut rng), seed));
    }
    assert!(
        (HISTORIES / 5..HISTORIES * 4 / 5).contains(&valid),
        "{valid} of {HISTORIES} linearizable"
    );
}

#[test]
fn wgl_agrees_with_brute_force_on_random_project_histories() {
    let model = ProjectCapacity {
        max_active: PROJECT_SLOTS,
    };
    let (mut valid, mut refused) = (0, 0);
    for seed in 0..HISTORIES {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5107);
        let ops = project_history(&mut rng);
        refused += ops
            .iter()
            .filter(|op| matches!(op.step.step, LeaseStep::AcquireCapacityFull { .. }))
            .count();
        valid += u64::from(agree(&model, &ops, seed));
    }
    assert!(
        (HISTORIES / 5..HISTORIES * 4 / 5).contains(&valid),
        "{valid} of {HISTORIES} linearizable"
    );
    // The shared slots were full often enough for their refusals to be judged.
    assert!(
        refused as u64 > HISTORIES / 10,
        "{refused} capacity_full refusals"
    );
}

#[test]
fn wgl_agrees_with_brute_force_on_random_task_histories() {
    let mut valid = 0;
    let mut kinds = [0usize; 4];
    for seed in 0..HISTORIES {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7a5c);
        let ops = task_history(&mut rng);
        for op in &ops {
            match op.step {
                TaskStep::Move { .. } => kinds[0] += 1,
                TaskStep::Stale { .. } => kinds[1] += 1,
                TaskStep::Illegal { .. } => kinds[2] += 1,
                TaskStep::NotOwner => kinds[3] += 1,
                TaskStep::Read(_) => {}
            }
        }
        valid += u64::from(agree(&TaskLifecycle, &ops, seed));
    }
    assert!(
        (HISTORIES / 5..HISTORIES * 4 / 5).contains(&valid),
        "{valid} of {HISTORIES} linearizable"
    );
    // Every kind of answer was judged in numbers.
    assert!(
        kinds.iter().all(|k| *k > 200),
        "moves, stale, illegal, not owner: {kinds:?}"
    );
}

#[test]
fn the_brute_force_itself_tells_good_from_bad() {
    let read = |version, invoke_ms, complete_ms| TimedStep {
        id: 0,
        step: CasStep::Read(CasState {
            version,
            value: (version > 0).then_some(5),
        }),
        invoke_ms,
        complete_ms: Some(complete_ms),
    };
    let write = TimedStep {
        id: 1,
        step: CasStep::Cas {
            expected: 0,
            value: 5,
            version: Some(1),
        },
        invoke_ms: 2.0,
        complete_ms: Some(3.0),
    };
    // A read of version 1 that returned before the write was called: impossible.
    assert!(!brute_force(
        &CasRegister,
        &[read(1, 0.0, 1.0), write.clone()]
    ));
    // Concurrent with it: fine.
    assert!(brute_force(
        &CasRegister,
        &[read(1, 0.0, 2.5), write.clone()]
    ));
    // An unknown write may explain a later read, or be left out.
    let unknown = TimedStep {
        complete_ms: None,
        step: CasStep::Cas {
            expected: 0,
            value: 5,
            version: None,
        },
        ..write
    };
    assert!(brute_force(
        &CasRegister,
        &[unknown.clone(), read(1, 4.0, 5.0)]
    ));
    assert!(brute_force(&CasRegister, &[unknown, read(0, 4.0, 5.0)]));
}

/// The expiring lease without its lazy fence: every operation judged on the state as it is.
/// The brute force fences it explicitly, at any moment ([`fence`]).
struct EagerExpiry;

impl Model for EagerExpiry {
    type State = ExpiryState;
    type Step = ExpiryStep;

    fn name(&self) -> &'static str {
        "eager-expiring-lease"
    }

    fn init(&self) -> ExpiryState {
        ExpiringLease.init()
    }

    fn parse(
        &self,
        op: &crate::operation::Operation,
    ) -> Result<Option<ExpiryStep>, crate::model::ModelError> {
        ExpiringLease.parse(op)
    }

    fn step(&self, s: &ExpiryState, step: &ExpiryStep) -> Option<ExpiryState> {
        ExpiringLease.apply(s, step)
    }
}

/// The leader's sweep: a live lease may be fenced at any moment once past its expiry.
fn fence(s: &ExpiryState) -> Option<ExpiryState> {
    (s.phase == Phase::Live).then_some(ExpiryState {
        generation: s.generation,
        phase: Phase::Fenced,
    })
}

/// An expiring lease's history: reads, acquires, releases, renewals and reaps run on the true
/// state, which the sweep fences now and then between them (unseen by the history).
fn expiry_history(rng: &mut StdRng) -> Vec<TimedStep<ExpiryStep>> {
    let swept = |rng: &mut StdRng, s: ExpiryState| {
        let s = if rng.gen_bool(0.3) {
            fence(&s).unwrap_or(s)
        } else {
            s
        };
        expiry_step(rng, s)
    };
    history(rng, ExpiringLease.init(), swept, expiry_falsified)
}

/// One random operation on `s` (as [`lease_step`], with renewals and reaps), its true
/// outcome, the state after it, and whether its outcome is recorded as unknown.
fn expiry_step(rng: &mut StdRng, s: ExpiryState) -> (ExpiryStep, ExpiryState, bool) {
    let near = |rng: &mut StdRng| s.generation.saturating_sub(1) + rng.gen_range(0..=2);
    let live = |g: u64| s.phase == Phase::Live && s.generation == g;
    let fenced_answer = |generation| ExpiryStep::ReleaseFenced {
        generation,
        current: Some(s.generation),
    };
    match rng.gen_range(0..5) {
        0 => (ExpiryStep::Read(s), s, false),
        1 => {
            let expected = near(rng);
            if s.generation != expected {
                let current = Some(s.generation);
                (ExpiryStep::AcquireStale { expected, current }, s, false)
            } else if s.phase != Phase::Idle {
                (ExpiryStep::AcquireBusy { expected }, s, false)
            } else if rng.gen_bool(0.1) {
                (ExpiryStep::AcquireCapacityFull { expected }, s, false)
            } else {
                let unknown = rng.gen_bool(0.2);
                let granted = (!unknown).then_some(expected + 1);
                let next = ExpiryState {
                    generation: expected + 1,
                    phase: Phase::Live,
                };
                (ExpiryStep::Acquire { expected, granted }, next, unknown)
            }
        }
        2 => {
            let generation = near(rng);
            if live(generation) {
                let next = ExpiryState {
                    generation,
                    phase: Phase::Idle,
                };
                (ExpiryStep::Release { generation }, next, rng.gen_bool(0.2))
            } else {
                (fenced_answer(generation), s, false)
            }
        }
        3 => {
            let generation = near(rng);
            if !live(generation) {
                (fenced_answer(generation), s, false)
            } else if rng.gen_bool(0.5) {
                // Past its expiry, not yet swept: refused, still live.
                (ExpiryStep::RenewExpired { generation }, s, false)
            } else {
                (ExpiryStep::Renew { generation }, s, false)
            }
        }
        _ if s.phase == Phase::Fenced => {
            let generation = s.generation;
            let next = ExpiryState {
                generation,
                phase: Phase::Idle,
            };
            (ExpiryStep::Reap { generation }, next, rng.gen_bool(0.2))
        }
        // Reap evidence for a lease that is not fenced is refused, which says nothing.
        _ => (ExpiryStep::Read(s), s, false),
    }
}

/// The step with its outcome made wrong.
fn expiry_falsified(step: &ExpiryStep) -> ExpiryStep {
    match step.clone() {
        ExpiryStep::Read(s) => ExpiryStep::Read(ExpiryState {
            generation: s.generation,
            phase: match s.phase {
                Phase::Idle => Phase::Live,
                Phase::Live | Phase::Fenced => Phase::Idle,
            },
        }),
        ExpiryStep::Acquire { expected, granted } => ExpiryStep::Acquire {
            expected,
            granted: Some(granted.unwrap_or(expected) + 2),
        },
        ExpiryStep::AcquireStale { expected, current } => ExpiryStep::AcquireStale {
            expected,
            current: Some(current.unwrap_or(expected) + 1),
        },
        ExpiryStep::AcquireBusy { expected } => ExpiryStep::AcquireCapacityFull { expected },
        ExpiryStep::AcquireCapacityFull { expected } => ExpiryStep::AcquireBusy { expected },
        ExpiryStep::Release { generation } => ExpiryStep::ReleaseFenced {
            generation,
            current: None,
        },
        ExpiryStep::ReleaseFenced { generation, .. } => ExpiryStep::Release { generation },
        ExpiryStep::Renew { generation } | ExpiryStep::RenewExpired { generation } => {
            ExpiryStep::Renew {
                generation: generation + 1,
            }
        }
        ExpiryStep::Reap { generation } => ExpiryStep::Reap {
            generation: generation + 1,
        },
    }
}

#[test]
fn wgl_agrees_with_brute_force_on_random_expiring_lease_histories() {
    let (mut valid, mut fenced) = (0, 0);
    for seed in 0..HISTORIES {
        let mut rng = StdRng::seed_from_u64(seed ^ 0xe8b1);
        let ops = expiry_history(&mut rng);
        fenced += ops
            .iter()
            .filter(|op| {
                matches!(
                    op.step,
                    ExpiryStep::Reap { .. } | ExpiryStep::ReleaseFenced { .. }
                )
            })
            .count();
        // The search on the lazy model, the brute force on the eager one with every fence.
        let brute = brute_force_with(&EagerExpiry, &ops, &fence);
        valid += u64::from(agree_with(&ExpiringLease, &ops, seed, brute));
    }
    assert!(
        (HISTORIES / 5..HISTORIES * 4 / 5).contains(&valid),
        "{valid} of {HISTORIES} linearizable"
    );
    // Fences were judged in numbers: reaps of fenced leases and refusals as fenced.
    assert!(fenced as u64 > HISTORIES / 2, "{fenced} fenced answers");
}

/// The eager brute force needs its fences: without them it refuses a reap that only an
/// expiry explains, which the lazy model accepts.
#[test]
fn an_expiry_only_the_sweep_explains_needs_the_fence() {
    let at = |id, step, invoke_ms, complete_ms| TimedStep {
        id,
        step,
        invoke_ms,
        complete_ms: Some(complete_ms),
    };
    let ops = [
        at(
            0,
            ExpiryStep::Acquire {
                expected: 0,
                granted: Some(1),
            },
            0.0,
            1.0,
        ),
        at(1, ExpiryStep::Reap { generation: 1 }, 2.0, 3.0),
    ];
    assert!(WglSearch::default()
        .check(&ExpiringLease, &ops)
        .is_linearizable());
    assert!(brute_force_with(&EagerExpiry, &ops, &fence));
    assert!(!brute_force(&EagerExpiry, &ops));
}
