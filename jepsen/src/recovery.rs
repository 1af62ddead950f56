//! "After healing, writes must succeed within a stated bound": for each heal, the time to the
//! first successful write invoked after it; and to the first successful read, with a bound of
//! its own, much shorter (a read needs no free slot: a workload whose writes are mostly
//! refused, such as `expiry`'s at full capacity, still reads at once). The runner keeps every
//! quiet gap at least as long as the read bound, so every heal but the last is judged.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::anomaly::{Anomaly, AnomalyKind};

use crate::history::NemesisInterval;
use crate::operation::Operation;

/// After a heal, a read must succeed within this long unless the run says otherwise: over
/// twice the slowest seen here (a partition of the leader healed: ~0.8 s), and the issue's
/// "reads succeed within 1 s after a partition heals" with room for a loaded CI machine.
pub const READ_RECOVERY_MS_DEFAULT: u64 = 2_000;
pub const READ_RECOVERY_MS_MIN: u64 = 100;
/// Added to the read bound after a heal that started every node at once (`crash-all`): no node
/// kept the cluster's leadership, so the first read waits for the processes to start on their
/// fault filesystems, replay their logs and hold a first election — 1.3–2.5 s measured here on
/// a loaded machine, against the 30–800 ms of a partition healed.
pub const COLD_CLUSTER_START_MS: u64 = 3_000;
/// The faults whose heal starts every node from its disk.
const COLD_START_FAULTS: [&str; 1] = ["crash-all"];
pub const READ_RECOVERY_MS_MAX: u64 = 60_000;

/// The operations that write.
pub const WRITE_FS: [&str; 8] = [
    "acquire",
    "release",
    "renew",
    "reap",
    "cas",
    "append",
    "submit",
    "transition",
];

/// The recovery after one heal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealRecovery {
    pub fault: String,
    pub healed_at_ms: f64,
    /// From the heal to the completion of the first successful write invoked after it;
    /// `None` when the next fault (or the end of the workload) came first.
    pub first_write_ms: Option<f64>,
    /// The same for the first successful read (absent in results written before reads were
    /// counted).
    #[serde(default)]
    pub first_read_ms: Option<f64>,
}

/// From `healed` to the earliest completion of an operation of `ops` invoked in
/// `[healed, next)`.
fn first_after(ops: &[&Operation], healed: f64, next: f64) -> Option<f64> {
    ops.iter()
        .filter(|o| o.invoke_ms >= healed && o.invoke_ms < next)
        .filter_map(|o| o.complete_ms)
        .fold(None, |best: Option<f64>, c| {
            Some(best.map_or(c, |b| b.min(c)))
        })
        .map(|c| c - healed)
}

/// From `healed` to the earliest success of `ops` that completed in `[healed, next)`, whenever
/// it was invoked: a client held up by a request it sent during the fault (up to its 6 s
/// timeout) cannot start another, yet the answer that request gets after the heal shows the
/// cluster serving again.
fn first_completed_after(ops: &[&Operation], healed: f64, next: f64) -> Option<f64> {
    ops.iter()
        .filter_map(|o| o.complete_ms)
        .filter(|c| *c >= healed && *c < next)
        .fold(None, |best: Option<f64>, c| {
            Some(best.map_or(c, |b| b.min(c)))
        })
        .map(|c| c - healed)
}

/// Measures every heal but the last (after the last, the harness probes with its own writes,
/// since the clients have stopped): its first write against `bound_ms`, its first read — in
/// a workload that reads at all — against `read_bound_ms`.
#[derive(Debug, Clone, Copy)]
pub struct RecoveryCheck {
    pub bound_ms: f64,
    pub read_bound_ms: f64,
}

/// Whether a heal's first success (`first_ms` after it) came later than `bound_ms`; none
/// within a window longer than the bound is late too, none in a shorter one cannot be judged.
fn late(first_ms: Option<f64>, window_ms: f64, bound_ms: f64) -> bool {
    match first_ms {
        Some(ms) => ms > bound_ms,
        None => window_ms > bound_ms,
    }
}

fn unavailable(
    what: &str,
    fault: &str,
    healed: f64,
    first_ms: Option<f64>,
    bound_ms: f64,
) -> Anomaly {
    Anomaly::new(
        AnomalyKind::UnavailableAfterHeal,
        None,
        format!(
            "after the heal of {fault} at {healed:.0} ms the first {what} succeeded {}; the bound is {bound_ms:.0} ms",
            first_ms.map_or("never".to_string(), |ms| format!("after {ms:.0} ms")),
        ),
        Vec::new(),
    )
}

/// The read bound after the heal of `fault`: a cold start of the whole cluster gets
/// `COLD_CLUSTER_START_MS` more. The runner keeps the quiet gap after each heal at least this
/// long, so every heal but the last is judged.
pub fn read_bound_after(fault: &str, read_bound: Duration) -> Duration {
    if COLD_START_FAULTS.contains(&fault) {
        read_bound + Duration::from_millis(COLD_CLUSTER_START_MS)
    } else {
        read_bound
    }
}

impl RecoveryCheck {
    fn read_bound_for(&self, fault: &str) -> f64 {
        let bound = Duration::from_secs_f64(self.read_bound_ms / 1000.0);
        read_bound_after(fault, bound).as_secs_f64() * 1000.0
    }

    pub fn check(
        &self,
        ops: &[Operation],
        faults: &[NemesisInterval],
    ) -> (Vec<HealRecovery>, Vec<Anomaly>) {
        let writes: Vec<&Operation> = ops
            .iter()
            .filter(|o| o.is_ok() && WRITE_FS.contains(&o.f.as_str()))
            .collect();
        let reads: Vec<&Operation> = ops.iter().filter(|o| o.is_ok() && o.f == "read").collect();
        // Whether the workload reads at all, failed reads included: one whose every read
        // failed is judged, not excused.
        let reading = ops.iter().any(|o| o.f == "read");
        let mut out = Vec::new();
        let mut anomalies = Vec::new();
        for (i, fault) in faults.iter().enumerate() {
            let Some(healed) = fault.end_ms else { continue };
            let Some(next) = faults.get(i + 1).map(|f| f.start_ms) else {
                continue;
            };
            let first_write_ms = first_after(&writes, healed, next);
            if late(first_write_ms, next - healed, self.bound_ms) {
                anomalies.push(unavailable(
                    "write",
                    &fault.fault,
                    healed,
                    first_write_ms,
                    self.bound_ms,
                ));
            }
            let first_read_ms = first_completed_after(&reads, healed, next);
            let read_bound_ms = self.read_bound_for(&fault.fault);
            if reading && late(first_read_ms, next - healed, read_bound_ms) {
                anomalies.push(unavailable(
                    "read",
                    &fault.fault,
                    healed,
                    first_read_ms,
                    read_bound_ms,
                ));
            }
            out.push(HealRecovery {
                fault: fault.fault.clone(),
                healed_at_ms: healed,
                first_write_ms,
                first_read_ms,
            });
        }
        (out, anomalies)
    }
}
