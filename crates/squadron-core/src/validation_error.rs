//! The one error type for input that is malformed on its face, before any state is consulted.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Input refused because one field is malformed. `field` is the path of the field as the caller
/// wrote it (`lifecycle.timeout`, `profile_key`), so REST and gRPC can name it in their answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error, JsonSchema)]
#[error("invalid {field}: {reason}")]
pub struct ValidationError {
    pub field: String,
    pub reason: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Re-roots the error under a parent field, so nested validation reports the full path.
    #[must_use]
    pub fn within(mut self, parent: &str) -> Self {
        self.field = if self.field.is_empty() {
            parent.to_string()
        } else if self.field.starts_with('[') {
            format!("{parent}{}", self.field)
        } else {
            format!("{parent}.{}", self.field)
        };
        self
    }
}
