//! Commands of the trust boundary: tokens, enrollment, certificates.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::{BootstrapPurpose, CertSerial, Identity, ProjectScope, Role, TokenId};
use crate::ids::Digest;

/// An admin creates an operator token; the edge made the secret and sends only its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CreateOperatorToken {
    pub id: TokenId,
    pub digest: Digest,
    pub role: Role,
    pub scope: Vec<ProjectScope>,
    pub name: String,
    pub expires_at_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RevokeOperatorToken {
    pub id: TokenId,
}

/// An admin mints a one-time token for a worker or agent to enroll with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MintBootstrapToken {
    pub id: TokenId,
    pub digest: Digest,
    pub purpose: BootstrapPurpose,
    pub expires_at_ms: u64,
}

/// A bootstrap token exchanged for a certificate. The edge signed the certificate already; it
/// hands it out only if this command is applied, so a token used twice — even at two nodes at
/// once — yields one certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Enroll {
    pub token: TokenId,
    /// SHA-256 of the secret the caller presented.
    pub presented: Digest,
    pub identity: Identity,
    pub serial: CertSerial,
    pub not_after_ms: u64,
}

/// A renewed certificate of an identity that holds a live one (sent by that identity).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RecordCertificate {
    pub identity: Identity,
    pub serial: CertSerial,
    pub not_after_ms: u64,
}

/// An admin revokes every certificate of an identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RevokeIdentity {
    pub identity: Identity,
    pub reason: String,
}
