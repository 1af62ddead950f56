//! What can stop the agent.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The environment file is missing, too large, or a line in it is wrong.
    #[error("agent environment {path}: {message}")]
    Env { path: PathBuf, message: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(#[from] squadron_pki::PkiError),
    /// Enrollment was refused or could not be completed.
    #[error("enrollment: {0}")]
    Enroll(String),
    /// The control plane refused a call (not a transport failure, which is retried).
    #[error("{call} refused: {status}")]
    Refused {
        call: &'static str,
        status: tonic::Status,
    },
    /// A call went unanswered through every try of the connect table.
    #[error("{call}: no answer after {tries} tries: {last}")]
    Unreachable {
        call: &'static str,
        tries: usize,
        last: String,
    },
    #[error("the provider launcher: {0}")]
    Launch(String),
}

impl AgentError {
    pub(crate) fn io(what: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        AgentError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}
