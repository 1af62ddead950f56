//! The replicated clock as this node last applied it, and when: published after every apply
//! and snapshot install, read without the state machine's lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Microseconds of this process's monotonic clock since its first reading: the one monotonic
/// time the store and the server's cluster clock compare.
pub fn monotonic_us() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = ORIGIN.get_or_init(Instant::now);
    u64::try_from(origin.elapsed().as_micros()).unwrap_or(u64::MAX)
}

#[derive(Debug)]
pub struct ReplicatedClock {
    clock_ms: AtomicU64,
    /// `monotonic_us` when `clock_ms` was published.
    applied_us: AtomicU64,
}

impl ReplicatedClock {
    pub fn new(clock_ms: u64) -> ReplicatedClock {
        ReplicatedClock {
            clock_ms: AtomicU64::new(clock_ms),
            applied_us: AtomicU64::new(monotonic_us()),
        }
    }

    /// The clock of the entries applied just now.
    pub fn publish(&self, clock_ms: u64) {
        // The time first: a reader that sees the new clock sees this time or a later one,
        // so the floor it computes can only come out low, never high.
        self.applied_us.store(monotonic_us(), Ordering::Release);
        self.clock_ms.store(clock_ms, Ordering::Release);
    }

    pub fn clock_ms(&self) -> u64 {
        self.clock_ms.load(Ordering::Acquire)
    }

    /// The replicated clock plus the monotonic time since it was applied here: the cluster's
    /// time now is at least this (the leader stamped it before this node applied it), give
    /// or take the leader's slew. 0 while nothing was ever applied.
    pub fn floor_ms(&self) -> u64 {
        let clock = self.clock_ms.load(Ordering::Acquire);
        if clock == 0 {
            return 0;
        }
        let since = monotonic_us().saturating_sub(self.applied_us.load(Ordering::Acquire));
        clock.saturating_add(since / 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_runs_on_from_the_last_applied_clock() {
        let c = ReplicatedClock::new(0);
        assert_eq!(c.floor_ms(), 0, "nothing applied yet");
        c.publish(1_000_000);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let floor = c.floor_ms();
        assert!((1_000_020..1_001_000).contains(&floor), "{floor}");
        c.publish(2_000_000);
        assert!(c.floor_ms() < 2_000_010);
    }
}
