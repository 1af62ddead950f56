//! Why a protobuf message is not the core value it stands for, naming the field by its path.

use squadron_core::ValidationError;

/// A message off the network that does not convert; `field` is the path from the message's
/// root (`spec.sandbox.runtime`, `policy.network_modes[1]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConversionError {
    /// A sub-message that is always there is absent.
    #[error("{field}: missing")]
    Missing { field: String },
    /// A value the core does not take there.
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
}

impl ConversionError {
    /// The path of the refused field.
    pub fn field(&self) -> &str {
        match self {
            ConversionError::Missing { field } | ConversionError::Invalid { field, .. } => field,
        }
    }
}

/// The edge answers it as any malformed input: invalid, naming the field.
impl From<ConversionError> for ValidationError {
    fn from(e: ConversionError) -> Self {
        match e {
            ConversionError::Missing { field } => ValidationError::new(field, "missing"),
            ConversionError::Invalid { field, reason } => ValidationError::new(field, reason),
        }
    }
}

pub(crate) fn at(parent: &str, name: &str) -> String {
    format!("{parent}.{name}")
}

pub(crate) fn required<T>(message: Option<T>, field: &str) -> Result<T, ConversionError> {
    message.ok_or_else(|| ConversionError::Missing {
        field: field.to_owned(),
    })
}

/// The core's own refusal (its reason names the allowed values), re-rooted at `field`.
pub(crate) fn refused(field: &str) -> impl FnOnce(ValidationError) -> ConversionError + '_ {
    move |e| ConversionError::Invalid {
        field: field.to_owned(),
        reason: e.reason,
    }
}
