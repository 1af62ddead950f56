//! Squadron's domain core: the deterministic state machine that the Raft group replicates.
//!
//! Everything here is pure: no I/O, no async runtime, no clock. Time enters as the `at_ms`
//! field of a [`command::CommandEnvelope`], stamped by the leader; [`state::State::apply`]
//! uses `now = max(state.clock_ms, at_ms)` so every replica takes the same decision.

pub mod ids;
pub mod limits;
pub mod manifest;
pub mod provider;
pub mod quantity;
pub mod validation_error;

pub use validation_error::ValidationError;
