//! A deliberate fault for the chaos suite to catch (issue 6), compiled only with the cargo
//! feature `jepsen-fault-local-reads` and active only when the node's environment has
//! `SQUADRON_JEPSEN_FAULT=local-reads`: linearizable reads then skip the ReadIndex barrier and
//! answer from the node's own, possibly stale, state. Release builds never carry it.

use std::sync::OnceLock;

/// The environment variable that switches the fault on.
pub const FAULT_ENV: &str = "SQUADRON_JEPSEN_FAULT";

/// Whether this node serves "linearizable" reads from local state.
pub fn local_reads() -> bool {
    static ACTIVE: OnceLock<bool> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let on = std::env::var(FAULT_ENV).is_ok_and(|v| v == "local-reads");
        if on {
            tracing::warn!(
                "DELIBERATE FAULT ACTIVE ({FAULT_ENV}=local-reads): linearizable reads are \
                 served from local state; this node is broken on purpose for the chaos suite"
            );
        }
        on
    })
}
