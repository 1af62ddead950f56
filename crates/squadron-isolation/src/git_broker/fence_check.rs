//! The question the broker asks the control plane before every write: is this
//! (profile, lease, generation) still the profile's current active lease (INV-6)?

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use super::broker_error::BrokerError;

/// The future a [`FenceCheck`] returns. Boxed so the trait stays object-safe without a
/// proc-macro dependency: implement with `Box::pin(async move { … })`.
pub type FenceFuture<'a> =
    Pin<Box<dyn Future<Output = Result<FenceVerdict, BrokerError>> + Send + 'a>>;

/// A linearizable read of a profile's live lease. The production implementation asks the
/// control plane (a read through the leader); an `Err` makes the broker refuse with
/// `fence_unavailable` and write nothing — the fence fails closed.
pub trait FenceCheck: Send + Sync {
    /// Whether `lease` at `generation` is the current active lease of `profile`.
    fn check(&self, profile: u64, lease: u64, generation: u64) -> FenceFuture<'_>;
}

/// The control plane's answer to a fence check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceVerdict {
    /// The triple names the profile's current active lease: the write may proceed.
    Current,
    /// The triple is fenced, released, expired, unknown or of an older generation.
    Stale {
        /// The profile's current generation, when the control plane knows one.
        current_generation: Option<u64>,
        /// Why the triple is not current, for the refusal message and the log.
        reason: String,
    },
}

impl fmt::Display for FenceVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenceVerdict::Current => write!(f, "current"),
            FenceVerdict::Stale {
                current_generation: Some(generation),
                reason,
            } => write!(f, "stale (current generation {generation}): {reason}"),
            FenceVerdict::Stale {
                current_generation: None,
                reason,
            } => write!(f, "stale: {reason}"),
        }
    }
}
