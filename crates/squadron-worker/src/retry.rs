//! The worker's retries, through one helper (`backon`): the pauses of every retry loop come
//! from here, as the manifests' retry tables (`lifecycle.retries`, the seed's "Retry Policy")
//! or as doubling pauses between named bounds.
//!
//! What is retried at all is each caller's decision, and one rule holds everywhere: a write
//! is resent only under an idempotency key (the control link's reports), never as an unkeyed
//! compare-and-swap, which is re-read and decided again instead (INV-11).

use std::time::Duration;

use backon::{ConstantBuilder, ExponentialBuilder};
use squadron_core::manifest::RetrySpec;

/// The pauses of a manifest retry table: before retry n (counted from 1) `spec.delay_ms(n)`,
/// `spec.max` of them; the worker's override replaces each delay when set (the number of
/// retries still comes from the table).
pub(crate) fn table(spec: &RetrySpec, override_ms: Option<u64>) -> std::vec::IntoIter<Duration> {
    (1..=spec.max)
        .map(|retry| Duration::from_millis(override_ms.unwrap_or_else(|| spec.delay_ms(retry))))
        .collect::<Vec<_>>()
        .into_iter()
}

/// Pauses from `min_ms`, doubling up to `max_ms`; `times` of them, or for ever.
pub(crate) fn doubling(min_ms: u64, max_ms: u64, times: Option<usize>) -> ExponentialBuilder {
    let b = ExponentialBuilder::new()
        .with_factor(2.0)
        .with_min_delay(Duration::from_millis(min_ms))
        .with_max_delay(Duration::from_millis(max_ms));
    match times {
        Some(n) => b.with_max_times(n),
        None => b.without_max_times(),
    }
}

/// The same pause every time, `times` of them, or for ever.
pub(crate) fn constant(ms: u64, times: Option<usize>) -> ConstantBuilder {
    let b = ConstantBuilder::new().with_delay(Duration::from_millis(ms));
    match times {
        Some(n) => b.with_max_times(n),
        None => b.without_max_times(),
    }
}

#[cfg(test)]
mod tests {
    use backon::BackoffBuilder;
    use squadron_core::manifest::RetryPolicy;

    use super::*;

    fn secs(table: impl Iterator<Item = Duration>) -> Vec<u64> {
        table.map(|d| d.as_millis() as u64).collect()
    }

    /// The seed's "Retry Policy" table, as the manifest defaults give it.
    #[test]
    fn the_default_tables_are_the_seeds() {
        let policy = RetryPolicy::default();
        // Git clone: 3 retries, 5 s, 10 s, 20 s.
        assert_eq!(secs(table(&policy.clone, None)), [5_000, 10_000, 20_000]);
        // VM provision: 2 retries, 10 s, 30 s.
        assert_eq!(secs(table(&policy.provision, None)), [10_000, 30_000]);
        // Agent connect: 30 retries, 2 s each.
        assert_eq!(secs(table(&policy.agent_connect, None)), [2_000; 30]);
        // The override replaces the delays, not their number.
        assert_eq!(secs(table(&policy.provision, Some(1))), [1, 1]);
        assert_eq!(
            secs(table(&RetrySpec::new(0, &[5_000]), None)),
            Vec::<u64>::new()
        );
    }

    #[test]
    fn doubling_pauses_stop_at_their_bound_and_their_count() {
        let pauses = secs(doubling(200, 1_000, Some(5)).build());
        assert_eq!(pauses, [200, 400, 800, 1_000, 1_000]);
        let endless = doubling(200, 5_000, None).build().take(10).count();
        assert_eq!(endless, 10);
        assert_eq!(secs(constant(500, Some(3)).build()), [500, 500, 500]);
    }
}
