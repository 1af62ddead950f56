//! The project roster: who is on the team and what each profile is doing, by revision.

use std::collections::{BTreeMap, VecDeque};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::{Generation, ProfileId, ProfileKey};
use crate::provider::Provider;

/// What a roster says of one profile. Only status changes make a new revision; heartbeats do not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RosterStatus {
    Idle,
    Active {
        provider: Provider,
        generation: Generation,
    },
    /// Fenced but not yet proved reaped.
    Fenced {
        generation: Generation,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RosterEntry {
    pub profile: ProfileId,
    pub key: ProfileKey,
    pub status: RosterStatus,
}

/// One revision's change, as delivered to profile mailboxes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RosterDelta {
    pub revision: u64,
    pub entry: RosterEntry,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Roster {
    pub revision: u64,
    pub entries: BTreeMap<ProfileId, RosterEntry>,
    /// Recent deltas, oldest first, bounded by `ROSTER_REVISIONS_KEPT`.
    pub recent: VecDeque<RosterDelta>,
}

/// The compact snapshot a launch receives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RosterSnapshot {
    pub revision: u64,
    pub entries: Vec<RosterEntry>,
}

impl Roster {
    pub fn snapshot(&self) -> RosterSnapshot {
        RosterSnapshot {
            revision: self.revision,
            entries: self.entries.values().cloned().collect(),
        }
    }

    /// Deltas after `revision`, or `None` when they were pruned and a snapshot is needed.
    pub fn deltas_since(&self, revision: u64) -> Option<Vec<RosterDelta>> {
        if revision >= self.revision {
            return Some(Vec::new());
        }
        let oldest = self
            .recent
            .front()
            .map_or(self.revision + 1, |d| d.revision);
        if revision + 1 < oldest {
            return None;
        }
        Some(
            self.recent
                .iter()
                .filter(|d| d.revision > revision)
                .cloned()
                .collect(),
        )
    }
}
