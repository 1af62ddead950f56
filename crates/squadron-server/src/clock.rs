//! The wall clock, read in one place. Only the leader's reading matters for the state: it
//! stamps each entry it proposes (`CommandEnvelope::at_ms`), and the core never reads a clock.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; 0 for a clock set before it.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
