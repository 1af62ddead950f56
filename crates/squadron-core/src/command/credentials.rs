//! Commands of the credential store (INV-13). Values travel sealed; the edge sealed them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::credential::SealedSecret;
use crate::ids::{CredentialId, TaskId, WorkerId};

/// An admin stores a new credential (or a new value under a revoked one's id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PutCredential {
    pub id: CredentialId,
    pub description: String,
    pub sealed: SealedSecret,
}

/// An admin replaces a live credential's value; leases granted before keep the version they
/// were handed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RotateCredential {
    pub id: CredentialId,
    pub sealed: SealedSecret,
}

/// An admin revokes a credential: its value leaves the state and every active lease that
/// holds it ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RevokeCredential {
    pub id: CredentialId,
}

/// The worker running a task's current attempt asks for the credentials its manifest names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GrantCredentialLease {
    pub task: TaskId,
    pub worker: WorkerId,
    pub attempt: u32,
}
