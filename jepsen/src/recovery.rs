//! "After healing, writes must succeed within a stated bound": for each heal, the time to the
//! first successful write invoked after it; and, measured beside it, to the first successful
//! read (a workload whose writes are mostly refused, such as `expiry`'s at full capacity, can
//! be available long before it writes).

use serde::{Deserialize, Serialize};

use crate::anomaly::{Anomaly, AnomalyKind};
use crate::history::NemesisInterval;
use crate::operation::Operation;

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

/// Measures every heal but the last (after the last, the harness probes with its own writes,
/// since the clients have stopped) against `bound_ms`.
#[derive(Debug, Clone, Copy)]
pub struct RecoveryCheck {
    pub bound_ms: f64,
}

impl RecoveryCheck {
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
        let mut out = Vec::new();
        let mut anomalies = Vec::new();
        for (i, fault) in faults.iter().enumerate() {
            let Some(healed) = fault.end_ms else { continue };
            let Some(next) = faults.get(i + 1).map(|f| f.start_ms) else {
                continue;
            };
            let first_write_ms = first_after(&writes, healed, next);
            let late = match first_write_ms {
                Some(ms) => ms > self.bound_ms,
                // No write succeeded although the quiet window was longer than the bound.
                None => next - healed > self.bound_ms,
            };
            if late {
                anomalies.push(Anomaly::new(
                    AnomalyKind::UnavailableAfterHeal,
                    None,
                    format!(
                        "after the heal of {} at {healed:.0} ms the first write succeeded {}; the bound is {:.0} ms",
                        fault.fault,
                        first_write_ms.map_or("never".to_string(), |ms| format!("after {ms:.0} ms")),
                        self.bound_ms
                    ),
                    Vec::new(),
                ));
            }
            out.push(HealRecovery {
                fault: fault.fault.clone(),
                healed_at_ms: healed,
                first_write_ms,
                first_read_ms: first_after(&reads, healed, next),
            });
        }
        (out, anomalies)
    }
}
