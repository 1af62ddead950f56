//! The worker's calls that REST serves too, carried over gRPC to the leader: the service
//! `squadron.v1.WorkerControl` (`squadron-proto`), whose messages are these types and REST's
//! own bodies, JSON-encoded. A worker thereby has one transport to the leader (the channel
//! that follows redirects) without a second, protobuf copy of every body and domain value.
//!
//! A REST route's path names the object; a gRPC call has no path, so its message does:
//! [`Addressed`] pairs the id the path would carry with the body REST sends.

use serde::{Deserialize, Serialize};
use squadron_core::ids::{ProjectId, TenantId};
use squadron_core::lease::RuntimeLease;

/// Largest `WorkerControl` message either way: a task with the largest prompt, a full capsule
/// history or a mailbox fits many times over; anything larger is refused before decoding.
pub const WORKER_CONTROL_MESSAGE_BYTES_MAX: usize = 8 << 20;

/// A call on one object: the id a REST path would name, and the REST body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Addressed<I, B> {
    pub id: I,
    pub body: B,
}

impl<I, B> Addressed<I, B> {
    pub fn new(id: I, body: B) -> Self {
        Self { id, body }
    }
}

/// A project, as `/api/v1/projects/{tenant}/{project}` names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectRef {
    pub tenant: TenantId,
    pub project: ProjectId,
}

/// The answer to a fence check: the token names the profile's live, active, unexpired
/// lease (INV-6), and the cluster's clock (leader-stamped) when it was checked, so the
/// caller can keep a margin before the expiry on both clocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurrentWriter {
    pub lease: RuntimeLease,
    pub clock_ms: u64,
}
