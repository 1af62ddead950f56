//! Replica properties: determinism and snapshot round trips (INV-12).

use crate::*;

/// Shorter sequences: every step also runs a second replica and compares snapshot bytes.
pub(crate) const REPLICAS: Mix = Mix {
    max_len: 60,
    ..BALANCED
};

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Determinism (INV-12): a second replica, restored from its own snapshot before every
    /// command, answers alike and holds the same digest; every envelope and response
    /// round-trips through the log codec.
    #[test]
    fn inv_12_replicas_agree_and_snapshots_round_trip(u in universe(), s in steps(REPLICAS)) {
        run(&u, &s, Checks { replicas: true });
    }
}
