//! Credentials (INV-13): storing a value, a credential as listed (never its value), and the
//! one answer that carries values — a lease grant, to the worker running the task.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use squadron_core::access::Subject;
use squadron_core::credential::{CredentialLease, LeasedCredential};
use squadron_core::credential_egress::EgressBinding;
use squadron_core::ids::{
    CredentialId, CredentialLeaseId, Generation, LeaseId, ProfileId, TaskId, WorkerId,
};
use squadron_core::lease::FencingToken;
use squadron_core::manifest::CredentialRef;
use squadron_core::profile_credentials::AgentCredentialLease;

/// `POST /api/v1/credentials`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PutCredential {
    pub id: CredentialId,
    /// The secret, as UTF-8 text (an API key, a token).
    pub value: String,
    #[serde(default)]
    pub description: String,
}

/// `POST /api/v1/credentials/:id/rotate`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateCredential {
    pub value: String,
}

/// `PUT /api/v1/credentials/:id/egress`: the credential is injected at egress from the next
/// lease on — sent only to `upstream`, in `header`, by the worker's proxy — and never enters a
/// sandbox again. `DELETE` on the same path unbinds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PutCredentialEgress {
    /// `https://host[:port][/base path]`.
    pub upstream: String,
    /// The request header that carries the value, lower case (`x-api-key`, `authorization`).
    pub header: String,
    /// Text in front of the value in that header (`Bearer `).
    #[serde(default)]
    pub value_prefix: String,
}

impl From<PutCredentialEgress> for EgressBinding {
    fn from(b: PutCredentialEgress) -> Self {
        EgressBinding {
            upstream: b.upstream,
            header: b.header,
            value_prefix: b.value_prefix,
        }
    }
}

/// `GET /api/v1/credentials`: a credential as listed (never its value, sealed or not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CredentialView {
    pub id: CredentialId,
    pub version: u32,
    pub description: String,
    pub created_at_ms: u64,
    pub created_by: Subject,
    pub updated_at_ms: u64,
    pub revoked_at_ms: Option<u64>,
    /// Where the value is injected, when it never enters a sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressBinding>,
}

/// `POST /api/v1/tasks/:id/credential-lease`: the worker running the task's attempt asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantCredentialLease {
    pub worker: WorkerId,
    pub attempt: u32,
    /// A restarted worker resuming the attempt: only this lease, while it is still the task's
    /// active one; once it ended the grant is refused (naming `only_lease`) and nothing is
    /// recorded, where a grant without it would record a new lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only_lease: Option<CredentialLeaseId>,
}

/// One value of a grant, opened for the worker.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LeasedValue {
    pub id: CredentialId,
    pub mount: String,
    pub version: u32,
    pub value: String,
    /// Set when the value must stay out of the sandbox: the worker's proxy injects it into
    /// requests to this upstream only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressBinding>,
}

/// The answer to a grant: where the files go (`/run/squadron/credentials/{session}`) and
/// what they hold.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CredentialLeaseGrant {
    pub lease: CredentialLeaseId,
    pub session: String,
    pub credentials: Vec<LeasedValue>,
}

/// `GET /api/v1/tasks/:id/credential-leases`: a lease as listed (never a value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CredentialLeaseView {
    pub id: CredentialLeaseId,
    pub task: TaskId,
    pub attempt: u32,
    pub worker: WorkerId,
    pub credentials: Vec<LeasedCredential>,
    pub granted_at_ms: u64,
    pub revoked_at_ms: Option<u64>,
    pub revoked_reason: Option<String>,
}

/// `PUT /api/v1/profiles/:id/credentials`: the credentials the profile's providers are given
/// from its next generation on (an empty list: none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetProfileCredentials {
    pub credential_refs: Vec<CredentialRef>,
}

/// `POST /api/v1/profiles/:id/credential-lease`: the worker holding the profile's active
/// runtime lease asks for the generation it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantAgentCredentialLease {
    pub worker: WorkerId,
    pub fence: FencingToken,
    /// A restarted worker resuming the generation: only this lease, while it is still the
    /// generation's active one; once it ended the grant is refused (naming `only_lease`) and
    /// nothing is recorded, where a grant without it would record a new lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only_lease: Option<CredentialLeaseId>,
}

/// `GET /api/v1/profiles/:id/credentials`: what the profile is given, and its leases (never
/// a value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProfileCredentialsView {
    pub profile: ProfileId,
    pub credential_refs: Vec<CredentialRef>,
    /// Oldest first; ended ones until they are pruned.
    pub leases: Vec<AgentCredentialLeaseView>,
}

/// One generation's credential lease as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentCredentialLeaseView {
    pub id: CredentialLeaseId,
    /// The runtime lease it lived under.
    pub lease: LeaseId,
    pub generation: Generation,
    pub session: String,
    pub worker: WorkerId,
    pub credentials: Vec<LeasedCredential>,
    pub granted_at_ms: u64,
    pub revoked_at_ms: Option<u64>,
    pub revoked_reason: Option<String>,
}

impl From<&CredentialLease> for CredentialLeaseView {
    fn from(l: &CredentialLease) -> Self {
        CredentialLeaseView {
            id: l.id,
            task: l.task,
            attempt: l.attempt,
            worker: l.worker.clone(),
            credentials: l.credentials.clone(),
            granted_at_ms: l.granted_at_ms,
            revoked_at_ms: l.revoked.as_ref().map(|r| r.at_ms),
            revoked_reason: l.revoked.as_ref().map(|r| r.reason.clone()),
        }
    }
}

impl From<&AgentCredentialLease> for AgentCredentialLeaseView {
    fn from(l: &AgentCredentialLease) -> Self {
        AgentCredentialLeaseView {
            id: l.id,
            lease: l.lease,
            generation: l.generation,
            session: l.session(),
            worker: l.worker.clone(),
            credentials: l.credentials.clone(),
            granted_at_ms: l.granted_at_ms,
            revoked_at_ms: l.revoked.as_ref().map(|r| r.at_ms),
            revoked_reason: l.revoked.as_ref().map(|r| r.reason.clone()),
        }
    }
}

// Values stay out of debug output (and so out of logs and panics).
impl std::fmt::Debug for PutCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PutCredential")
            .field("id", &self.id)
            .field("value", &"[REDACTED]")
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RotateCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RotateCredential")
            .field("value", &"[REDACTED]")
            .finish()
    }
}

impl std::fmt::Debug for LeasedValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedValue")
            .field("id", &self.id)
            .field("mount", &self.mount)
            .field("version", &self.version)
            .field("value", &"[REDACTED]")
            .field("egress", &self.egress)
            .finish()
    }
}

impl std::fmt::Debug for CredentialLeaseGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialLeaseGrant")
            .field("lease", &self.lease)
            .field("session", &self.session)
            .field("credentials", &self.credentials)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_never_show_in_debug_output() {
        let put = PutCredential {
            id: CredentialId::new("cred_a").unwrap(),
            value: "sk-secret-1".into(),
            description: String::new(),
        };
        let grant = CredentialLeaseGrant {
            lease: CredentialLeaseId::new(1).unwrap(),
            session: "task-1-a1".into(),
            credentials: vec![LeasedValue {
                id: put.id.clone(),
                mount: "key".into(),
                version: 1,
                value: "sk-secret-1".into(),
                egress: None,
            }],
        };
        for shown in [format!("{put:?}"), format!("{grant:?}")] {
            assert!(
                !shown.contains("sk-secret-1") && shown.contains("REDACTED"),
                "{shown}"
            );
        }
        let unknown: Result<PutCredential, _> =
            serde_json::from_str(r#"{"id":"cred_a","value":"v","extra":1}"#);
        assert!(unknown.is_err());
    }
}
