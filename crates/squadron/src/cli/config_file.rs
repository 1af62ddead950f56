//! The CLI's configuration file: where the cluster is and how to prove who you are, so an
//! operator need not repeat `--endpoint`, `--cacert` and `--token-file` on every command.
//!
//! `SQUADRON_CONFIG`, else `$XDG_CONFIG_HOME/squadron/config.toml`, else
//! `~/.config/squadron/config.toml`; a missing file is no configuration. Flags and their
//! environment variables win over the file; the file wins over the dev defaults. A token is
//! never written here — only the path of a file holding it.
//!
//! ```toml
//! endpoints = ["https://node1:8120", "https://node2:8120"]
//! cacert = "/etc/squadron/ca.pem"
//! token_file = "/home/me/.config/squadron/admin.token"
//! ```

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

/// Largest configuration file read.
pub const CONFIG_FILE_BYTES_MAX: u64 = 64 * 1024;
/// Endpoints a configuration may list.
pub const CONFIG_ENDPOINTS_MAX: usize = 32;

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CliConfig {
    #[serde(default)]
    pub endpoints: Vec<String>,
    pub cacert: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    /// Only to refuse it with a clear message: secrets stay out of configuration files.
    token: Option<toml::Value>,
}

impl CliConfig {
    /// The file named by the environment, if it exists.
    pub fn load() -> anyhow::Result<CliConfig> {
        match config_path() {
            Some(path) if path.exists() => Self::read(&path),
            Some(path) if std::env::var_os("SQUADRON_CONFIG").is_some() => {
                anyhow::bail!(
                    "SQUADRON_CONFIG names {}, which does not exist",
                    path.display()
                )
            }
            _ => Ok(CliConfig::default()),
        }
    }

    pub fn read(path: &Path) -> anyhow::Result<CliConfig> {
        let meta = std::fs::metadata(path).with_context(|| path.display().to_string())?;
        if meta.len() > CONFIG_FILE_BYTES_MAX {
            anyhow::bail!(
                "{} is larger than {CONFIG_FILE_BYTES_MAX} bytes",
                path.display()
            );
        }
        let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
        Self::parse(&text).with_context(|| format!("the configuration file {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<CliConfig> {
        let config: CliConfig = toml::from_str(text)?;
        if config.token.is_some() {
            anyhow::bail!(
                "`token`: a secret does not belong in a configuration file; put it in a 0600 \
                 file and name that file with `token_file`"
            );
        }
        if config.endpoints.len() > CONFIG_ENDPOINTS_MAX {
            anyhow::bail!("`endpoints`: at most {CONFIG_ENDPOINTS_MAX}");
        }
        Ok(config)
    }
}

fn config_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SQUADRON_CONFIG") {
        return Some(PathBuf::from(p));
    }
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("squadron/config.toml"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/squadron/config.toml"))
}

#[cfg(test)]
mod tests {
    use super::CliConfig;

    #[test]
    fn a_configuration_names_endpoints_and_files() {
        let c = CliConfig::parse(
            "endpoints = [\"https://a:8120\", \"https://b:8120\"]\ncacert = \"/ca.pem\"\n\
             token_file = \"/t\"\n",
        )
        .unwrap();
        assert_eq!(c.endpoints.len(), 2);
        assert_eq!(c.cacert.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!(CliConfig::parse("").unwrap(), CliConfig::default());
    }

    #[test]
    fn bad_configurations_are_refused_naming_the_key() {
        let e = CliConfig::parse("token = \"sqd_op_x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("token_file"), "{e}");
        let e = format!(
            "{:#}",
            CliConfig::parse("endpoint = [\"x\"]\n").unwrap_err()
        );
        assert!(e.contains("endpoint"), "{e}");
        let e = format!("{:#}", CliConfig::parse("cacert = 3\n").unwrap_err());
        assert!(e.contains("cacert"), "{e}");
    }
}
