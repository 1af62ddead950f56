//! The sequential specification a linearizability search checks a key's operations against.

use std::fmt::Debug;
use std::hash::Hash;

use serde_json::Value;

use crate::operation::Operation;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("operation {invoke_index} ({f}): {message}")]
pub struct ModelError {
    pub invoke_index: u64,
    pub f: String,
    pub message: String,
}

impl ModelError {
    pub fn new(op: &Operation, message: impl Into<String>) -> Self {
        Self {
            invoke_index: op.invoke_index,
            f: op.f.clone(),
            message: message.into(),
        }
    }
}

/// A deterministic sequential object. An operation whose outcome is unknown is given to
/// `step` as if it succeeded; the search decides whether it happened at all.
pub trait Model {
    type State: Clone + Eq + Hash + Debug;
    /// An operation with its recorded outcome, parsed once before the search.
    type Step: Clone + Debug;

    fn name(&self) -> &'static str;

    fn init(&self) -> Self::State;

    /// Parses an operation. `Ok(None)` drops it: a read that returned nothing, or a failure
    /// that says nothing about the state (nothing was sent, a refusal this model does not
    /// describe).
    fn parse(&self, op: &Operation) -> Result<Option<Self::Step>, ModelError>;

    /// The state after `step` if it may take effect in `state` with its recorded outcome, or
    /// `None` if that outcome is impossible there.
    fn step(&self, state: &Self::State, step: &Self::Step) -> Option<Self::State>;
}

/// Reads a required unsigned field of an input or output.
pub(crate) fn field_u64(op: &Operation, v: &Value, name: &str) -> Result<u64, ModelError> {
    v.get(name)
        .and_then(Value::as_u64)
        .ok_or_else(|| ModelError::new(op, format!("missing unsigned field {name:?} in {v}")))
}

/// Reads an optional unsigned field: absent or null is `None`.
pub(crate) fn field_opt_u64(
    op: &Operation,
    v: &Value,
    name: &str,
) -> Result<Option<u64>, ModelError> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .map(Some)
            .ok_or_else(|| ModelError::new(op, format!("field {name:?} is not unsigned: {x}"))),
    }
}

/// Reads an optional string field: absent or null is `None`.
pub(crate) fn field_opt_str(
    op: &Operation,
    v: &Value,
    name: &str,
) -> Result<Option<String>, ModelError> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(x) => Err(ModelError::new(
            op,
            format!("field {name:?} is not a string: {x}"),
        )),
    }
}
