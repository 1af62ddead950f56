//! The CLI's credentials: the cluster CA it trusts and the bearer token it sends.
//!
//! CA: `--cacert` / `SQUADRON_CACERT`, else the configuration file's `cacert`, else
//! `./.squadron/pki/ca.pem` (a `squadron dev` node run from this directory). Token: `--token` /
//! `SQUADRON_TOKEN` (visible in `ps`; prefer a file), `--token-file` / `SQUADRON_TOKEN_FILE`,
//! else the configuration file's `token_file`, else `./.squadron/admin.token` (dev).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use squadron_client::Credentials;

/// Where `squadron dev` keeps its CA, relative to the directory it runs in.
pub const DEV_CA_FILE: &str = ".squadron/pki/ca.pem";
/// Where `squadron dev` keeps its admin token.
pub const DEV_TOKEN_FILE: &str = ".squadron/admin.token";
/// Largest token file read.
pub const TOKEN_FILE_BYTES_MAX: u64 = 4 * 1024;

#[derive(Debug, Clone, Args)]
pub struct CredentialArgs {
    /// The cluster CA certificate (PEM) the nodes' certificates chain to.
    #[arg(long, global = true, value_name = "FILE", env = "SQUADRON_CACERT")]
    pub cacert: Option<PathBuf>,
    /// A bearer token (shows in the process list; prefer --token-file).
    #[arg(
        long,
        global = true,
        value_name = "TOKEN",
        env = "SQUADRON_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// A file holding the bearer token.
    #[arg(long, global = true, value_name = "FILE", env = "SQUADRON_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

impl CredentialArgs {
    /// These flags, with the configuration file's `cacert` and `token_file` where no flag or
    /// variable gave one.
    pub fn with_config(&self, config: &super::config_file::CliConfig) -> CredentialArgs {
        let mut merged = self.clone();
        if merged.cacert.is_none() {
            merged.cacert = config.cacert.clone();
        }
        if merged.token.is_none() && merged.token_file.is_none() {
            merged.token_file = config.token_file.clone();
        }
        merged
    }

    /// The credentials asked for; without any CA, none (every call then fails the TLS
    /// handshake with an error naming the missing CA).
    pub fn resolve(&self) -> anyhow::Result<Credentials> {
        let Some(ca) = self.ca_file() else {
            return Ok(Credentials::default());
        };
        let ca_pem = std::fs::read_to_string(&ca)
            .with_context(|| format!("reading the CA certificate {}", ca.display()))?;
        let token = self.token_text()?;
        Credentials::operator(&ca_pem, token)
            .with_context(|| format!("the CA certificate {}", ca.display()))
    }

    fn ca_file(&self) -> Option<PathBuf> {
        self.cacert
            .clone()
            .or_else(|| Path::new(DEV_CA_FILE).exists().then(|| DEV_CA_FILE.into()))
    }

    fn token_text(&self) -> anyhow::Result<Option<String>> {
        if let Some(t) = &self.token {
            return Ok(Some(t.trim().to_string()));
        }
        let file = self.token_file.clone().or_else(|| {
            Path::new(DEV_TOKEN_FILE)
                .exists()
                .then(|| DEV_TOKEN_FILE.into())
        });
        let Some(file) = file else {
            return Ok(None);
        };
        let meta = std::fs::metadata(&file)
            .with_context(|| format!("reading the token file {}", file.display()))?;
        if meta.len() > TOKEN_FILE_BYTES_MAX {
            anyhow::bail!("the token file {} is too large", file.display());
        }
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading the token file {}", file.display()))?;
        Ok(Some(text.trim().to_string()))
    }
}
