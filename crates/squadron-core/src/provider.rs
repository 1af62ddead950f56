//! The provider processes an agent profile can run under.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validation_error::ValidationError;

/// A provider is the runtime of an identity, never the identity itself: swapping Codex for
/// Claude keeps the profile, its generation chain and its capsules.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    Codex,
    Claude,
    /// Runs a given shell script; for tests and demos.
    Script,
}

impl Provider {
    pub const ALL: [Provider; 3] = [Provider::Codex, Provider::Claude, Provider::Script];

    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Codex => "codex",
            Provider::Claude => "claude",
            Provider::Script => "script",
        }
    }

    pub fn parse(field: &str, s: &str) -> Result<Self, ValidationError> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                ValidationError::new(
                    field,
                    format!("unknown provider {s:?}; expected one of codex, claude, script"),
                )
            })
    }
}

impl FromStr for Provider {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse("provider", s)
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
