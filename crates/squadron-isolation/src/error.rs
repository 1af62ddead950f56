//! The isolation crate's error type.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    /// A file or directory operation on a cgroup, a log or an exit-code file failed.
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A caller-supplied value is unusable; `field` names it.
    #[error("invalid {field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// The host cannot provide what was asked (no cgroup v2, no bubblewrap, …).
    #[error("isolation unavailable: {0}")]
    Unavailable(String),
    /// The shim or a helper program could not be started or failed.
    #[error("{0}")]
    Launch(String),
}

impl IsolationError {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        IsolationError::Io {
            what,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        IsolationError::Invalid {
            field,
            message: message.into(),
        }
    }
}
