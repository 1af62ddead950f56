//! What the state machine's work costs, for `/metrics`: how long each apply took and waited
//! for the lock, how long snapshots took to build and install, and how big the last one was.
//! DESIGN §7 holds apply to a p99 of 1 ms and no write waiting more than 50 ms while a
//! snapshot is built; these are the figures that show it (`squadron bench scale` reads them).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

/// Counters and histograms of the state machine. Shared (`Arc`) between the state machine,
/// its snapshot builder and the server's readers.
#[derive(Debug)]
pub struct MachineStats {
    /// Each applied batch of entries, from asking for the write lock to releasing it.
    pub apply_seconds: Histogram,
    /// The part of it spent waiting for the lock (behind readers and a snapshot's copy).
    pub apply_lock_wait_seconds: Histogram,
    /// Each log entry applied, its own time under the lock: DESIGN §7's "apply p99" (etcd's
    /// apply duration is per entry too). An entry may carry many concurrent proposals
    /// (`Command::Batch`); a batch of entries is what `apply_seconds` times.
    pub apply_entry_seconds: Histogram,
    /// The CPU time the applying thread spent on each entry: the entry's own work, without
    /// the time the machine gave its core to something else meanwhile.
    pub apply_entry_cpu_seconds: Histogram,
    /// Entries applied.
    pub entries_applied: AtomicU64,
    /// Each snapshot built: the copy under the lock, the encoding and the write to disk.
    pub snapshot_build_seconds: Histogram,
    /// The copy of the state taken under the read lock (what a concurrent apply waits for).
    pub snapshot_copy_seconds: Histogram,
    /// Each snapshot received and installed: checks, the write to disk and the decoding.
    pub snapshot_install_seconds: Histogram,
    /// Bytes of the last snapshot this node built or installed (its file on disk).
    pub snapshot_bytes: AtomicU64,
}

impl Default for MachineStats {
    fn default() -> Self {
        // 10 µs doubling to about 2.6 s: an apply is tens of microseconds, a stall hundreds
        // of milliseconds.
        let apply = || Histogram::new(exponential_buckets(0.000_01, 2.0, 19));
        // 1 µs doubling to about 4 s: one entry is microseconds.
        let entry = || Histogram::new(exponential_buckets(0.000_001, 2.0, 22));
        // 1 ms doubling to about 65 s: a snapshot of a million tasks takes seconds.
        let snapshot = || Histogram::new(exponential_buckets(0.001, 2.0, 17));
        MachineStats {
            apply_seconds: apply(),
            apply_lock_wait_seconds: apply(),
            apply_entry_seconds: entry(),
            apply_entry_cpu_seconds: entry(),
            entries_applied: AtomicU64::new(0),
            snapshot_build_seconds: snapshot(),
            snapshot_copy_seconds: apply(),
            snapshot_install_seconds: snapshot(),
            snapshot_bytes: AtomicU64::new(0),
        }
    }
}

/// This thread's CPU time so far, in seconds.
pub(crate) fn thread_cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

impl MachineStats {
    /// Records one applied batch that asked for the lock at `asked` and got it at `locked`.
    pub(crate) fn applied(&self, asked: Instant, locked: Instant, entries: u64) {
        self.apply_lock_wait_seconds
            .observe(locked.duration_since(asked).as_secs_f64());
        self.apply_seconds.observe(asked.elapsed().as_secs_f64());
        self.entries_applied.fetch_add(entries, Ordering::Relaxed);
    }

    /// Records a snapshot of `bytes` built or installed, `started` when it began.
    pub(crate) fn snapshot_written(&self, histogram: &Histogram, started: Instant, bytes: usize) {
        histogram.observe(started.elapsed().as_secs_f64());
        self.snapshot_bytes.store(bytes as u64, Ordering::Relaxed);
    }
}
