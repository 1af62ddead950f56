//! Idempotency properties: retries replay the first answer (INV-11).

use crate::*;

const IDEMPOTENT: Mix = Mix {
    keyed: 60,
    max_len: 80,
    ..BALANCED
};

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Idempotent retries (INV-11): same key and command replays the first answer and changes
    /// nothing; same key on another command is refused.
    #[test]
    fn inv_11_idempotent_retries_replay_first_answer(u in universe(), s in steps(IDEMPOTENT)) {
        run(&u, &s, Checks::default());
    }
}
