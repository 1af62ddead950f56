//! The closed-loop load generator both systems share: N clients, each sending its next
//! operation as soon as the previous one answered, for a warm-up and then a measured window.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::histogram::{LatencyHistogram, LatencySummary};

/// How long a client waits after a failed operation before the next one, so a cluster
/// without a leader is not flooded by clients spinning on instant refusals.
pub(crate) const ERROR_BACKOFF_MS: u64 = 20;

/// The window of one load run, shared by its clients.
#[derive(Debug)]
pub(crate) struct LoadControl {
    measure_from: Instant,
    deadline: Instant,
    stop: AtomicBool,
}

impl LoadControl {
    /// A run that starts now, measures after `warmup` and ends `duration` later.
    pub(crate) fn new(warmup: Duration, duration: Duration) -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Self {
            measure_from: now + warmup,
            deadline: now + warmup + duration,
            stop: AtomicBool::new(false),
        })
    }

    pub(crate) fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed) && Instant::now() < self.deadline
    }

    /// Ends the run before its deadline (clients finish their current operation).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    fn window(&self, ended: Instant) -> Duration {
        ended
            .min(self.deadline)
            .saturating_duration_since(self.measure_from)
    }
}

/// How one operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpResult {
    /// Done as asked.
    Ok,
    /// A completed decision that says no (capacity full, profile busy): counted as an
    /// operation, with its latency.
    Refused,
    /// No decision (transport failure, no leader, timeout): counted apart, no latency.
    Error,
}

/// One client's tally.
#[derive(Debug)]
pub(crate) struct Recorder {
    control: Arc<LoadControl>,
    tally: LoadTally,
}

impl Recorder {
    pub(crate) fn running(&self) -> bool {
        self.control.running()
    }

    /// Records an operation that started at `started` and ended now; operations that ended
    /// inside the measured window count (those that started in the warm-up too: dropping them
    /// would undercount when an operation takes a good part of the window).
    pub(crate) fn record(&mut self, started: Instant, result: OpResult) {
        let ended = Instant::now();
        if ended < self.control.measure_from || ended > self.control.deadline {
            return;
        }
        let t = &mut self.tally;
        match result {
            OpResult::Ok => t.ok += 1,
            OpResult::Refused => t.refused += 1,
            OpResult::Error => {
                t.errors += 1;
                return;
            }
        }
        let micros = u64::try_from(ended.duration_since(started).as_micros()).unwrap_or(u64::MAX);
        t.histogram.record(micros);
    }

    /// Keeps the first error message of the run, to show what the errors were.
    pub(crate) fn note_error(&mut self, message: String) {
        if self.tally.first_error.is_none() {
            self.tally.first_error = Some(message);
        }
    }

    /// Waits out the error back-off.
    pub(crate) async fn back_off(&self) {
        tokio::time::sleep(Duration::from_millis(ERROR_BACKOFF_MS)).await;
    }
}

/// The merged tally of a run.
#[derive(Debug, Default)]
pub(crate) struct LoadTally {
    pub(crate) histogram: LatencyHistogram,
    pub(crate) ok: u64,
    pub(crate) refused: u64,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
}

impl LoadTally {
    fn merge(&mut self, other: &LoadTally) {
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
        self.histogram.merge(&other.histogram);
        self.ok += other.ok;
        self.refused += other.refused;
        self.errors += other.errors;
    }
}

/// The figures of one system at one point.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PointStats {
    /// Completed operations per second of the measured window (ok + refused).
    pub ops_per_s: f64,
    pub ok: u64,
    pub refused: u64,
    pub errors: u64,
    pub window_s: f64,
    pub latency: LatencySummary,
    /// The first error met, if any (all errors are counted in `errors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// Runs `clients` clients until the control's deadline (or stop); `start_client(i, recorder)`
/// is client i's loop, which returns its recorder when `recorder.running()` turns false.
pub(crate) async fn run_clients<F, Fut>(
    control: Arc<LoadControl>,
    clients: usize,
    mut start_client: F,
) -> PointStats
where
    F: FnMut(usize, Recorder) -> Fut,
    Fut: Future<Output = Recorder> + Send + 'static,
{
    let mut handles = Vec::with_capacity(clients);
    for i in 0..clients {
        let recorder = Recorder {
            control: control.clone(),
            tally: LoadTally::default(),
        };
        handles.push(tokio::spawn(start_client(i, recorder)));
    }
    let mut total = LoadTally::default();
    for h in handles {
        match h.await {
            Ok(r) => total.merge(&r.tally),
            // A client that panicked ended its loop; its operations are lost, and it counts
            // as one error so the report shows something went wrong.
            Err(_) => total.errors += 1,
        }
    }
    let window = control.window(Instant::now());
    let secs = window.as_secs_f64();
    let done = total.ok + total.refused;
    PointStats {
        ops_per_s: if secs > 0.0 { done as f64 / secs } else { 0.0 },
        ok: total.ok,
        refused: total.refused,
        errors: total.errors,
        window_s: secs,
        latency: total.histogram.summary(),
        first_error: total.first_error,
    }
}

/// Watches for the first successful write that started after a node was killed.
#[derive(Debug, Default)]
pub(crate) struct FailoverProbe {
    state: Mutex<ProbeState>,
}

#[derive(Debug, Default)]
struct ProbeState {
    killed_at: Option<Instant>,
    first_write: Option<Instant>,
}

impl FailoverProbe {
    pub(crate) fn killed(&self, at: Instant) {
        if let Ok(mut s) = self.state.lock() {
            s.killed_at = Some(at);
        }
    }

    /// A write that started at `started` succeeded just now.
    pub(crate) fn write_ok(&self, started: Instant) {
        let now = Instant::now();
        if let Ok(mut s) = self.state.lock() {
            if s.killed_at.is_some_and(|k| started >= k) && s.first_write.is_none() {
                s.first_write = Some(now);
            }
        }
    }

    /// Time from the kill to the first write that started after it and succeeded.
    pub(crate) fn recovery(&self) -> Option<Duration> {
        let s = self.state.lock().ok()?;
        Some(s.first_write?.saturating_duration_since(s.killed_at?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn closed_loop_counts_only_the_measured_window() {
        let control = LoadControl::new(Duration::from_millis(100), Duration::from_millis(300));
        let stats = run_clients(control, 4, |i, mut rec| async move {
            while rec.running() {
                let started = Instant::now();
                tokio::time::sleep(Duration::from_millis(5)).await;
                let result = if i == 3 {
                    OpResult::Refused
                } else {
                    OpResult::Ok
                };
                rec.record(started, result);
            }
            rec
        })
        .await;
        // 4 clients × ~300 ms / ~5 ms: at most 240, fewer on a loaded machine.
        let done = stats.ok + stats.refused;
        assert!((20..=245).contains(&done), "{stats:?}");
        assert!(stats.refused > 0 && stats.refused < stats.ok, "{stats:?}");
        assert_eq!(stats.latency.count, done);
        assert!(stats.latency.p50_ms >= 5.0, "{stats:?}");
        assert!((stats.window_s - 0.3).abs() < 0.05, "{stats:?}");
        assert!((stats.ops_per_s - done as f64 / stats.window_s).abs() < 1e-6);
    }

    #[test]
    fn errors_count_without_latency_and_warmup_is_dropped() {
        let control = LoadControl::new(Duration::from_millis(0), Duration::from_secs(60));
        let mut rec = Recorder {
            control,
            tally: LoadTally::default(),
        };
        rec.record(Instant::now(), OpResult::Error);
        rec.record(Instant::now(), OpResult::Ok);
        assert_eq!((rec.tally.ok, rec.tally.errors), (1, 1));
        assert_eq!(rec.tally.histogram.count(), 1);
        let warm = LoadControl::new(Duration::from_secs(60), Duration::from_secs(60));
        let mut rec = Recorder {
            control: warm,
            tally: LoadTally::default(),
        };
        rec.record(Instant::now(), OpResult::Ok);
        assert_eq!(rec.tally.ok, 0);
        // Started in the warm-up, ended in the window: it counts, with its whole latency.
        let short = LoadControl::new(Duration::from_millis(5), Duration::from_secs(60));
        let mut rec = Recorder {
            control: short,
            tally: LoadTally::default(),
        };
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        rec.record(started, OpResult::Ok);
        assert_eq!(rec.tally.ok, 1);
        assert!(rec.tally.histogram.percentile_us(0.5) >= 20_000);
    }

    #[test]
    fn probe_ignores_writes_started_before_the_kill() {
        let probe = FailoverProbe::default();
        let before = Instant::now();
        probe.write_ok(before);
        assert_eq!(probe.recovery(), None);
        std::thread::sleep(Duration::from_millis(2));
        probe.killed(Instant::now());
        probe.write_ok(before);
        assert_eq!(probe.recovery(), None);
        let after = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        probe.write_ok(after);
        assert!(probe.recovery().unwrap() >= Duration::from_millis(5));
    }
}
