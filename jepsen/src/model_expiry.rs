//! The expiring lease register: the lease register plus time. A live lease may be fenced at
//! any moment once the replicated clock passes its expiry (the leader's sweep); a fenced lease
//! still blocks its profile and holds its slot until reap evidence ends it.
//!
//! Operations (`f`, input → output), besides those of `model_lease.rs`:
//! - `read`: `null` → `{generation, phase}` with `phase` one of `idle`, `live`, `fenced`
//! - `renew`: `{generation, lease}` → `{expires_at_ms}`; refusals `{error: "lease_expired"}`
//!   (still live, past its expiry), `{error: "fenced", current}`
//! - `reap`: `{generation, lease}` → `{slot_freed}` (reap evidence for the lease)
//!
//! When expiry happens is the replicated clock's business, which the checker does not see, so
//! the model lets a live lease be fenced whenever an operation needs it: an operation that is
//! impossible on a live lease is tried again on the same lease fenced. Fencing lazily loses no
//! linearization: every operation that is possible both before and after a fence leaves the
//! state such that the fence can still come later.

use serde_json::Value;

use crate::model::{field_opt_u64, field_u64, Model, ModelError};
use crate::operation::{Completion, Operation};

/// Where the profile's newest lease is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Idle,
    Live,
    Fenced,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExpiryState {
    pub generation: u64,
    pub phase: Phase,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpiryStep {
    Read(ExpiryState),
    Acquire {
        expected: u64,
        granted: Option<u64>,
    },
    AcquireStale {
        expected: u64,
        current: Option<u64>,
    },
    AcquireBusy {
        expected: u64,
    },
    AcquireCapacityFull {
        expected: u64,
    },
    Release {
        generation: u64,
    },
    ReleaseFenced {
        generation: u64,
        current: Option<u64>,
    },
    Renew {
        generation: u64,
    },
    RenewExpired {
        generation: u64,
    },
    Reap {
        generation: u64,
    },
}

/// The sequential expiring lease register.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExpiringLease;

fn phase_of(op: &Operation, v: &Value) -> Result<Phase, ModelError> {
    match v.get("phase").and_then(Value::as_str) {
        Some("idle") => Ok(Phase::Idle),
        Some("live") => Ok(Phase::Live),
        Some("fenced") => Ok(Phase::Fenced),
        other => Err(ModelError::new(
            op,
            format!("read output has no valid phase: {other:?}"),
        )),
    }
}

impl ExpiringLease {
    /// `step` on `s` as it is, never fencing first (the differential's eager reference
    /// fences explicitly, at any moment, and so checks the laziness of [`Model::step`]).
    pub(crate) fn apply(&self, s: &ExpiryState, step: &ExpiryStep) -> Option<ExpiryState> {
        let live = |g: u64| s.phase == Phase::Live && s.generation == g;
        match *step {
            ExpiryStep::Read(seen) => (seen == *s).then_some(*s),
            ExpiryStep::Acquire { expected, granted } => {
                let next = expected.checked_add(1)?;
                (s.generation == expected
                    && s.phase == Phase::Idle
                    && granted.is_none_or(|g| g == next))
                .then_some(ExpiryState {
                    generation: next,
                    phase: Phase::Live,
                })
            }
            ExpiryStep::AcquireStale { expected, current } => (s.generation != expected
                && current.is_none_or(|c| c == s.generation))
            .then_some(*s),
            ExpiryStep::AcquireBusy { expected } => {
                (s.generation == expected && s.phase != Phase::Idle).then_some(*s)
            }
            ExpiryStep::AcquireCapacityFull { expected } => {
                (s.generation == expected && s.phase == Phase::Idle).then_some(*s)
            }
            ExpiryStep::Release { generation } => live(generation).then_some(ExpiryState {
                generation,
                phase: Phase::Idle,
            }),
            ExpiryStep::ReleaseFenced {
                generation,
                current,
            } => (!live(generation) && current.is_none_or(|c| c == s.generation)).then_some(*s),
            ExpiryStep::Renew { generation } | ExpiryStep::RenewExpired { generation } => {
                live(generation).then_some(*s)
            }
            ExpiryStep::Reap { generation } => {
                (s.phase == Phase::Fenced && s.generation == generation).then_some(ExpiryState {
                    generation,
                    phase: Phase::Idle,
                })
            }
        }
    }
}

impl Model for ExpiringLease {
    type State = ExpiryState;
    type Step = ExpiryStep;

    fn name(&self) -> &'static str {
        "expiring-lease-register"
    }

    fn init(&self) -> ExpiryState {
        ExpiryState {
            generation: 0,
            phase: Phase::Idle,
        }
    }

    fn parse(&self, op: &Operation) -> Result<Option<ExpiryStep>, ModelError> {
        let out = &op.output;
        let c = op.completion;
        let step = match op.f.as_str() {
            "read" if c == Completion::Ok => ExpiryStep::Read(ExpiryState {
                generation: field_u64(op, out, "generation")?,
                phase: phase_of(op, out)?,
            }),
            "read" => return Ok(None),
            "acquire" => {
                let expected = field_u64(op, &op.input, "expected")?;
                match (c, op.error()) {
                    (Completion::Ok, _) => ExpiryStep::Acquire {
                        expected,
                        granted: Some(field_u64(op, out, "generation")?),
                    },
                    (Completion::Info, _) => ExpiryStep::Acquire {
                        expected,
                        granted: None,
                    },
                    (_, Some("stale_generation")) => ExpiryStep::AcquireStale {
                        expected,
                        current: field_opt_u64(op, out, "current")?,
                    },
                    (_, Some("busy")) => ExpiryStep::AcquireBusy { expected },
                    (_, Some("capacity_full")) => ExpiryStep::AcquireCapacityFull { expected },
                    _ => return Ok(None),
                }
            }
            "release" | "renew" | "reap" => {
                let generation = field_u64(op, &op.input, "generation")?;
                match (op.f.as_str(), c, op.error()) {
                    ("release", Completion::Ok | Completion::Info, _) => {
                        ExpiryStep::Release { generation }
                    }
                    ("release", _, Some("fenced")) => ExpiryStep::ReleaseFenced {
                        generation,
                        current: field_opt_u64(op, out, "current")?,
                    },
                    ("renew", Completion::Ok, _) => ExpiryStep::Renew { generation },
                    ("renew", Completion::Fail, Some("lease_expired")) => {
                        ExpiryStep::RenewExpired { generation }
                    }
                    // A renewal refused as fenced says what a fenced release says.
                    ("renew", Completion::Fail, Some("fenced")) => ExpiryStep::ReleaseFenced {
                        generation,
                        current: field_opt_u64(op, out, "current")?,
                    },
                    ("reap", Completion::Ok | Completion::Info, _) => {
                        ExpiryStep::Reap { generation }
                    }
                    // A renewal of unknown outcome changes nothing a reader can see; refused
                    // evidence (the lease still active, or already ended) pins down little.
                    _ => return Ok(None),
                }
            }
            f => {
                return Err(ModelError::new(
                    op,
                    format!("unknown expiring-lease operation {f:?}"),
                ))
            }
        };
        Ok(Some(step))
    }

    fn step(&self, s: &ExpiryState, step: &ExpiryStep) -> Option<ExpiryState> {
        self.apply(s, step).or_else(|| {
            (s.phase == Phase::Live)
                .then_some(ExpiryState {
                    generation: s.generation,
                    phase: Phase::Fenced,
                })
                .and_then(|fenced| self.apply(&fenced, step))
        })
    }
}
