//! The worker's error type.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("{what} at {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The runtime could not create, start, observe or remove a sandbox.
    #[error("{runtime} runtime: {message}")]
    Runtime {
        runtime: &'static str,
        message: String,
    },
    #[error("staging: {0}")]
    Staging(String),
    #[error("artifact collection: {0}")]
    Collect(String),
    /// A project sandbox's repository, worktrees or records could not be made or read.
    #[error("project sandbox: {0}")]
    Project(String),
    #[error("control plane: {0}")]
    Control(String),
    /// The task directory's disk quota could not be set up or released.
    #[error("disk quota: {0}")]
    DiskQuota(String),
    #[error("invalid {field}: {message}")]
    Invalid { field: String, message: String },
}

impl WorkerError {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        WorkerError::Io {
            what,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn runtime(runtime: &'static str, message: impl Into<String>) -> Self {
        WorkerError::Runtime {
            runtime,
            message: message.into(),
        }
    }
}
