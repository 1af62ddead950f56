//! Typed views of the outcomes callers most often need.

use squadron_core::ids::{ProfileId, TaskId};
use squadron_core::response::LeaseGrant;
use squadron_core::Outcome;

pub trait OutcomeExt {
    /// The grant of an acquisition or a takeover.
    fn lease_grant(&self) -> Option<LeaseGrant>;
    fn profile_id(&self) -> Option<ProfileId>;
    fn task_id(&self) -> Option<TaskId>;
}

impl OutcomeExt for Outcome {
    fn lease_grant(&self) -> Option<LeaseGrant> {
        match self {
            Outcome::LeaseGranted(g) => Some(*g),
            Outcome::TookOver { grant, .. } => Some(*grant),
            _ => None,
        }
    }

    fn profile_id(&self) -> Option<ProfileId> {
        match self {
            Outcome::ProfileCreated { profile } => Some(*profile),
            _ => None,
        }
    }

    fn task_id(&self) -> Option<TaskId> {
        match self {
            Outcome::TaskSubmitted { task } => Some(*task),
            _ => None,
        }
    }
}
