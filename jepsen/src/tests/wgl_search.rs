//! The search's own limits: the state bound answers `unknown` instead of hanging.

use crate::model_cas::{CasRegister, CasStep};
use crate::wgl::{TimedStep, Verdict, WglSearch};

/// Many concurrent writes of unknown outcome and distinct values: a large state space.
fn wide_history(n: u64) -> Vec<TimedStep<CasStep>> {
    let mut v: Vec<TimedStep<CasStep>> = (0..n)
        .map(|i| TimedStep {
            id: i as usize,
            step: CasStep::Cas {
                expected: i % 4,
                value: i,
                version: None,
            },
            invoke_ms: 0.0,
            complete_ms: None,
        })
        .collect();
    // One read that nothing can explain forces the search to try everything.
    v.push(TimedStep {
        id: n as usize,
        step: CasStep::Read(crate::model_cas::CasState {
            version: 99,
            value: Some(1),
        }),
        invoke_ms: 1.0,
        complete_ms: Some(2.0),
    });
    v
}

#[test]
fn bound_reached_answers_unknown() {
    let search = WglSearch { states_max: 50 };
    let verdict = search.check(&CasRegister, &wide_history(40));
    assert!(
        matches!(verdict, Verdict::Unknown { states } if states > 50),
        "{verdict:?}"
    );
}

#[test]
fn unbounded_enough_answers_not_linearizable() {
    let verdict = WglSearch::default().check(&CasRegister, &wide_history(8));
    assert!(
        matches!(verdict, Verdict::NotLinearizable { .. }),
        "{verdict:?}"
    );
}

#[test]
fn long_sequential_history_is_fast() {
    // 5 000 sequential CAS operations: the search is linear when there is no concurrency.
    let steps: Vec<TimedStep<CasStep>> = (0..5_000u64)
        .map(|i| TimedStep {
            id: i as usize,
            step: CasStep::Cas {
                expected: i,
                value: i,
                version: Some(i + 1),
            },
            invoke_ms: i as f64,
            complete_ms: Some(i as f64 + 0.5),
        })
        .collect();
    let started = std::time::Instant::now();
    let verdict = WglSearch::default().check(&CasRegister, &steps);
    assert!(verdict.is_linearizable(), "{verdict:?}");
    assert!(
        started.elapsed().as_secs() < 30,
        "took {:?}",
        started.elapsed()
    );
}
