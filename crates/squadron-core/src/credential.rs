//! Credentials (INV-13): secret values stored sealed, and the session-scoped leases that hand
//! them to the one attempt that needs them.
//!
//! The state never holds a plaintext value. The node that receives a value seals it under the
//! cluster data key before proposing, so the Raft log, snapshots and RocksDB see ciphertext
//! only; the node that answers a lease grant opens it again for the worker over mTLS. Sealing
//! is an adapter's business (`squadron-pki`): this module checks shapes and sizes and keeps
//! the bookkeeping — which attempt holds which version, and when that ended.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::Subject;
use crate::ids::{CredentialId, CredentialLeaseId, TaskId, WorkerId};
use crate::limits::{CREDENTIAL_LEASE_RETENTION_MS, CREDENTIAL_SEALED_BYTES_MAX};
use crate::rejection::Rejection;

/// Length of the AEAD nonce a sealed value carries (ChaCha20-Poly1305, random per value).
pub const SEALED_NONCE_BYTES: usize = 12;
/// Length of the hex id of the data key a value is sealed under.
pub const DATA_KEY_ID_HEX_LEN: usize = 16;

/// A value sealed under the cluster data key `key_id`. Opaque to the core.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SealedSecret {
    /// Names the data key (a hash prefix of it, never the key), so a node holding another
    /// key says so instead of failing to open.
    pub key_id: String,
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

impl std::fmt::Debug for SealedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedSecret")
            .field("key_id", &self.key_id)
            .field("ciphertext_bytes", &self.ciphertext.len())
            .finish()
    }
}

impl SealedSecret {
    /// The shape every replica can check without the key.
    pub fn check(&self, field: &str) -> Result<(), Rejection> {
        let hex_ok = self.key_id.len() == DATA_KEY_ID_HEX_LEN
            && self.key_id.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex_ok {
            return Err(Rejection::invalid(
                format!("{field}.key_id"),
                format!("must be {DATA_KEY_ID_HEX_LEN} hex digits"),
            ));
        }
        if self.nonce.len() != SEALED_NONCE_BYTES {
            return Err(Rejection::invalid(
                format!("{field}.nonce"),
                format!(
                    "must be {SEALED_NONCE_BYTES} bytes, got {}",
                    self.nonce.len()
                ),
            ));
        }
        if self.ciphertext.is_empty() || self.ciphertext.len() > CREDENTIAL_SEALED_BYTES_MAX {
            return Err(Rejection::invalid(
                format!("{field}.ciphertext"),
                format!(
                    "must be 1 to {CREDENTIAL_SEALED_BYTES_MAX} bytes, got {}",
                    self.ciphertext.len()
                ),
            ));
        }
        Ok(())
    }
}

/// One named secret. Its value is dropped from the state when it is revoked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Credential {
    pub id: CredentialId,
    /// Rises by one with every put and rotation; leases record the version they handed out.
    pub version: u32,
    pub description: String,
    /// `None` once revoked.
    pub sealed: Option<SealedSecret>,
    pub created_at_ms: u64,
    pub created_by: Subject,
    pub updated_at_ms: u64,
    pub revoked_at_ms: Option<u64>,
}

impl Credential {
    pub fn is_revoked(&self) -> bool {
        self.revoked_at_ms.is_some()
    }
}

/// A credential as one lease handed it out: under which mount, at which version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LeasedCredential {
    pub id: CredentialId,
    pub mount: String,
    pub version: u32,
}

/// Why and when a lease ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseRevocation {
    pub at_ms: u64,
    pub reason: String,
}

/// Whether a lease ended at `revoked` (or not at all) is still kept at `now`: ended leases
/// stay listed for [`CREDENTIAL_LEASE_RETENTION_MS`].
pub(crate) fn still_kept(revoked: Option<&LeaseRevocation>, now: u64) -> bool {
    revoked.is_none_or(|r| r.at_ms.saturating_add(CREDENTIAL_LEASE_RETENTION_MS) > now)
}

/// The credentials of one task attempt, granted to the worker running it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CredentialLease {
    pub id: CredentialLeaseId,
    pub task: TaskId,
    pub attempt: u32,
    pub worker: WorkerId,
    pub credentials: Vec<LeasedCredential>,
    pub granted_at_ms: u64,
    pub revoked: Option<LeaseRevocation>,
}

impl CredentialLease {
    /// The directory name the files live under inside the sandbox:
    /// `/run/squadron/credentials/{session}`.
    pub fn session(&self) -> String {
        session_name(self.task, self.attempt)
    }

    pub fn is_active(&self) -> bool {
        self.revoked.is_none()
    }
}

/// The session name of a task attempt, known before any lease exists (the worker mounts the
/// directory at provisioning and fills it at the start).
pub fn session_name(task: TaskId, attempt: u32) -> String {
    format!("task-{}-a{attempt}", task.get())
}

/// Credentials and their leases.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CredentialState {
    pub(crate) credentials: BTreeMap<CredentialId, Credential>,
    pub(crate) leases: BTreeMap<CredentialLeaseId, CredentialLease>,
    /// The active lease of each task (at most one: its current attempt's).
    pub(crate) active_by_task: BTreeMap<TaskId, CredentialLeaseId>,
    pub(crate) next_lease_id: CredentialLeaseId,
}

impl Default for CredentialState {
    fn default() -> Self {
        CredentialState {
            credentials: BTreeMap::new(),
            leases: BTreeMap::new(),
            active_by_task: BTreeMap::new(),
            next_lease_id: CredentialLeaseId::FIRST,
        }
    }
}

impl CredentialState {
    pub fn credential(&self, id: &CredentialId) -> Option<&Credential> {
        self.credentials.get(id)
    }

    pub fn credentials(&self) -> impl Iterator<Item = &Credential> {
        self.credentials.values()
    }

    pub fn lease(&self, id: CredentialLeaseId) -> Option<&CredentialLease> {
        self.leases.get(&id)
    }

    /// Every lease of a task, oldest first (revoked ones until pruned).
    pub fn leases_of(&self, task: TaskId) -> impl Iterator<Item = &CredentialLease> {
        self.leases.values().filter(move |l| l.task == task)
    }

    pub fn active_lease_of(&self, task: TaskId) -> Option<&CredentialLease> {
        self.active_by_task
            .get(&task)
            .and_then(|id| self.leases.get(id))
    }
}
