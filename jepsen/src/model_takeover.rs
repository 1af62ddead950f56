//! The takeover register: one profile's generation as launches and takeovers through its
//! worker move it (INV-3: each grant exactly one above the last, every grant seen by every
//! later read).
//!
//! Operations (`f`, input → output):
//! - `read`: `null` → `{generation, live}` (the replicated profile, linearizable)
//! - `launch`: `null` → `{generation, lease}`; `takeover`: `{kind}` → `{generation, lease,
//!   replaced}`. An unknown outcome grants the next generation or nothing; a refusal of the
//!   acquisition (`capacity_full`, `stale_generation`, `busy`) grants nothing.
//! - `stop`, `stale-commit`, `late-commit`, `late-git-commit`: no change to the generation (a successful stale or
//!   late commit is judged by the INV-6 checker, `invariants.rs`).

use crate::model::{field_u64, Model, ModelError};
use crate::operation::{Completion, Operation};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeoverStep {
    Read {
        generation: u64,
    },
    /// `None` for an unknown outcome: the model grants the next generation.
    Grant {
        granted: Option<u64>,
    },
}

/// The sequential takeover register.
#[derive(Debug, Clone, Copy, Default)]
pub struct TakeoverRegister;

impl Model for TakeoverRegister {
    type State = u64;
    type Step = TakeoverStep;

    fn name(&self) -> &'static str {
        "takeover-register"
    }

    fn init(&self) -> u64 {
        0
    }

    fn parse(&self, op: &Operation) -> Result<Option<TakeoverStep>, ModelError> {
        let step = match (op.f.as_str(), op.completion) {
            ("read", Completion::Ok) => TakeoverStep::Read {
                generation: field_u64(op, &op.output, "generation")?,
            },
            ("launch" | "takeover", Completion::Ok) => TakeoverStep::Grant {
                granted: Some(field_u64(op, &op.output, "generation")?),
            },
            ("launch" | "takeover", Completion::Info) => TakeoverStep::Grant { granted: None },
            (
                "read" | "launch" | "takeover" | "stop" | "stale-commit" | "late-commit"
                | "late-git-commit",
                _,
            ) => return Ok(None),
            (f, _) => {
                return Err(ModelError::new(
                    op,
                    format!("unknown takeover operation {f:?}"),
                ))
            }
        };
        Ok(Some(step))
    }

    fn step(&self, s: &u64, step: &TakeoverStep) -> Option<u64> {
        match *step {
            TakeoverStep::Read { generation } => (generation == *s).then_some(*s),
            TakeoverStep::Grant { granted } => {
                let next = s.checked_add(1)?;
                granted.is_none_or(|g| g == next).then_some(next)
            }
        }
    }
}
