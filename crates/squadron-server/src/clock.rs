//! The cluster clock: the time a node stamps on the entries it proposes (`CommandEnvelope::at_ms`)
//! and reads deadlines against (token expiry, worker liveness, sweeps).
//!
//! Apply takes `max(state clock, stamp)`, so the replicated clock never goes back. Stamps read
//! straight from the leader's wall clock made that a hazard: a wall clock set a day ahead
//! moved the replicated clock a day at once (every lease expired, every worker was lost, every
//! idempotency record pruned), and once the wall clock was put right the replicated clock stood
//! still for as long as the jump (no lease expired until real time caught up).
//!
//! So no stamp is a wall-clock reading. Every node runs the cluster clock forward by its
//! monotonic clock from the latest replicated time it has seen, and slews it toward its own
//! wall clock by at most [`SLEW_PER_MILLE_MAX`] of the elapsed time. Between any two readings
//! the clock advances by the monotonic time between them within that rate, whatever the wall
//! clock does, so a lease's TTL is honoured to within that rate on every leader, and a skewed
//! wall clock moves the replicated clock by at most that fraction of the time it stays skewed.
//! Where the replicated clock is ahead of this node's (a faster leader stamped it), the node
//! takes it: it cannot stamp below it anyway.
//!
//! A node that has not yet seen a replicated time (a cluster that has applied no command)
//! reads its wall clock. Otherwise its clock starts from the replicated time plus the
//! monotonic time since this node applied it (`ReplicatedClock::floor_ms`), and the leader
//! proposes a sweep at least every `CLOCK_TICK_MS` so that time is never old: an idle
//! follower that restarts starts within a tick of the cluster's time, not at the last write's.
//! A whole cluster that was down for an hour resumes from the replicated time: every lease,
//! heartbeat and token keeps the rest of its life (as etcd does with its leases), and the
//! clock converges on wall time at the slew rate; `squadron_clock_offset_seconds` on
//! `/metrics` shows the distance.

use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use squadron_store::StateReader;

/// The most the cluster clock gains on or loses against the monotonic clock while it slews
/// toward the wall clock, per mille of the elapsed time. A lease's TTL is honoured to within
/// this; a TTL three times the renewal interval leaves ample room.
pub const SLEW_PER_MILLE_MAX: u64 = 100;
/// A node warns when its wall clock and the cluster clock are further apart than this.
pub const OFFSET_WARN_MS_MIN: u64 = 5_000;
/// And repeats the warning at most this often.
pub const OFFSET_WARN_INTERVAL_MS: u64 = 60_000;
/// The leader proposes a sweep when the replicated clock is this old, busy or not, so the
/// replicated time a node starts its clock from is never older.
pub const CLOCK_TICK_MS: u64 = 10_000;

/// Milliseconds since the Unix epoch by this machine's wall clock; 0 for a clock set before it.
/// Only the cluster clock and displays of local time read it.
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The slewing rule, free of any clock so it can be tested on its own: each reading gives the
/// monotonic time (µs since any fixed origin), the wall clock and the replicated clock (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlewedClock {
    /// The last reading, in µs: ms would let frequent readings round every slew away.
    last_us: u64,
    /// The monotonic time of the last reading, in µs.
    last_mono_us: u64,
}

impl SlewedClock {
    /// Starts at the replicated clock: the cluster's time, whatever this wall clock says.
    pub fn start(mono_us: u64, replicated_ms: u64) -> SlewedClock {
        SlewedClock {
            last_us: replicated_ms.saturating_mul(1000),
            last_mono_us: mono_us,
        }
    }

    /// The clock now, in ms: the last reading plus the monotonic time since, slewed toward the
    /// wall clock by at most `SLEW_PER_MILLE_MAX` of that time, and never below the replicated
    /// clock or the last reading.
    pub fn read(&mut self, mono_us: u64, wall_ms: u64, replicated_ms: u64) -> u64 {
        let elapsed_us = mono_us.saturating_sub(self.last_mono_us);
        let free_us = self.last_us.saturating_add(elapsed_us);
        let slew_us = elapsed_us.saturating_mul(SLEW_PER_MILLE_MAX) / 1000;
        let wall_us = wall_ms.saturating_mul(1000);
        let slewed_us = if wall_us >= free_us {
            free_us.saturating_add((wall_us - free_us).min(slew_us))
        } else {
            free_us - (free_us - wall_us).min(slew_us)
        };
        self.last_us = slewed_us
            .max(replicated_ms.saturating_mul(1000))
            .max(self.last_us);
        self.last_mono_us = self.last_mono_us.max(mono_us);
        self.last_us / 1000
    }
}

/// One node's cluster clock (see the module's comment).
pub struct ClusterClock {
    state: StateReader,
    slewed: Mutex<ClockState>,
}

#[derive(Debug, Default)]
struct ClockState {
    /// `None` until the replicated clock has a time.
    clock: Option<SlewedClock>,
    /// When the offset warning was last logged, by this clock's monotonic time (µs).
    warned_mono_us: Option<u64>,
}

impl std::fmt::Debug for ClusterClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClock")
            .field("state", &self.slewed)
            .finish_non_exhaustive()
    }
}

impl ClusterClock {
    pub fn new(state: StateReader) -> ClusterClock {
        ClusterClock {
            state,
            slewed: Mutex::new(ClockState::default()),
        }
    }

    /// The cluster time now, in ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.reading().0
    }

    /// This node's wall clock minus the cluster clock, in ms (`/metrics`).
    pub fn offset_ms(&self) -> i64 {
        let (now, wall) = self.reading();
        i64::try_from(wall).unwrap_or(i64::MAX) - i64::try_from(now).unwrap_or(i64::MAX)
    }

    /// The cluster clock and the wall clock it was read beside.
    fn reading(&self) -> (u64, u64) {
        let replicated = self.state.clock_ms();
        let wall = wall_ms();
        let mono = squadron_store::monotonic_us();
        #[cfg(feature = "jepsen-faults")]
        if crate::jepsen_fault::wall_clock_stamps() {
            return (wall, wall);
        }
        let mut guard = self.slewed.lock().unwrap_or_else(PoisonError::into_inner);
        let now = match (&mut guard.clock, replicated) {
            // No command applied yet: the first stamp of a new cluster is the wall clock.
            (None, 0) => return (wall, wall),
            (None, _) => {
                let floor = self.state.clock_floor_ms().max(replicated);
                guard.clock = Some(SlewedClock::start(mono, floor));
                floor
            }
            (Some(clock), _) => clock.read(mono, wall, replicated),
        };
        if wall.abs_diff(now) >= OFFSET_WARN_MS_MIN {
            let due = guard.warned_mono_us.is_none_or(|at| {
                mono.saturating_sub(at) >= OFFSET_WARN_INTERVAL_MS.saturating_mul(1000)
            });
            if due {
                guard.warned_mono_us = Some(mono);
                tracing::warn!(
                    wall_ms = wall,
                    cluster_ms = now,
                    "this node's wall clock and the cluster clock are {} ms apart; the cluster \
                     clock slews toward it by at most {SLEW_PER_MILLE_MAX} per mille",
                    i128::from(wall) - i128::from(now)
                );
            }
        }
        (now, wall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DAY_MS: u64 = 86_400_000;
    const T0_MS: u64 = 1_800_000_000_000;

    #[test]
    fn it_starts_at_the_replicated_clock_whatever_the_wall_says() {
        let mut c = SlewedClock::start(0, T0_MS);
        assert_eq!(c.read(0, T0_MS + DAY_MS, T0_MS), T0_MS);
    }

    #[test]
    fn a_wall_clock_a_day_ahead_moves_it_by_the_slew_rate_only() {
        let mut c = SlewedClock::start(0, T0_MS);
        let mut now = 0;
        for s in 1..=60u64 {
            now = c.read(s * 1_000_000, T0_MS + s * 1000 + DAY_MS, T0_MS);
        }
        // 60 s of monotonic time, 10% more at most.
        assert_eq!(now, T0_MS + 66_000);
    }

    #[test]
    fn after_a_skew_heals_it_keeps_running_and_converges() {
        let mut c = SlewedClock::start(0, T0_MS);
        // 10 s with the wall clock 120 s ahead.
        for s in 1..=10u64 {
            c.read(s * 1_000_000, T0_MS + s * 1000 + 120_000, T0_MS);
        }
        let ahead = c.read(10_000_000, T0_MS + 10_000, T0_MS);
        assert_eq!(ahead, T0_MS + 11_000);
        // Healed: the clock runs at 90% until the wall clock catches up, never standing still.
        let next = c.read(11_000_000, T0_MS + 11_000, T0_MS);
        assert_eq!(next, T0_MS + 11_900);
        let later = c.read(30_000_000, T0_MS + 30_000, T0_MS);
        assert_eq!(later, T0_MS + 30_000);
    }

    #[test]
    fn a_replicated_clock_ahead_of_it_is_taken() {
        let mut c = SlewedClock::start(0, T0_MS);
        assert_eq!(c.read(1_000_000, T0_MS + 1000, T0_MS + 5000), T0_MS + 5000);
        // And the clock runs on from there.
        assert_eq!(c.read(2_000_000, T0_MS + 2000, T0_MS + 5000), T0_MS + 5900);
    }

    #[test]
    fn a_wall_clock_behind_slows_it_but_never_turns_it_back() {
        let mut c = SlewedClock::start(0, T0_MS);
        assert_eq!(c.read(1_000_000, T0_MS - DAY_MS, T0_MS), T0_MS + 900);
        assert_eq!(c.read(1_000_000, T0_MS - DAY_MS, T0_MS), T0_MS + 900);
    }

    #[test]
    fn readings_microseconds_apart_still_slew() {
        let mut c = SlewedClock::start(0, T0_MS);
        let mut now = 0;
        for us in (10..=1_000_000u64).step_by(10) {
            now = c.read(us, T0_MS + DAY_MS, T0_MS);
        }
        assert_eq!(now, T0_MS + 1100);
    }

    proptest! {
        /// Whatever the wall clock and the replicated clock do, each reading is at least the
        /// last and the replicated clock, and it runs with the monotonic clock within the slew
        /// rate unless the replicated clock pulled it ahead.
        #[test]
        fn it_never_goes_back_and_keeps_its_rate(
            steps in proptest::collection::vec(
                (0u64..5_000_000, -(DAY_MS as i64)..DAY_MS as i64, 0u64..3_000), 1..60)
        ) {
            let mut c = SlewedClock::start(0, T0_MS);
            let (mut mono, mut last, mut replicated) = (0u64, T0_MS, T0_MS);
            for (dt_us, wall_offset, replicated_step) in steps {
                mono += dt_us;
                let wall = (T0_MS + mono / 1000).saturating_add_signed(wall_offset);
                let before = c;
                replicated += replicated_step;
                let now = c.read(mono, wall, replicated);
                prop_assert!(now >= last && now >= replicated);
                let free_us = before.last_us + dt_us;
                let slew_us = dt_us * SLEW_PER_MILLE_MAX / 1000;
                let high = (free_us + slew_us).max(replicated * 1000);
                prop_assert!(c.last_us <= high);
                prop_assert!(c.last_us + slew_us >= free_us);
                last = now;
            }
        }
    }
}
