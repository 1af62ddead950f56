//! Commands of the credential store (INV-13). Values travel sealed; the edge sealed them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::credential::SealedSecret;
use crate::credential_egress::EgressBinding;
use crate::ids::{CredentialId, CredentialLeaseId, ProfileId, TaskId, WorkerId};
use crate::lease::FencingToken;
use crate::manifest::CredentialRef;

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

/// A restarted worker resuming a task attempt asks for the credential lease it held before,
/// and only that one: while it is still the task's active lease the answer is that lease with
/// the values current now; once it ended (a credential revoked) nothing is granted and
/// nothing recorded, where a plain grant would record a new lease with whatever value was put
/// since — and the attempt's resumed proxy would inject it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RegrantCredentialLease {
    pub task: TaskId,
    pub worker: WorkerId,
    pub attempt: u32,
    pub only_lease: CredentialLeaseId,
}

/// An admin names the credentials a profile's providers are given; an empty list gives none.
/// Generations running already keep what their leases handed them; the next one gets these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SetProfileCredentials {
    pub profile: ProfileId,
    pub credential_refs: Vec<CredentialRef>,
}

/// An admin binds a live credential to the one upstream it may be sent to (it is injected at
/// egress from then on and never enters a sandbox), or, with `None`, unbinds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SetCredentialEgress {
    pub id: CredentialId,
    pub egress: Option<EgressBinding>,
}

/// The worker holding a profile's active runtime lease (`fence`) asks for the credentials the
/// profile names, for that generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GrantAgentCredentialLease {
    pub fence: FencingToken,
    pub worker: WorkerId,
}

/// A restarted worker resuming a generation asks for the credential lease it served before,
/// and only that one: while it is still the generation's active lease the answer is that lease
/// with the values current now; once it ended (the credential revoked) nothing is granted and
/// nothing recorded. A plain grant in its place would record a new lease the worker refuses to
/// serve, left active until the runtime lease ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RegrantAgentCredentialLease {
    pub fence: FencingToken,
    pub worker: WorkerId,
    pub only_lease: CredentialLeaseId,
}
