//! The project's admission: every profile's lease register of one project together, and the
//! slots they share (INV-5). The per-key lease register cannot judge a `capacity_full`
//! refusal or the `held` count it reports, because capacity is a property of the whole
//! project; this model checks the `capacity` workload's operations of all profiles as one
//! object: an acquisition is granted only while fewer than `max_active` leases are live, and
//! a `capacity_full` refusal must see exactly the `held` live leases it reports, at least
//! `max_active` of them.
//!
//! Operations are the lease register's (`model_lease.rs`), each on the profile its key names
//! (`capacity/<profile>`).

use std::collections::BTreeMap;

use crate::model::{field_opt_u64, Model, ModelError};
use crate::model_lease::{LeaseRegister, LeaseState, LeaseStep};
use crate::operation::Operation;

/// The key the project-wide verdict is reported under.
pub const PROJECT_KEY: &str = "capacity/*";

/// One lease-register step on one profile; `held` is what a `capacity_full` refusal reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectStep {
    pub profile: u64,
    pub step: LeaseStep,
    pub held: Option<u64>,
}

/// The sequential project: the profiles' lease registers and the shared slots.
#[derive(Debug, Clone, Copy)]
pub struct ProjectCapacity {
    pub max_active: u64,
}

impl ProjectCapacity {
    fn live(state: &BTreeMap<u64, LeaseState>) -> u64 {
        state.values().filter(|s| s.live).count() as u64
    }
}

impl Model for ProjectCapacity {
    /// Profiles never touched are at generation 0 with no lease, and are left out.
    type State = BTreeMap<u64, LeaseState>;
    type Step = ProjectStep;

    fn name(&self) -> &'static str {
        "project-capacity"
    }

    fn init(&self) -> Self::State {
        BTreeMap::new()
    }

    fn parse(&self, op: &Operation) -> Result<Option<ProjectStep>, ModelError> {
        let profile = op
            .key
            .as_deref()
            .and_then(|k| k.rsplit_once('/'))
            .and_then(|(_, p)| p.parse::<u64>().ok())
            .ok_or_else(|| ModelError::new(op, "the key names no profile"))?;
        let Some(step) = LeaseRegister.parse(op)? else {
            return Ok(None);
        };
        let held = match step {
            LeaseStep::AcquireCapacityFull { .. } => field_opt_u64(op, &op.output, "held")?,
            _ => None,
        };
        Ok(Some(ProjectStep {
            profile,
            step,
            held,
        }))
    }

    fn step(&self, state: &Self::State, step: &ProjectStep) -> Option<Self::State> {
        let live = Self::live(state);
        let admitted = match step.step {
            LeaseStep::Acquire { .. } => live < self.max_active,
            LeaseStep::AcquireCapacityFull { .. } => {
                live >= self.max_active && step.held.is_none_or(|h| h == live)
            }
            _ => true,
        };
        if !admitted {
            return None;
        }
        let current = state
            .get(&step.profile)
            .copied()
            .unwrap_or_else(|| LeaseRegister.init());
        let next = LeaseRegister.step(&current, &step.step)?;
        let mut after = state.clone();
        after.insert(step.profile, next);
        Some(after)
    }
}
