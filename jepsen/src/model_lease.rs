//! The lease register: one profile's generation and whether it has a live lease.
//!
//! Operations (`f`, input → output):
//! - `read`: `null` → `{generation, live}`
//! - `acquire`: `{expected}` → `{generation, lease}`; refusals `{error: "stale_generation",
//!   current}`, `{error: "busy"}`, `{error: "capacity_full"}`
//! - `release`: `{generation, lease}` → `null`; refusal `{error: "fenced", current}`
//!
//! The core checks an acquisition in this order: generation, live lease, project capacity
//! (`apply_leases.rs`), so each refusal pins down part of the state. Capacity is a property of
//! the whole project, so `capacity_full` says only that the generation matched and no lease
//! was live; the capacity itself is judged by the INV-5 checker and, for the `capacity`
//! workload, by the project-wide model (`model_project.rs`).

use serde_json::Value;

use crate::model::{field_opt_u64, field_u64, Model, ModelError};
use crate::operation::{Completion, Operation};

/// One profile's generation and whether a lease of that generation is live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseState {
    pub generation: u64,
    pub live: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStep {
    Read(LeaseState),
    /// `granted` is `None` for an unknown outcome; the model then grants `expected + 1`.
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
}

/// The sequential lease register.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeaseRegister;

impl Model for LeaseRegister {
    type State = LeaseState;
    type Step = LeaseStep;

    fn name(&self) -> &'static str {
        "lease-register"
    }

    fn init(&self) -> LeaseState {
        LeaseState {
            generation: 0,
            live: false,
        }
    }

    fn parse(&self, op: &Operation) -> Result<Option<LeaseStep>, ModelError> {
        let out = &op.output;
        let step = match (op.f.as_str(), op.completion) {
            ("read", Completion::Ok) => LeaseStep::Read(LeaseState {
                generation: field_u64(op, out, "generation")?,
                live: out
                    .get("live")
                    .and_then(Value::as_bool)
                    .ok_or_else(|| ModelError::new(op, "read output lacks boolean \"live\""))?,
            }),
            ("read", _) => return Ok(None),
            ("acquire", c) => {
                let expected = field_u64(op, &op.input, "expected")?;
                match c {
                    Completion::Ok => LeaseStep::Acquire {
                        expected,
                        granted: Some(field_u64(op, out, "generation")?),
                    },
                    Completion::Info => LeaseStep::Acquire {
                        expected,
                        granted: None,
                    },
                    Completion::Fail => match op.error() {
                        Some("stale_generation") => LeaseStep::AcquireStale {
                            expected,
                            current: field_opt_u64(op, out, "current")?,
                        },
                        Some("busy") => LeaseStep::AcquireBusy { expected },
                        Some("capacity_full") => LeaseStep::AcquireCapacityFull { expected },
                        _ => return Ok(None),
                    },
                }
            }
            ("release", c) => {
                let generation = field_u64(op, &op.input, "generation")?;
                match c {
                    Completion::Ok | Completion::Info => LeaseStep::Release { generation },
                    Completion::Fail => match op.error() {
                        Some("fenced") => LeaseStep::ReleaseFenced {
                            generation,
                            current: field_opt_u64(op, out, "current")?,
                        },
                        _ => return Ok(None),
                    },
                }
            }
            (f, _) => {
                return Err(ModelError::new(
                    op,
                    format!("unknown lease operation {f:?}"),
                ))
            }
        };
        Ok(Some(step))
    }

    fn step(&self, s: &LeaseState, step: &LeaseStep) -> Option<LeaseState> {
        match *step {
            LeaseStep::Read(seen) => (seen == *s).then_some(*s),
            LeaseStep::Acquire { expected, granted } => {
                let next = expected.checked_add(1)?;
                let admitted = s.generation == expected && !s.live;
                let right_value = granted.is_none_or(|g| g == next);
                (admitted && right_value).then_some(LeaseState {
                    generation: next,
                    live: true,
                })
            }
            LeaseStep::AcquireStale { expected, current } => (s.generation != expected
                && current.is_none_or(|c| c == s.generation))
            .then_some(*s),
            LeaseStep::AcquireBusy { expected } => {
                (s.generation == expected && s.live).then_some(*s)
            }
            LeaseStep::AcquireCapacityFull { expected } => {
                (s.generation == expected && !s.live).then_some(*s)
            }
            LeaseStep::Release { generation } => {
                (s.live && s.generation == generation).then_some(LeaseState {
                    generation: s.generation,
                    live: false,
                })
            }
            LeaseStep::ReleaseFenced {
                generation,
                current,
            } => (!(s.live && s.generation == generation)
                && current.is_none_or(|c| c == s.generation))
            .then_some(*s),
        }
    }
}
