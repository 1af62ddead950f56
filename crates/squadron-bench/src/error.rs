//! What a comparison run can fail with.

use std::path::PathBuf;

/// A failure that stops a comparison run (a single failed operation under load does not: it
/// is counted as an error of its point).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The options cannot describe a run.
    #[error("invalid option {field}: {reason}")]
    Options { field: &'static str, reason: String },
    /// A binary the run needs is not there.
    #[error("{what} not found at {path}: {hint}")]
    MissingBinary {
        what: &'static str,
        path: PathBuf,
        hint: &'static str,
    },
    /// A file or directory operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A node process did not come up, or its cluster found no leader.
    #[error("{system} cluster did not start: {message}\n{logs}")]
    Startup {
        system: &'static str,
        message: String,
        logs: String,
    },
    /// Creating the data a workload needs failed.
    #[error("{system} setup failed at {step}: {message}")]
    Setup {
        system: &'static str,
        step: String,
        message: String,
    },
}

impl BenchError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        BenchError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn setup(
        system: &'static str,
        step: impl Into<String>,
        message: impl ToString,
    ) -> Self {
        BenchError::Setup {
            system,
            step: step.into(),
            message: message.to_string(),
        }
    }
}
