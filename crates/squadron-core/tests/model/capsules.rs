//! Capsule properties: the chain through commits and graceful takeovers (INV-7, INV-8).

use crate::*;

const CAPSULES: Mix = Mix {
    acquire: 10,
    renew: 4,
    release: 3,
    fence: 1,
    reap: 3,
    graceful: 8,
    crash: 2,
    commit: 14,
    sweep: 2,
    submit: 0,
    assign: 0,
    report: 0,
    cancel: 0,
    check_in: 0,
    keyed: 10,
    max_len: 80,
    dt_max: 1_500,
};

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Capsule chains (INV-7) through commits and graceful takeovers (INV-8).
    #[test]
    fn inv_07_capsule_chain_agrees_with_model(u in universe(), s in steps(CAPSULES)) {
        run(&u, &s, Checks::default());
    }
}
