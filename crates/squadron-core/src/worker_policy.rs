//! What a worker agrees to run (DESIGN §5 "Sandboxes"): network modes, `full_control`,
//! repository sources and size ceilings. The worker sends its policy after registering; the
//! scheduler places a task only on a worker whose policy accepts it, the edge refuses a
//! manifest no live worker accepts, and the worker checks again before it clones.
//!
//! A worker that never sent a policy (one registered by an earlier build, whose entries a
//! replay must apply as they were) is held to none.

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::manifest::{NetworkMode, TaskSpec};
use crate::state::State;
use crate::validation_error::ValidationError;

/// Where a task's repository comes from, as `repository.url` says.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RepositorySource {
    Https,
    Http,
    Ssh,
    Git,
    /// `file://` or an absolute path on the worker: another task's inbox or a project's
    /// checkout is one too, so it is off unless the operator allows it.
    Local,
}

impl RepositorySource {
    /// The source of a URL the manifest checks accepted (`user@host:path` is ssh). Anything
    /// else falls to `local`, the source a policy is strictest about: a scheme-less text that
    /// is not `host:path` (`var/lib/x`, `../x`) names a path on the worker, not an ssh host.
    pub fn of(url: &str) -> RepositorySource {
        if url.starts_with('/') {
            return RepositorySource::Local;
        }
        match url.split_once("://").map(|(s, _)| s.to_ascii_lowercase()) {
            Some(s) if s == "https" => RepositorySource::Https,
            Some(s) if s == "http" => RepositorySource::Http,
            Some(s) if s == "git" => RepositorySource::Git,
            Some(s) if s == "ssh" => RepositorySource::Ssh,
            Some(_) => RepositorySource::Local,
            None if is_scp_like(url) => RepositorySource::Ssh,
            None => RepositorySource::Local,
        }
    }

    /// Every source, in declaration order.
    pub const ALL: [RepositorySource; 5] = [
        RepositorySource::Https,
        RepositorySource::Http,
        RepositorySource::Ssh,
        RepositorySource::Git,
        RepositorySource::Local,
    ];

    /// The name serde spells it with (`https`, `local`).
    pub fn name(self) -> &'static str {
        match self {
            RepositorySource::Https => "https",
            RepositorySource::Http => "http",
            RepositorySource::Ssh => "ssh",
            RepositorySource::Git => "git",
            RepositorySource::Local => "local",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkerPolicy {
    /// Network modes manifests may ask for.
    pub network_modes: BTreeSet<NetworkMode>,
    /// Docker: whether a manifest may keep capabilities (`sandbox.full_control`).
    pub full_control: bool,
    pub repository_sources: BTreeSet<RepositorySource>,
    /// Most a manifest may ask for; `None`: no ceiling.
    pub cpus_max: Option<u32>,
    pub memory_bytes_max: Option<u64>,
    pub disk_bytes_max: Option<u64>,
}

impl Default for WorkerPolicy {
    /// Secure by default: no host network, no `full_control`, no local repositories, no
    /// plain-text http; no ceilings beyond the manifest's own limits.
    fn default() -> Self {
        WorkerPolicy {
            network_modes: BTreeSet::from([NetworkMode::Isolated, NetworkMode::Outbound]),
            full_control: false,
            repository_sources: BTreeSet::from([
                RepositorySource::Https,
                RepositorySource::Ssh,
                RepositorySource::Git,
            ]),
            cpus_max: None,
            memory_bytes_max: None,
            disk_bytes_max: None,
        }
    }
}

impl WorkerPolicy {
    /// Why this policy refuses the task, naming the manifest field; `None` if it accepts it.
    pub fn refusal(&self, spec: &TaskSpec) -> Option<ValidationError> {
        let sandbox = &spec.sandbox;
        if !self.network_modes.contains(&sandbox.network_mode) {
            return Some(ValidationError::new(
                "vm.network_mode",
                format!("{} is not allowed here", sandbox.network_mode),
            ));
        }
        if sandbox.full_control && !self.full_control {
            return Some(ValidationError::new(
                "vm.full_control",
                "full control is not allowed here",
            ));
        }
        if let Some(refused) = repository_refusal(
            &self.repository_sources,
            "repository.url",
            &spec.repository.url,
        ) {
            return Some(refused);
        }
        ceiling(
            "vm.cpus",
            sandbox.cpus.map(u64::from),
            self.cpus_max.map(u64::from),
        )
        .or_else(|| ceiling("vm.memory", sandbox.memory_bytes, self.memory_bytes_max))
        .or_else(|| ceiling("vm.disk", sandbox.disk_bytes, self.disk_bytes_max))
    }
}

/// Why a worker allowing `sources` refuses to clone `url`, naming `field`: the manifest's URL
/// checks first (a task's spec passed them at submission; an agent launch's repository is
/// checked here), then the source. `None` when it may be cloned.
pub fn repository_refusal(
    sources: &BTreeSet<RepositorySource>,
    field: &str,
    url: &str,
) -> Option<ValidationError> {
    if let Err(bad) = crate::manifest::check_repo_url(field, url) {
        return Some(bad);
    }
    let source = RepositorySource::of(url);
    (!sources.contains(&source)).then(|| {
        ValidationError::new(
            field,
            format!("{} repositories are not allowed here", source.name()),
        )
    })
}

/// `host:path` or `user@host:path`: no '/' before the first ':', and something after it.
fn is_scp_like(url: &str) -> bool {
    url.split_once(':')
        .is_some_and(|(left, path)| !left.is_empty() && !left.contains('/') && !path.is_empty())
}

/// Why no live worker would run this task, when some live worker offers its runtime but
/// every such worker's policy refuses it: the first refusal, naming the field, and which
/// workers refused. `None` when one accepts, or when no live worker offers the runtime at all
/// (the task waits for one).
pub fn no_worker_accepts(state: &State, spec: &TaskSpec, now_ms: u64) -> Option<ValidationError> {
    let now = now_ms.max(state.clock_ms());
    let mut refusals = Vec::new();
    for w in state
        .workers()
        .filter(|w| w.is_live(now) && w.runtimes.contains(&spec.sandbox.runtime))
    {
        match state.worker_policy(&w.id).and_then(|p| p.refusal(spec)) {
            Some(refused) => refusals.push((w.id.to_string(), refused)),
            None => return None,
        }
    }
    let (_, first) = refusals.first()?;
    let who: Vec<&str> = refusals.iter().map(|(w, _)| w.as_str()).collect();
    Some(ValidationError::new(
        first.field.clone(),
        format!(
            "{}; no live worker's policy accepts this manifest (refused by {})",
            first.reason,
            who.join(", ")
        ),
    ))
}

impl std::str::FromStr for RepositorySource {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, ValidationError> {
        Self::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|v| v.name()).collect();
                ValidationError::new(
                    "repository_sources",
                    format!(
                        "unknown repository source {s:?}; expected one of {}",
                        names.join(", ")
                    ),
                )
            })
    }
}

fn ceiling(field: &str, asked: Option<u64>, max: Option<u64>) -> Option<ValidationError> {
    match (asked, max) {
        (Some(a), Some(m)) if a > m => Some(ValidationError::new(
            field,
            format!("{a} is above this worker's ceiling of {m}"),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse_manifest_yaml;

    fn spec(url: &str, vm: &str) -> TaskSpec {
        parse_manifest_yaml(&format!(
            "version: \"1\"\nkind: Task\nmetadata:\n  name: t\nrepository:\n  url: {url}\n\
             agent:\n  prompt: p\nvm:\n  runtime: docker\n{vm}"
        ))
        .unwrap()
    }

    #[test]
    fn the_default_refuses_local_repositories_host_network_and_full_control() {
        let p = WorkerPolicy::default();
        assert!(p.refusal(&spec("https://example.com/r.git", "")).is_none());
        assert!(p.refusal(&spec("git@example.com:r.git", "")).is_none());
        for (url, vm, field) in [
            ("/srv/other-task/inbox", "", "repository.url"),
            ("file:///srv/repo", "", "repository.url"),
            ("http://example.com/r.git", "", "repository.url"),
            (
                "https://e.com/r",
                "  network_mode: full\n",
                "vm.network_mode",
            ),
            (
                "https://e.com/r",
                "  full_control: true\n",
                "vm.full_control",
            ),
        ] {
            let e = p
                .refusal(&spec(url, vm))
                .unwrap_or_else(|| panic!("{url} {vm}"));
            assert_eq!(e.field, field, "{url} {vm}: {e}");
        }
    }

    #[test]
    fn a_path_without_a_scheme_is_local_and_only_host_path_is_ssh() {
        for (url, source) in [
            ("git@example.com:org/r.git", RepositorySource::Ssh),
            ("example.com:r.git", RepositorySource::Ssh),
            ("ssh://git@example.com/r.git", RepositorySource::Ssh),
            ("/srv/repo", RepositorySource::Local),
            ("file:///srv/repo", RepositorySource::Local),
            ("var/lib/squadron/tasks/7/inbox", RepositorySource::Local),
            ("../other", RepositorySource::Local),
            ("./x:y", RepositorySource::Local),
            ("ftp://example.com/r", RepositorySource::Local),
        ] {
            assert_eq!(RepositorySource::of(url), source, "{url}");
        }
    }

    #[test]
    fn a_repository_the_sources_refuse_or_the_url_checks_refuse_is_named() {
        let sources = WorkerPolicy::default().repository_sources;
        assert!(repository_refusal(&sources, "repository.url", "https://e.com/r.git").is_none());
        for url in [
            "/srv/other-task/inbox",
            "file:///srv/repo",
            "../other",
            "var/lib/x",
            "https://token@e.com/r.git",
            "-oProxyCommand=x:y",
            "",
        ] {
            let e = repository_refusal(&sources, "repository.url", url)
                .unwrap_or_else(|| panic!("{url:?} was accepted"));
            assert_eq!(e.field, "repository.url", "{url:?}: {e}");
        }
        let mut local = sources.clone();
        local.insert(RepositorySource::Local);
        assert!(repository_refusal(&local, "repository.url", "/srv/repo").is_none());
    }

    #[test]
    fn source_names_are_serde_s_and_parse_back() {
        for source in RepositorySource::ALL {
            let serde = serde_json::to_value(source).unwrap();
            assert_eq!(serde, serde_json::json!(source.name()));
            assert_eq!(source.name().parse::<RepositorySource>(), Ok(source));
        }
        let e = "ftp".parse::<RepositorySource>().unwrap_err();
        assert!(
            e.reason.starts_with("unknown repository source \"ftp\""),
            "{e}"
        );
    }

    #[test]
    fn ceilings_name_the_field_they_cap() {
        let p = WorkerPolicy {
            cpus_max: Some(2),
            memory_bytes_max: Some(1 << 30),
            ..WorkerPolicy::default()
        };
        let ok = spec("https://e.com/r", "  cpus: 2\n  memory: 1G\n");
        assert!(p.refusal(&ok).is_none());
        let e = p.refusal(&spec("https://e.com/r", "  cpus: 4\n")).unwrap();
        assert_eq!(e.field, "vm.cpus");
        let e = p
            .refusal(&spec("https://e.com/r", "  memory: 2G\n"))
            .unwrap();
        assert_eq!(e.field, "vm.memory");
    }
}
