//! How this worker runs agent profiles (`placement: project`): the lease timing, how each
//! provider is started, and which skills and MCP servers the host offers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use squadron_core::ids::{McpServerId, SkillId};
use squadron_core::limits::{LEASE_TTL_MS_MAX, LEASE_TTL_MS_MIN};
use squadron_core::provider::Provider;
use squadron_core::worker_policy::{RepositorySource, WorkerPolicy};

use crate::error::WorkerError;

/// Default lease time to live: renewed every third of it.
pub const AGENT_LEASE_TTL_MS_DEFAULT: u64 = 15_000;
/// Default grace between SIGTERM and SIGKILL when a provider is stopped or taken over.
pub const AGENT_STOP_GRACE_MS_DEFAULT: u64 = 5_000;
/// The provider stops itself this long before the worker's estimate of the lease's expiry:
/// room for the clock difference between this host and the leader, and for the watchdog's
/// polling.
pub const SELF_FENCE_MARGIN_MS_DEFAULT: u64 = 1_500;
/// Most grace an operator may ask for.
pub const AGENT_STOP_GRACE_MS_MAX: u64 = 120_000;
/// How long a project sandbox no longer attached to this worker stays on its disk
/// (`agent::detached`), and the bound an operator may set.
pub const DETACHED_SANDBOX_RETENTION_MS_DEFAULT: u64 = 24 * 60 * 60 * 1000;
pub const DETACHED_SANDBOX_RETENTION_MS_MAX: u64 = 365 * 24 * 60 * 60 * 1000;
/// How often the worker reads whether its project sandboxes are still attached here.
pub const DETACHED_SWEEP_INTERVAL_MS_DEFAULT: u64 = 60_000;
pub const DETACHED_SWEEP_INTERVAL_MS_MIN: u64 = 100;
pub const DETACHED_SWEEP_INTERVAL_MS_MAX: u64 = 24 * 60 * 60 * 1000;
/// Largest provider script read from the host.
pub(crate) const PROVIDER_SCRIPT_BYTES_MAX: u64 = 1 << 20;

/// How one provider is started inside the boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderLauncher {
    /// The provider's pinned CLI, headless (`task::launcher::cli_script`): its structured
    /// stream on stdout, the prompt on stdin, its API key moved from the credential file the
    /// profile is given (`anthropic_api_key`, `openai_api_key`) into its environment.
    Cli,
    /// A shell script on the worker's host, copied into the generation's launch files and
    /// run with `/bin/sh` (tests and demos run "codex" and "claude" this way).
    Script(PathBuf),
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub lease_ttl_ms: u64,
    pub stop_grace_ms: u64,
    pub self_fence_margin_ms: u64,
    pub providers: BTreeMap<Provider, ProviderLauncher>,
    /// Skills this host offers; a profile requiring another one is not launched here.
    pub skills: BTreeSet<SkillId>,
    /// MCP servers this host offers, each with its streamable-HTTP endpoint, which
    /// providers reach only through the worker's gateway (`mcp_gateway.rs`); a profile
    /// requiring another one is not launched here either.
    pub mcp_servers: BTreeMap<McpServerId, reqwest::Url>,
    /// The worker's allowlisted variables (`--env-allow`, e.g. a model's base URL), given to
    /// every provider under the fixed ones; never a secret (those are credentials).
    pub inherited_env: BTreeMap<String, String>,
    /// Where a project's sandbox may be cloned from: the worker's policy
    /// (`repository_sources`), the same list its tasks are held to.
    pub repository_sources: BTreeSet<RepositorySource>,
    /// The disk quota every project sandbox lives on (`--project-disk`); `None`: none (the
    /// worker runs with `--no-disk-quota`). The worker sets it from its own configuration.
    pub project_disk_bytes: Option<u64>,
    /// Trust anchors for egress injection's upstreams beyond the system's (`--egress-ca`),
    /// the same file the worker's tasks use. The worker sets it from its own configuration.
    pub egress_ca: Option<PathBuf>,
    /// How long a project sandbox stays here once the project is no longer attached to this
    /// worker (`--detached-sandbox-retention`).
    pub detached_sandbox_retention_ms: u64,
    /// How often that is looked at.
    pub detached_sweep_interval_ms: u64,
}

impl Default for AgentConfig {
    /// Codex and Claude as their headless CLIs; no script provider; no skills or MCP
    /// servers.
    fn default() -> Self {
        AgentConfig {
            lease_ttl_ms: AGENT_LEASE_TTL_MS_DEFAULT,
            stop_grace_ms: AGENT_STOP_GRACE_MS_DEFAULT,
            self_fence_margin_ms: SELF_FENCE_MARGIN_MS_DEFAULT,
            providers: BTreeMap::from([
                (Provider::Codex, ProviderLauncher::Cli),
                (Provider::Claude, ProviderLauncher::Cli),
            ]),
            skills: BTreeSet::new(),
            mcp_servers: BTreeMap::new(),
            inherited_env: BTreeMap::new(),
            repository_sources: WorkerPolicy::default().repository_sources,
            project_disk_bytes: None,
            egress_ca: None,
            detached_sandbox_retention_ms: DETACHED_SANDBOX_RETENTION_MS_DEFAULT,
            detached_sweep_interval_ms: DETACHED_SWEEP_INTERVAL_MS_DEFAULT,
        }
    }
}

impl AgentConfig {
    pub fn validate(&self) -> Result<(), WorkerError> {
        let bad = |field: &str, message: String| {
            Err(WorkerError::Invalid {
                field: field.to_owned(),
                message,
            })
        };
        if !(LEASE_TTL_MS_MIN..=LEASE_TTL_MS_MAX).contains(&self.lease_ttl_ms) {
            return bad(
                "agent_lease_ttl_ms",
                format!(
                    "must be between {LEASE_TTL_MS_MIN} and {LEASE_TTL_MS_MAX}, got {}",
                    self.lease_ttl_ms
                ),
            );
        }
        if self.self_fence_margin_ms >= self.lease_ttl_ms / 2 {
            return bad(
                "self_fence_margin_ms",
                format!(
                    "must be less than half the lease TTL ({} ms), got {}",
                    self.lease_ttl_ms / 2,
                    self.self_fence_margin_ms
                ),
            );
        }
        if self.detached_sandbox_retention_ms > DETACHED_SANDBOX_RETENTION_MS_MAX {
            return bad(
                "detached_sandbox_retention",
                format!("must be at most {DETACHED_SANDBOX_RETENTION_MS_MAX} ms (365 days)"),
            );
        }
        let sweep = DETACHED_SWEEP_INTERVAL_MS_MIN..=DETACHED_SWEEP_INTERVAL_MS_MAX;
        if !sweep.contains(&self.detached_sweep_interval_ms) {
            return bad(
                "detached_sweep_interval_ms",
                format!("must be {}..={} ms", sweep.start(), sweep.end()),
            );
        }
        if self.stop_grace_ms > AGENT_STOP_GRACE_MS_MAX {
            return bad(
                "agent_stop_grace_ms",
                format!("must be at most {AGENT_STOP_GRACE_MS_MAX}"),
            );
        }
        for (provider, launcher) in &self.providers {
            match launcher {
                ProviderLauncher::Cli if *provider == Provider::Script => {
                    return bad("providers", "script has no CLI; give it a script".into())
                }
                ProviderLauncher::Script(path) if !path.is_file() => {
                    return bad(
                        "providers",
                        format!("{provider}: script {} is not a file", path.display()),
                    )
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Parses `NAME=PATH` (a script) as `--provider-script` gives it.
    pub fn parse_provider_script(spec: &str) -> Result<(Provider, ProviderLauncher), WorkerError> {
        let Some((name, path)) = spec.split_once('=') else {
            return Err(WorkerError::Invalid {
                field: "provider_script".into(),
                message: format!("{spec:?} must be NAME=PATH, e.g. codex=/opt/fake-codex.sh"),
            });
        };
        let provider =
            Provider::parse("provider_script", name).map_err(|e| WorkerError::Invalid {
                field: "provider_script".into(),
                message: e.to_string(),
            })?;
        if path.is_empty() {
            return Err(WorkerError::Invalid {
                field: "provider_script".into(),
                message: format!("{name}: the path is empty"),
            });
        }
        Ok((provider, ProviderLauncher::Script(PathBuf::from(path))))
    }

    /// Renewals are sent every third of the TTL, so two may be lost before expiry.
    pub(crate) fn renew_interval_ms(&self) -> u64 {
        (self.lease_ttl_ms / 3).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_script_specs_name_the_field_when_bad() {
        for bad in ["codex", "gpt=/x", "codex="] {
            let err = AgentConfig::parse_provider_script(bad).unwrap_err();
            assert!(err.to_string().contains("provider_script"), "{bad}: {err}");
        }
        let (p, l) = AgentConfig::parse_provider_script("claude=/opt/c.sh").unwrap();
        assert_eq!(p, Provider::Claude);
        assert_eq!(l, ProviderLauncher::Script(PathBuf::from("/opt/c.sh")));
    }

    #[test]
    fn validation_refuses_a_margin_that_eats_the_ttl_and_missing_scripts() {
        let mut c = AgentConfig::default();
        c.validate().unwrap();
        c.self_fence_margin_ms = c.lease_ttl_ms;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("self_fence_margin_ms"));
        let c = AgentConfig {
            lease_ttl_ms: 10,
            ..AgentConfig::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("agent_lease_ttl_ms"));
        let mut c = AgentConfig::default();
        c.providers.insert(
            Provider::Script,
            ProviderLauncher::Script("/nonexistent/provider.sh".into()),
        );
        assert!(c.validate().unwrap_err().to_string().contains("not a file"));
    }

    #[test]
    fn a_detached_sandbox_retention_or_sweep_out_of_bounds_is_refused_naming_it() {
        let c = AgentConfig {
            detached_sandbox_retention_ms: DETACHED_SANDBOX_RETENTION_MS_MAX + 1,
            ..AgentConfig::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("detached_sandbox_retention"), "{e}");
        for interval in [0, DETACHED_SWEEP_INTERVAL_MS_MAX + 1] {
            let c = AgentConfig {
                detached_sweep_interval_ms: interval,
                ..AgentConfig::default()
            };
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("detached_sweep_interval_ms"), "{interval}: {e}");
        }
        let c = AgentConfig {
            detached_sandbox_retention_ms: 0,
            ..AgentConfig::default()
        };
        c.validate()
            .expect("no retention: removed at the next sweep");
    }
}
