//! Credentials of agent profiles (INV-13, "agent profiles get credentials the same way"):
//! which credentials each profile's providers are given, and the leases that hand them to one
//! generation at a time.
//!
//! A profile's lease is tied to its runtime lease, not to a task attempt: the worker holding
//! an active runtime lease of the profile may take it, and it ends the moment that runtime
//! lease stops being active (released, fenced, expired, taken over, its worker lost) or one
//! of its credentials is revoked. Lease ids come from the same sequence as task leases, so
//! an id names one lease whichever kind it is.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::credential::{LeaseRevocation, LeasedCredential};
use crate::ids::{CredentialLeaseId, Generation, LeaseId, ProfileId, WorkerId};
use crate::manifest::CredentialRef;

/// The credentials of one generation of a profile, granted to the worker running it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentCredentialLease {
    pub id: CredentialLeaseId,
    pub profile: ProfileId,
    /// The runtime lease the generation runs under; this lease lives no longer.
    pub lease: LeaseId,
    pub generation: Generation,
    pub worker: WorkerId,
    pub credentials: Vec<LeasedCredential>,
    pub granted_at_ms: u64,
    pub revoked: Option<LeaseRevocation>,
}

impl AgentCredentialLease {
    /// The directory name the files live under inside the boundary:
    /// `/run/squadron/credentials/{session}`.
    pub fn session(&self) -> String {
        agent_session_name(self.profile, self.generation)
    }

    pub fn is_active(&self) -> bool {
        self.revoked.is_none()
    }
}

/// The session name of a profile's generation, as its agent certificate names it.
pub fn agent_session_name(profile: ProfileId, generation: Generation) -> String {
    format!("profile-{}-g{generation}", profile.get())
}

/// What each profile is given, and the leases that gave it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProfileCredentials {
    /// Only profiles that name at least one credential have an entry.
    pub(crate) refs: BTreeMap<ProfileId, Vec<CredentialRef>>,
    pub(crate) leases: BTreeMap<CredentialLeaseId, AgentCredentialLease>,
    /// The active credential lease of each runtime lease (at most one).
    pub(crate) active_by_lease: BTreeMap<LeaseId, CredentialLeaseId>,
}

impl ProfileCredentials {
    /// The credentials the profile's providers are given; empty when it names none.
    pub fn refs_of(&self, profile: ProfileId) -> &[CredentialRef] {
        self.refs.get(&profile).map_or(&[], Vec::as_slice)
    }

    pub fn lease(&self, id: CredentialLeaseId) -> Option<&AgentCredentialLease> {
        self.leases.get(&id)
    }

    /// Every lease of the profile, oldest first (ended ones until pruned).
    pub fn leases_of(&self, profile: ProfileId) -> impl Iterator<Item = &AgentCredentialLease> {
        self.leases.values().filter(move |l| l.profile == profile)
    }

    /// The active credential lease of a runtime lease.
    pub fn active_for(&self, lease: LeaseId) -> Option<&AgentCredentialLease> {
        self.active_by_lease
            .get(&lease)
            .and_then(|id| self.leases.get(id))
    }

    pub(crate) fn lease_count(&self) -> usize {
        self.leases.len()
    }
}
