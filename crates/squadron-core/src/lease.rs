//! Runtime leases: the sole authority for an active provider process and its writes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::{Generation, LeaseId, ProfileId, ProjectId, TenantId, WorkerId};
use crate::limits::DESCRIPTOR_BYTES_MAX;
use crate::provider::Provider;
use crate::validation_error::ValidationError;

/// The triple every fenced operation carries (INV-6). It is accepted only while it names the
/// profile's current active lease.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct FencingToken {
    pub profile: ProfileId,
    pub lease: LeaseId,
    pub generation: Generation,
}

/// Who holds a lease: the worker that launched the provider and a descriptor of the process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseHolder {
    pub worker: WorkerId,
    /// Free-form process descriptor (`pid 4242 on host-a`), for operators.
    pub process: String,
    /// The generation-owned cgroup leaf the provider runs in. When set, reap evidence must name
    /// this exact cgroup.
    pub cgroup: Option<String>,
}

impl LeaseHolder {
    pub fn validate(&self) -> Result<(), ValidationError> {
        check_descriptor("holder.process", &self.process, false)?;
        if let Some(cgroup) = &self.cgroup {
            check_descriptor("holder.cgroup", cgroup, true)?;
        }
        Ok(())
    }
}

/// Checks a bounded, printable descriptor.
pub(crate) fn check_descriptor(
    field: &str,
    value: &str,
    required: bool,
) -> Result<(), ValidationError> {
    if required && value.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if value.len() > DESCRIPTOR_BYTES_MAX {
        return Err(ValidationError::new(
            field,
            format!(
                "must be at most {DESCRIPTOR_BYTES_MAX} bytes, got {}",
                value.len()
            ),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(ValidationError::new(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// Why a lease was fenced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FenceReason {
    /// The lease passed its expiry (leader-stamped time) without renewal.
    Expired,
    /// A graceful takeover committed a capsule and moved the identity on.
    Takeover,
    /// An operator stopped it.
    Operator,
    /// The holder's worker was decommissioned by an operator.
    Decommissioned,
}

/// Where reap evidence came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceSource {
    /// The worker froze and killed the cgroup leaf and saw `populated 0` in `cgroup.events`.
    CgroupEvents,
    /// An operator's explicit, audited decommission of the holder's worker.
    OperatorDecommission { operator: String, reason: String },
}

/// Proof that the process of one exact lease generation is gone (INV-9). PID matching alone is
/// never evidence: only the emptied cgroup (or an audited operator decision) is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReapEvidence {
    pub lease: LeaseId,
    pub generation: Generation,
    pub cgroup: String,
    /// Must be `false`: a populated cgroup proves the opposite of quiescence.
    pub populated: bool,
    pub observed_at_ms: u64,
    pub source: EvidenceSource,
}

impl ReapEvidence {
    pub fn validate(&self) -> Result<(), ValidationError> {
        check_descriptor("evidence.cgroup", &self.cgroup, true)?;
        if let EvidenceSource::OperatorDecommission { operator, reason } = &self.source {
            check_descriptor("evidence.source.operator", operator, true)?;
            check_descriptor("evidence.source.reason", reason, true)?;
        }
        Ok(())
    }
}

/// Where a lease is in its life. `Active` and `Fenced` hold a project slot (INV-5);
/// `Released` and `Reaped` are terminal and hold none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    Active,
    Fenced { at_ms: u64, reason: FenceReason },
    Released { at_ms: u64 },
    Reaped { at_ms: u64, evidence: ReapEvidence },
}

impl LeaseState {
    pub fn holds_slot(&self) -> bool {
        matches!(self, LeaseState::Active | LeaseState::Fenced { .. })
    }

    pub fn is_terminal(&self) -> bool {
        !self.holds_slot()
    }

    pub fn name(&self) -> &'static str {
        match self {
            LeaseState::Active => "active",
            LeaseState::Fenced { .. } => "fenced",
            LeaseState::Released { .. } => "released",
            LeaseState::Reaped { .. } => "reaped",
        }
    }
}

/// A runtime lease of one profile generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RuntimeLease {
    pub id: LeaseId,
    pub profile: ProfileId,
    pub tenant: TenantId,
    pub project: ProjectId,
    pub generation: Generation,
    pub provider: Provider,
    pub holder: LeaseHolder,
    pub ttl_ms: u64,
    pub granted_at_ms: u64,
    pub renewed_at_ms: u64,
    pub expires_at_ms: u64,
    pub state: LeaseState,
}

impl RuntimeLease {
    /// Expiry is judged only against command time, never a local clock.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        now_ms >= self.expires_at_ms
    }

    pub fn token(&self) -> FencingToken {
        FencingToken {
            profile: self.profile,
            lease: self.id,
            generation: self.generation,
        }
    }
}
