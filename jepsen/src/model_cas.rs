//! The compare-and-swap register: a profile's capability manifest, whose version is the CAS
//! token and whose one required skill (`v{n}`) is the value.
//!
//! Operations (`f`, input → output):
//! - `read`: `null` → `{version, value}` (`value` null while no skill is set)
//! - `cas`: `{expected, value}` → `{version}`; refusal `{error: "version_conflict", current}`
//! - `replay` (the `keyed` workload): left out; it must change nothing

use crate::model::{field_opt_u64, field_u64, Model, ModelError};
use crate::operation::{Completion, Operation};

/// The manifest version and the value written at that version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CasState {
    pub version: u64,
    pub value: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasStep {
    Read(CasState),
    /// `version` is `None` for an unknown outcome; the model then sets `expected + 1`.
    Cas {
        expected: u64,
        value: u64,
        version: Option<u64>,
    },
    Conflict {
        expected: u64,
        current: Option<u64>,
    },
}

/// The sequential CAS register.
#[derive(Debug, Clone, Copy, Default)]
pub struct CasRegister;

impl Model for CasRegister {
    type State = CasState;
    type Step = CasStep;

    fn name(&self) -> &'static str {
        "cas-register"
    }

    fn init(&self) -> CasState {
        CasState {
            version: 0,
            value: None,
        }
    }

    fn parse(&self, op: &Operation) -> Result<Option<CasStep>, ModelError> {
        let out = &op.output;
        let step = match (op.f.as_str(), op.completion) {
            ("read", Completion::Ok) => CasStep::Read(CasState {
                version: field_u64(op, out, "version")?,
                value: field_opt_u64(op, out, "value")?,
            }),
            ("read", _) => return Ok(None),
            // A keyed write sent again (the `keyed` workload): it must change nothing, which
            // leaving it out of the model checks; its answer is INV-11's to judge.
            ("replay", _) => return Ok(None),
            ("cas", c) => {
                let expected = field_u64(op, &op.input, "expected")?;
                let value = field_u64(op, &op.input, "value")?;
                match c {
                    Completion::Ok => CasStep::Cas {
                        expected,
                        value,
                        version: Some(field_u64(op, out, "version")?),
                    },
                    Completion::Info => CasStep::Cas {
                        expected,
                        value,
                        version: None,
                    },
                    Completion::Fail => match op.error() {
                        Some("version_conflict") => CasStep::Conflict {
                            expected,
                            current: field_opt_u64(op, out, "current")?,
                        },
                        _ => return Ok(None),
                    },
                }
            }
            (f, _) => return Err(ModelError::new(op, format!("unknown cas operation {f:?}"))),
        };
        Ok(Some(step))
    }

    fn step(&self, s: &CasState, step: &CasStep) -> Option<CasState> {
        match *step {
            CasStep::Read(seen) => (seen == *s).then_some(*s),
            CasStep::Cas {
                expected,
                value,
                version,
            } => {
                let next = expected.checked_add(1)?;
                (s.version == expected && version.is_none_or(|v| v == next)).then_some(CasState {
                    version: next,
                    value: Some(value),
                })
            }
            CasStep::Conflict { expected, current } => {
                (s.version != expected && current.is_none_or(|c| c == s.version)).then_some(*s)
            }
        }
    }
}
