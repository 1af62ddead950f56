//! The Git broker's error type: failures of the broker itself, as opposed to refusals
//! (`Refusal`), which are answers to a caller.

use std::path::PathBuf;

/// A failure inside the broker, its ledger, its socket or a fence check.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A file, directory or socket operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// libgit2 refused an operation on a repository.
    #[error("git {what} in {path}: {message}")]
    Git {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    /// A caller-supplied value is unusable; `field` names it.
    #[error("invalid {field}: {message}")]
    Invalid { field: String, message: String },
    /// The control plane could not answer a fence check; the broker fails closed.
    #[error("fence check unavailable: {0}")]
    FenceUnavailable(String),
    /// The peer broke the line protocol (client side: an unreadable or missing answer).
    #[error("broker protocol: {0}")]
    Protocol(String),
}

impl BrokerError {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BrokerError::Io {
            what,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn git(what: &'static str, path: impl Into<PathBuf>, error: &git2::Error) -> Self {
        BrokerError::Git {
            what,
            path: path.into(),
            message: error.message().to_string(),
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        BrokerError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}
