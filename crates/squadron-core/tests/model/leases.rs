//! Lease properties: generations, the single writer, capacity and fencing (INV-3 … INV-6).

use crate::*;

const LEASES: Mix = Mix {
    acquire: 14,
    renew: 6,
    release: 6,
    fence: 5,
    reap: 8,
    graceful: 5,
    crash: 7,
    commit: 2,
    sweep: 6,
    submit: 1,
    assign: 1,
    report: 1,
    cancel: 1,
    check_in: 0,
    keyed: 10,
    max_len: 100,
    dt_max: 3_000,
};

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Generations (INV-3), the single writer (INV-4), capacity (INV-5) and fencing (INV-6),
    /// with expiry, reap evidence and both takeovers driving leases through every state.
    #[test]
    fn inv_03_04_05_06_leases_agree_with_model(u in universe(), s in steps(LEASES)) {
        run(&u, &s, Checks::default());
    }
}
