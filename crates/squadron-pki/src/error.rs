//! Errors of the trust layer.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("identity: {0}")]
    Identity(String),
    #[error("certificate: {0}")]
    Certificate(String),
    #[error("certificate signing request: {0}")]
    Csr(String),
    #[error("key: {0}")]
    Key(String),
    #[error("TLS configuration: {0}")]
    Tls(String),
    #[error("token: {0}")]
    Token(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    File { path: PathBuf, why: String },
    /// Sealing or opening a credential value failed; never carries the value.
    #[error("data key: {0}")]
    DataKey(String),
}

impl PkiError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PkiError::Io {
            path: path.into(),
            source,
        }
    }
}

impl From<rcgen::Error> for PkiError {
    fn from(e: rcgen::Error) -> Self {
        PkiError::Certificate(e.to_string())
    }
}

impl From<rustls::Error> for PkiError {
    fn from(e: rustls::Error) -> Self {
        PkiError::Tls(e.to_string())
    }
}
