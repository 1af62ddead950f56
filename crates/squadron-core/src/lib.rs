//! Squadron's domain core: the deterministic state machine that the Raft group replicates.
//!
//! Everything here is pure: no I/O, no async runtime, no clock. Time enters as the `at_ms`
//! field of a [`command::CommandEnvelope`], stamped by the leader; [`state::State::apply`]
//! uses `now = max(state.clock_ms, at_ms)` so every replica takes the same decision.
//!
//! Map of the crate: `ids` (validated identifiers), `command` / `response` / `rejection`
//! (what goes in and comes out of the log), `state` (the state and `apply`), the `apply_*`
//! modules (one area of the domain each), `invariants` (the full checker), `scheduler` (pure
//! task placement), `codec` / `snapshot` (log and snapshot encodings, state digest),
//! `error_code` (the one error table for REST and gRPC), `manifest` (task manifests).

mod apply_access;
mod apply_agents;
mod apply_capsules;
mod apply_credentials;
mod apply_leases;
mod apply_mailboxes;
mod apply_profile_credentials;
mod apply_project_tasks;
mod apply_projects;
mod apply_retention;
mod apply_tasks;
mod apply_workers;
mod invariants;

pub mod access;
pub mod agent_session;
pub mod capsule;
pub mod codec;
pub mod command;
pub mod credential;
pub mod credential_egress;
pub mod error_code;
pub mod idempotency;
pub mod ids;
pub mod lease;
pub mod legacy;
pub mod limits;
pub mod mailbox;
pub mod manifest;
pub mod persistent_maps;
pub mod profile;
pub mod profile_credentials;
pub mod project;
pub mod provider;
pub mod quantity;
pub mod rejection;
pub mod response;
pub mod roster;
pub mod scheduler;
pub mod snapshot;
pub mod state;
pub mod task;
pub mod task_record;
pub mod task_tally;
pub mod validation_error;
pub mod worker;
pub mod worker_policy;

pub use command::{BatchedCommand, Command, CommandEnvelope};
pub use rejection::Rejection;
pub use response::{Outcome, Response};
pub use state::State;
pub use validation_error::ValidationError;

#[cfg(test)]
mod tests;
