//! The capsule chain as a register: its head (sequence and digest), advanced by appends that
//! name the head they extend (INV-7). The client computes each draft's digest itself (the
//! canonical encoding is public), so even an append of unknown outcome has a known result.
//!
//! Operations (`f`, input → output):
//! - `read`: `null` → `{sequence, digest}` (the head; `sequence` 0 and `digest` null when empty)
//! - `append`: `{sequence, previous, digest}` → `{sequence, digest}`; refusal
//!   `{error: "chain_broken", expected_sequence}`
//! - `chain`: `null` → `{capsules: [{sequence, previous, digest}]}` (the kept tail, oldest first)

use crate::model::{field_opt_str, field_opt_u64, field_u64, Model, ModelError};
use crate::operation::{Completion, Operation};

/// The head of the chain.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChainHead {
    pub sequence: u64,
    pub digest: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapsuleStep {
    Read(ChainHead),
    Append {
        sequence: u64,
        previous: Option<String>,
        digest: String,
    },
    Broken {
        sequence: u64,
        previous: Option<String>,
        expected_sequence: Option<u64>,
    },
}

/// The sequential capsule chain.
#[derive(Debug, Clone, Copy, Default)]
pub struct CapsuleChain;

impl Model for CapsuleChain {
    type State = ChainHead;
    type Step = CapsuleStep;

    fn name(&self) -> &'static str {
        "capsule-chain"
    }

    fn init(&self) -> ChainHead {
        ChainHead {
            sequence: 0,
            digest: None,
        }
    }

    fn parse(&self, op: &Operation) -> Result<Option<CapsuleStep>, ModelError> {
        let (inp, out) = (&op.input, &op.output);
        let step = match (op.f.as_str(), op.completion) {
            ("read", Completion::Ok) => CapsuleStep::Read(ChainHead {
                sequence: field_u64(op, out, "sequence")?,
                digest: field_opt_str(op, out, "digest")?,
            }),
            // `chain` (the whole kept chain, read at the end) is judged by the INV-7 checker.
            ("read", _) | ("chain", _) => return Ok(None),
            ("append", c) => {
                let sequence = field_u64(op, inp, "sequence")?;
                let previous = field_opt_str(op, inp, "previous")?;
                match c {
                    Completion::Ok | Completion::Info => {
                        let digest = field_opt_str(op, inp, "digest")?
                            .ok_or_else(|| ModelError::new(op, "append input lacks \"digest\""))?;
                        if c == Completion::Ok {
                            let got = field_opt_str(op, out, "digest")?;
                            if got.as_deref() != Some(digest.as_str()) {
                                return Err(ModelError::new(
                                    op,
                                    format!("committed digest {got:?} differs from the draft's {digest}"),
                                ));
                            }
                        }
                        CapsuleStep::Append {
                            sequence,
                            previous,
                            digest,
                        }
                    }
                    Completion::Fail => match op.error() {
                        Some("chain_broken") => CapsuleStep::Broken {
                            sequence,
                            previous,
                            expected_sequence: field_opt_u64(op, out, "expected_sequence")?,
                        },
                        _ => return Ok(None),
                    },
                }
            }
            (f, _) => {
                return Err(ModelError::new(
                    op,
                    format!("unknown capsule operation {f:?}"),
                ))
            }
        };
        Ok(Some(step))
    }

    fn step(&self, s: &ChainHead, step: &CapsuleStep) -> Option<ChainHead> {
        match step {
            CapsuleStep::Read(seen) => (seen == s).then(|| s.clone()),
            CapsuleStep::Append {
                sequence,
                previous,
                digest,
            } => {
                (s.sequence.checked_add(1) == Some(*sequence) && &s.digest == previous).then(|| {
                    ChainHead {
                        sequence: *sequence,
                        digest: Some(digest.clone()),
                    }
                })
            }
            CapsuleStep::Broken {
                sequence,
                previous,
                expected_sequence,
            } => {
                let extends = s.sequence.checked_add(1) == Some(*sequence) && &s.digest == previous;
                let reported =
                    expected_sequence.is_none_or(|e| s.sequence.checked_add(1) == Some(e));
                (!extends && reported).then(|| s.clone())
            }
        }
    }
}
