//! When this node last heard from a leader: every append-entries or snapshot a leader sends
//! it, unless the answer is that the sender's vote is stale. The election driver of the server
//! (`squadron-server/src/election_driver.rs`) campaigns only once that is older than the
//! voters' leader lease, which openraft's own timer cannot be told.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct LeaderContact {
    origin: Instant,
    /// Milliseconds after `origin` of the last contact.
    last_ms: AtomicU64,
}

impl Default for LeaderContact {
    fn default() -> Self {
        LeaderContact {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
}

impl LeaderContact {
    /// A leader was heard just now.
    pub fn touch(&self) {
        self.last_ms.fetch_max(self.elapsed_ms(), Ordering::Relaxed);
    }

    /// How long ago a leader was last heard (since this node started, if never).
    pub fn quiet_for(&self) -> Duration {
        let last = self.last_ms.load(Ordering::Relaxed);
        Duration::from_millis(self.elapsed_ms().saturating_sub(last))
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_touch_resets_the_quiet_time() {
        let c = LeaderContact::default();
        std::thread::sleep(Duration::from_millis(30));
        assert!(c.quiet_for() >= Duration::from_millis(30));
        c.touch();
        assert!(c.quiet_for() < Duration::from_millis(30));
    }
}
