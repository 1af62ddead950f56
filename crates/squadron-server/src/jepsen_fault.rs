//! Deliberate faults for the chaos suite to catch, compiled only with the cargo feature
//! `jepsen-faults` and active only when the node's environment names one in
//! `SQUADRON_JEPSEN_FAULT`. Release builds never carry them.
//!
//! - `local-reads`: linearizable reads skip the ReadIndex barrier and answer from the node's
//!   own, possibly stale, state (issue 6).
//! - `wall-clock-stamps`: the cluster clock is the node's wall clock, as stamps were before
//!   the clock slewed (issue 17): a skewed leader moves the replicated clock by its skew.
//! - `skip-wal-sync` (in `squadron-store`, which this feature switches on): appends are
//!   acknowledged without an fsync of the WAL (synced once a second); the lazy
//!   filesystem's crashes must catch it.
//! - `forget-idempotency-keys`: REST requests' `Idempotency-Key` is dropped, so a write resent
//!   after an unknown outcome may apply twice (INV-11); the `keyed` workload must catch it.

use std::sync::OnceLock;

/// The environment variable that switches a fault on.
pub const FAULT_ENV: &str = "SQUADRON_JEPSEN_FAULT";

/// Whether this node serves "linearizable" reads from local state.
pub fn local_reads() -> bool {
    static ACTIVE: OnceLock<bool> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        active(
            "local-reads",
            "linearizable reads are served from local state",
        )
    })
}

/// Whether this node stamps and reads deadlines by its wall clock.
pub fn wall_clock_stamps() -> bool {
    static ACTIVE: OnceLock<bool> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        active(
            "wall-clock-stamps",
            "the cluster clock is this node's wall clock",
        )
    })
}

fn active(fault: &str, what: &str) -> bool {
    let on = std::env::var(FAULT_ENV).is_ok_and(|v| v == fault);
    if on {
        tracing::warn!(
            "DELIBERATE FAULT ACTIVE ({FAULT_ENV}={fault}): {what}; this node is broken on \
             purpose for the chaos suite"
        );
    }
    on
}

/// Whether this node drops the `Idempotency-Key` of every request it is sent.
pub fn forget_idempotency_keys() -> bool {
    static ACTIVE: OnceLock<bool> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        active(
            "forget-idempotency-keys",
            "requests' idempotency keys are ignored",
        )
    })
}
