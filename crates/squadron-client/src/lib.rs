//! A typed async client for Squadron's REST API (`/api/v1`).
//!
//! [`SquadronClient`] holds an ordered list of control-node endpoints (`https://host:port`)
//! and the [`Credentials`] it presents (the cluster CA, a bearer token or a certificate).
//! Every call tries them in order, starting at the one that answered last, under one rule that
//! keeps retries safe:
//!
//! - a read, and a write that carries an idempotency key, moves on to the next endpoint after
//!   any transport failure (and after a `503 unavailable` answer);
//! - a write **without** a key moves on only when it provably never left this process (the
//!   connection was refused or could not be set up). If it may have reached a server — a
//!   timeout or a dropped connection after sending — the call fails with
//!   [`ClientError::OutcomeUnknown`] instead of sending it a second time.
//!
//! Writes take `Option<&IdempotencyKey>` (sent as the `Idempotency-Key` header; the server
//! answers a repeated key with the first answer); [`new_idempotency_key`] makes a fresh one.
//! Reads take a [`Consistency`]: linearizable (ReadIndex through the leader, the default) or
//! stale (the answering node's applied state).
//!
//! `http.rs` holds that rule and the endpoint list; one module per API area adds its calls to
//! [`SquadronClient`]: `cluster.rs`, `projects.rs` (projects and profiles), `leases.rs` (leases,
//! takeovers, capsules, mailboxes), `tasks.rs`, `workers.rs`, `agents.rs` (the agent facade and
//! evidence). The bodies are `squadron-api`'s, re-exported in `types.rs`.

mod agents;
mod cluster;
mod credential_store;
pub mod credentials;
mod error;
pub mod grpc_leader;
mod http;
mod leases;
mod outcome;
mod projects;
mod tasks;
pub mod tokens;
pub mod types;
mod workers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use squadron_core::ids::IdempotencyKey;

pub use credentials::Credentials;
pub use error::{ClientError, EndpointFailure, ErrorBody};
pub use grpc_leader::GrpcLeader;
pub use http::{SquadronClient, IDEMPOTENCY_HEADER};
pub use outcome::OutcomeExt;
pub use squadron_api::{
    AgentCredentialLeaseView, CreateToken, CreatedToken, CredentialLeaseGrant, CredentialLeaseView,
    CredentialView, EnrollWorker, Enrolled, GrantAgentCredentialLease, GrantCredentialLease,
    LeasedValue, MintBootstrap, MintedBootstrap, ProfileCredentialsView, PutCredential,
    PutCredentialEgress, RenewCertificate, RotateCredential, SetProfileCredentials, TokenView,
};
pub use squadron_pki::WORKER_CERT_NAME;
pub use types::*;

#[cfg(test)]
use http::segment;

/// How long one request may take, connection included, unless configured otherwise. Longer
/// than the server's own forward and read-index timeout (5 s by default), so a slow cluster
/// answers with its own error before this client gives up.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(15);
/// How long setting up a connection may take before the next endpoint is tried.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);
/// The endpoint used when none is given.
pub const ENDPOINT_DEFAULT: &str = "https://127.0.0.1:8120";

/// Read consistency (defined once, with the query strings).
pub use squadron_api::Consistency;

/// A fresh idempotency key: `sq-` and 32 random hex digits, plus a process-wide counter so two
/// keys of one process never collide even with a broken random source.
pub fn new_idempotency_key() -> IdempotencyKey {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let random: u128 = rand::thread_rng().gen();
    let key = format!("sq-{random:032x}-{n}");
    // Printable ASCII, no spaces, well under the length bound: always valid.
    IdempotencyKey::new(key).expect("generated idempotency keys are valid")
}

/// Milliseconds since the Unix epoch, for fields like `observed_at_ms`.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Turns `host:port`, `https://host:port` or `https://host:port/` into `https://host:port`
/// (every control node listens with TLS; an explicit scheme is kept as given).
pub fn normalize_endpoint(endpoint: &str) -> String {
    let trimmed = endpoint.trim().trim_end_matches('/');
    if trimmed.contains("://") {
        trimmed.to_string()
    } else {
        format!("https://{trimmed}")
    }
}

#[cfg(test)]
mod tests;
