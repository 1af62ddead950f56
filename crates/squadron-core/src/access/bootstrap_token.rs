//! One-time bootstrap tokens: short-lived, stored hashed, consumed by one replicated command
//! so that two nodes receiving the same token at once issue exactly one certificate.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::operator_token::TokenId;
use crate::access::subject::{AgentIdentity, Identity, Subject};
use crate::ids::{Digest, WorkerId};

/// Whom a bootstrap token may enroll.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BootstrapPurpose {
    /// A worker: the named one, or (`None`) any worker id not known to the cluster yet.
    Worker { worker: Option<WorkerId> },
    /// Exactly this agent identity.
    Agent { agent: AgentIdentity },
}

impl BootstrapPurpose {
    /// Whether the purpose allows this identity (the "not known yet" part of an unbound worker
    /// token is checked against the state by the caller).
    pub fn admits(&self, identity: &Identity) -> bool {
        match (self, identity) {
            (BootstrapPurpose::Worker { worker: None }, Identity::Worker(_)) => true,
            (BootstrapPurpose::Worker { worker: Some(w) }, Identity::Worker(id)) => w == id,
            (BootstrapPurpose::Agent { agent }, Identity::Agent(id)) => agent == id,
            _ => false,
        }
    }
}

/// When and for whom a token was used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Consumption {
    pub at_ms: u64,
    pub identity: Identity,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BootstrapToken {
    pub id: TokenId,
    /// SHA-256 of the secret part.
    pub digest: Digest,
    pub purpose: BootstrapPurpose,
    pub created_at_ms: u64,
    pub created_by: Subject,
    pub expires_at_ms: u64,
    pub consumed: Option<Consumption>,
}
