//! Enrollment: an admin mints a one-time bootstrap token; a new worker exchanges it, with a
//! certificate signing request, for its certificate (DESIGN §5). The token's secret and the
//! worker's private key never enter the replicated state — only the token's SHA-256 and the
//! certificate's serial do.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use squadron_core::access::{AgentIdentity, TokenId};
use squadron_core::ids::WorkerId;

/// `POST /api/v1/bootstrap-tokens` (admin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MintBootstrap {
    /// The worker id the token is for; none: any worker id the cluster does not know yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerId>,
    /// `10m` (the default), `1h`…; 10 s to 24 h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
}

/// The minted token; `token` is the secret, shown this once.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MintedBootstrap {
    pub id: TokenId,
    pub token: String,
    pub worker: Option<WorkerId>,
    pub expires_at_ms: u64,
}

impl std::fmt::Debug for MintedBootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MintedBootstrap")
            .field("id", &self.id)
            .field("token", &"[REDACTED]")
            .field("worker", &self.worker)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish()
    }
}

/// `POST /api/v1/enroll`: the bootstrap token is the credential (no other is needed).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnrollWorker {
    pub token: String,
    pub worker: WorkerId,
    /// A PKCS#10 request; only its public key is used.
    pub csr_pem: String,
    /// Host names or addresses the worker's output listener is reached at (besides loopback).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
}

impl std::fmt::Debug for EnrollWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnrollWorker")
            .field("token", &"[REDACTED]")
            .field("worker", &self.worker)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// `POST /api/v1/workers/{id}/certificate`: a worker renews its certificate under the one it
/// holds, with a fresh key pair's CSR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewCertificate {
    pub csr_pem: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
}

/// A signed certificate, answered only once its record (and, for an enrollment, the token's
/// consumption) is committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Enrolled {
    pub cert_pem: String,
    pub ca_pem: String,
    pub serial: String,
    pub not_after_ms: u64,
}

/// `POST /api/v1/enroll/agent`: the agent inside a sandbox exchanges the token its worker
/// minted for it, with a CSR, for its certificate. The token is the credential.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnrollAgent {
    pub token: String,
    /// The identity the token was minted for (`{"task": 7}`).
    pub agent: AgentIdentity,
    /// A PKCS#10 request; only its public key is used.
    pub csr_pem: String,
}

impl std::fmt::Debug for EnrollAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnrollAgent")
            .field("token", &"[REDACTED]")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

/// A worker asks for the one-time token of the agent of a task it provisions
/// (`WorkerControl.MintAgentToken`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MintAgentToken {
    /// How long the agent has to enroll, in ms (10 s to 1 h).
    pub ttl_ms: u64,
}

/// The agent's token; `token` is the secret, written only into the sandbox's agent file.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MintedAgentToken {
    pub id: TokenId,
    pub token: String,
    pub agent: AgentIdentity,
    pub expires_at_ms: u64,
}

impl std::fmt::Debug for MintedAgentToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MintedAgentToken")
            .field("id", &self.id)
            .field("token", &"[REDACTED]")
            .field("agent", &self.agent)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_stay_out_of_debug() {
        let minted = MintedBootstrap {
            id: TokenId::new("0123456789abcdef").unwrap(),
            token: "sqd_boot_secret".into(),
            worker: None,
            expires_at_ms: 1,
        };
        assert!(!format!("{minted:?}").contains("secret"));
        let enroll = EnrollWorker {
            token: "sqd_boot_secret".into(),
            worker: WorkerId::new("w1").unwrap(),
            csr_pem: String::new(),
            hosts: vec![],
        };
        assert!(!format!("{enroll:?}").contains("secret"));
        let agent = AgentIdentity::Task(squadron_core::ids::TaskId::new(7).unwrap());
        let enroll = EnrollAgent {
            token: "sqd_boot_secret".into(),
            agent,
            csr_pem: String::new(),
        };
        assert!(!format!("{enroll:?}").contains("secret"));
        let minted = MintedAgentToken {
            id: TokenId::new("0123456789abcdef").unwrap(),
            token: "sqd_boot_secret".into(),
            agent,
            expires_at_ms: 1,
        };
        assert!(!format!("{minted:?}").contains("secret"));
    }
}
