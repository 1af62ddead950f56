//! "The replicated clock never jumps": every clock fault reads how far the leader's replicated
//! clock runs ahead of real time (`replicated_clock_ahead_ms`, once the skew has settled and
//! again just before the heal). The nodes' cluster clock follows the monotonic clock and
//! slews toward a skewed wall clock by at most 10% of the elapsed time, so over a run it can
//! gain at most that fraction of the run's length; a skewed leader that stamps its wall clock
//! moves it by the whole skew.

use serde_json::Value;

use crate::anomaly::{Anomaly, AnomalyKind};
use crate::event::Process;
use crate::history::History;

/// The most the nodes' cluster clock gains on real time, per mille of the elapsed time (the
/// node's `clock::SLEW_PER_MILLE_MAX`).
pub const CLOCK_SLEW_PER_MILLE_MAX: f64 = 100.0;
/// Added to the bound: the history's time starts after the cluster's first stamp (setup),
/// and a reading is a status request's round trip late.
pub const CLOCK_AHEAD_SLACK_MS: f64 = 2_000.0;

/// One reading of a clock fault.
#[derive(Debug, Clone, PartialEq)]
pub struct ClockReading {
    /// When the nemesis recorded it (ms since the history began).
    pub at_ms: f64,
    pub ahead_ms: i64,
}

/// Every reading in the nemesis's events: the fault's (`detail.replicated_clock_ahead_ms`)
/// and the heal's (`detail.clock_ahead_ms`).
pub fn readings(history: &History) -> Vec<ClockReading> {
    history
        .events
        .iter()
        .filter(|e| e.process == Process::NEMESIS)
        .filter_map(|e| {
            let detail = e.value.get("detail")?;
            let ahead = detail
                .get("replicated_clock_ahead_ms")
                .or_else(|| detail.get("clock_ahead_ms"))
                .and_then(Value::as_i64)?;
            Some(ClockReading {
                at_ms: e.time_ms,
                ahead_ms: ahead,
            })
        })
        .collect()
}

/// The largest lead the cluster clock may have `at_ms` into the history.
pub fn ahead_bound_ms(at_ms: f64) -> f64 {
    at_ms * CLOCK_SLEW_PER_MILLE_MAX / 1000.0 + CLOCK_AHEAD_SLACK_MS
}

/// A `clock-jump` anomaly for each reading past its bound.
pub fn check(history: &History) -> Vec<Anomaly> {
    readings(history)
        .into_iter()
        .filter(|r| r.ahead_ms as f64 > ahead_bound_ms(r.at_ms))
        .map(|r| {
            Anomaly::new(
                AnomalyKind::ClockJump,
                None,
                format!(
                    "at {:.0} ms the replicated clock ran {} ms ahead of real time; the cluster \
                     clock may gain at most {:.0} ms by then",
                    r.at_ms,
                    r.ahead_ms,
                    ahead_bound_ms(r.at_ms)
                ),
                Vec::new(),
            )
        })
        .collect()
}
