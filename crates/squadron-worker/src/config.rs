//! The worker's configuration (`squadron worker` flags, or `squadron dev`'s local worker).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use squadron_core::ids::WorkerId;
use squadron_core::manifest::RuntimeKind;

use crate::agent::config::AgentConfig;
use crate::runtime::SandboxLimits;

/// Default interval between heartbeats (the seed: "Heartbeats every 30s").
pub const HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 30_000;
/// Shortest heartbeat interval accepted.
pub const HEARTBEAT_INTERVAL_MS_MIN: u64 = 100;
/// Default number of tasks run at once.
pub const CAPACITY_DEFAULT: u32 = 4;
/// Most tasks one worker runs at once.
pub const CAPACITY_MAX: u32 = 256;
/// How often a running task's output counters are sent to the control plane, at most.
pub const PROGRESS_INTERVAL_MS_DEFAULT: u64 = 2_000;
/// How often a running sandbox is polled for exit, timeouts and hangs.
pub const MONITOR_INTERVAL_MS_DEFAULT: u64 = 250;
/// Default image of the Docker runtime (built by `scripts/build-agent-image`).
pub const DOCKER_IMAGE_DEFAULT: &str = "squadron-agent:latest";
/// CPUs, memory and processes a sandbox gets where its manifest sets none.
pub const SANDBOX_CPUS_DEFAULT: u32 = 2;
pub const SANDBOX_MEMORY_BYTES_DEFAULT: u64 = 4 * 1024 * 1024 * 1024;
pub const SANDBOX_PIDS_DEFAULT: u64 = 4_096;
/// The disk quota of a task's directory (its clone, outputs and logs) where the manifest sets
/// no `disk`. The image is sparse: only what a task writes costs host space.
pub const SANDBOX_DISK_BYTES_DEFAULT: u64 = 10 * 1024 * 1024 * 1024;
/// Most addresses one `--egress-allow` host name adds.
pub const EGRESS_ALLOW_ADDRESSES_PER_HOST_MAX: usize = 64;
/// A project sandbox's disk quota where the operator sets none: up to four agents' worktrees.
pub const PROJECT_DISK_BYTES_DEFAULT: u64 = 20 * 1024 * 1024 * 1024;
/// Bounds of those defaults.
pub const SANDBOX_CPUS_MAX: u32 = 1_024;
pub const SANDBOX_MEMORY_BYTES_MIN: u64 = 16 * 1024 * 1024;
pub const SANDBOX_PIDS_MIN: u64 = 16;
pub const SANDBOX_PIDS_MAX: u64 = 4_194_304;

/// The limits every sandbox gets where nothing else sets one: a task whose manifest leaves
/// `cpus` or `memory` out, and every agent attempt (profiles carry no limits). Nothing runs
/// unbounded on a shared host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxDefaults {
    pub cpus: u32,
    pub memory_bytes: u64,
    pub pids_max: u64,
    /// A task directory's disk quota (tasks only: agent profiles work in project sandboxes).
    pub disk_bytes: u64,
    /// A project sandbox's disk quota: its clone and every profile's worktree and state.
    pub project_disk_bytes: u64,
}

impl Default for SandboxDefaults {
    fn default() -> Self {
        Self {
            cpus: SANDBOX_CPUS_DEFAULT,
            memory_bytes: SANDBOX_MEMORY_BYTES_DEFAULT,
            pids_max: SANDBOX_PIDS_DEFAULT,
            disk_bytes: SANDBOX_DISK_BYTES_DEFAULT,
            project_disk_bytes: PROJECT_DISK_BYTES_DEFAULT,
        }
    }
}

impl SandboxDefaults {
    /// A sandbox's limits: what its manifest set, these defaults for the rest.
    pub(crate) fn limits(&self, cpus: Option<u32>, memory_bytes: Option<u64>) -> SandboxLimits {
        SandboxLimits {
            cpus: Some(cpus.unwrap_or(self.cpus)),
            memory_bytes: Some(memory_bytes.unwrap_or(self.memory_bytes)),
            pids_max: Some(self.pids_max),
            disk_bytes: Some(self.disk_bytes),
        }
    }

    fn validate(&self) -> Result<(), crate::WorkerError> {
        let bad = |field: &str, message: String| {
            Err(crate::WorkerError::Invalid {
                field: field.to_string(),
                message,
            })
        };
        if !(1..=SANDBOX_CPUS_MAX).contains(&self.cpus) {
            return bad("sandbox_cpus", format!("must be 1..={SANDBOX_CPUS_MAX}"));
        }
        if self.memory_bytes < SANDBOX_MEMORY_BYTES_MIN {
            return bad(
                "sandbox_memory",
                format!("must be at least {SANDBOX_MEMORY_BYTES_MIN} bytes"),
            );
        }
        let disk = squadron_isolation::disk_quota::QUOTA_BYTES_MIN
            ..=squadron_isolation::disk_quota::QUOTA_BYTES_MAX;
        if !disk.contains(&self.disk_bytes) {
            return bad(
                "sandbox_disk",
                format!("must be {}..={} bytes", disk.start(), disk.end()),
            );
        }
        if !disk.contains(&self.project_disk_bytes) {
            return bad(
                "project_disk",
                format!("must be {}..={} bytes", disk.start(), disk.end()),
            );
        }
        if !(SANDBOX_PIDS_MIN..=SANDBOX_PIDS_MAX).contains(&self.pids_max) {
            return bad(
                "sandbox_pids",
                format!("must be {SANDBOX_PIDS_MIN}..={SANDBOX_PIDS_MAX}"),
            );
        }
        Ok(())
    }
}

/// The seed's agent heartbeat interval.
pub const AGENT_HEARTBEAT_MS_DEFAULT: u64 = 30_000;

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub id: WorkerId,
    /// REST endpoints of control nodes (any node; writes are forwarded to the leader).
    pub control: Vec<String>,
    pub data_dir: PathBuf,
    pub runtimes: BTreeSet<RuntimeKind>,
    pub capacity: u32,
    pub heartbeat_interval_ms: u64,
    /// Where the worker's output server listens (logs, artifacts, live stream).
    pub listen: SocketAddr,
    /// The base URL control nodes use to reach the output server; defaults to
    /// `https://{listen}`.
    pub advertise: Option<String>,
    /// The worker's certificate and the cluster CA: it serves its output listener with it
    /// (only control nodes admitted) and presents it to the control plane. Required to start.
    pub tls: Option<squadron_pki::TlsIdentity>,
    /// cgroup v2 mount of the process runtime; detected when unset.
    pub cgroup_root: Option<PathBuf>,
    pub docker_image: String,
    /// Warm Docker containers kept started (`runtime::docker::warm_pool`); 0: none.
    pub docker_warm_pool: usize,
    /// The `squadron` binary Docker sandboxes run `squadron agent` from (bound read-only, so
    /// the agent is the worker's own version). `squadron worker` sets its own executable;
    /// unset, containers start the launcher directly (the runtime's own tests).
    pub agent_binary: Option<PathBuf>,
    /// How often sandbox agents heartbeat.
    pub agent_heartbeat_ms: u64,
    /// Host directory mounted read-only at `/mnt/global` in every sandbox.
    pub global_dir: Option<PathBuf>,
    /// Names of worker environment variables copied into sandboxes (provider API keys, …).
    pub env_allowlist: Vec<String>,
    pub progress_interval_ms: u64,
    pub monitor_interval_ms: u64,
    /// Replaces every retry delay of the manifests (clone, provision) when set: tests, or an
    /// operator draining a queue. The number of retries still comes from each manifest.
    pub backoff_override_ms: Option<u64>,
    /// Agent profiles (`placement: project`) run here when set and the process runtime is
    /// available.
    pub agents: Option<AgentConfig>,
    /// Limits of sandboxes whose manifest sets none, and of every agent attempt.
    pub sandbox_defaults: SandboxDefaults,
    /// IPv4 networks (CIDR) `outbound` sandboxes may not reach, beyond the host itself,
    /// loopback, link-local, other sandboxes and the control endpoints, which they never
    /// reach.
    pub egress_deny: Vec<String>,
    /// `outbound` sandboxes may open connections only to these IPv4 networks or addresses
    /// (after the deny list, which wins); empty: anywhere not denied.
    pub egress_allow: Vec<String>,
    /// Whether `network_mode: full` (the host's own network) may run here; refused, naming
    /// the field, otherwise.
    pub allow_full_network: bool,
    /// What `gateway` sandboxes may reach through the worker's proxy: domains
    /// (`api.anthropic.com`), subdomains (`*.github.com`) or IPv4 networks. Empty: the
    /// mode is not offered.
    pub gateway_allow: Vec<String>,
    /// Extra trust anchors (PEM) for egress injection's upstreams, beside the system bundle.
    pub egress_ca: Option<PathBuf>,
    /// What this worker agrees to run; sent to the control plane after registering and
    /// checked again before a task is staged. Secure by default (`WorkerPolicy::default`).
    pub policy: squadron_core::worker_policy::WorkerPolicy,
    /// Whether every task directory gets its disk quota (a loop mount, so root only); off
    /// only by the operator's explicit `--no-disk-quota`.
    pub disk_quota: bool,
    /// The KVM runtime's libvirt, image and files (used when built with `libvirt`).
    pub vm: VmConfig,
    /// How long an ended task's files stay, by its manifest's retention class.
    pub output_retention: crate::OutputRetention,
}

/// How the KVM runtime reaches libvirt and what it boots.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// libvirt's URI (`qemu:///system`).
    pub uri: String,
    /// Where `scripts/build-vm-image` put the image; unset, `$HOME/.cache/squadron-vm`.
    pub image_dir: Option<PathBuf>,
    /// What QEMU must read (image copies, console logs): every ancestor searchable by others.
    pub state_dir: PathBuf,
    /// The virtiofs daemon; unset, looked for on PATH and in the usual places.
    pub virtiofsd: Option<PathBuf>,
    /// `auto`, `kvm` or `qemu` (software emulation).
    pub domain_type: String,
    /// Test hook: the guest waits this long before it starts the agent, so a test can make
    /// provisioning slow on purpose (`--vm-test-boot-delay-ms`, hidden).
    pub test_boot_delay_ms: Option<u64>,
}

impl Default for VmConfig {
    fn default() -> Self {
        Self {
            uri: "qemu:///system".to_string(),
            image_dir: None,
            state_dir: PathBuf::from("/var/lib/squadron/vm"),
            virtiofsd: None,
            domain_type: "auto".to_string(),
            test_boot_delay_ms: None,
        }
    }
}

impl WorkerConfig {
    pub fn new(id: WorkerId, control: Vec<String>, data_dir: PathBuf, listen: SocketAddr) -> Self {
        Self {
            id,
            control,
            data_dir,
            runtimes: BTreeSet::from([RuntimeKind::Process]),
            capacity: CAPACITY_DEFAULT,
            heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS_DEFAULT,
            listen,
            advertise: None,
            tls: None,
            cgroup_root: None,
            docker_image: DOCKER_IMAGE_DEFAULT.to_string(),
            docker_warm_pool: 0,
            agent_binary: None,
            agent_heartbeat_ms: AGENT_HEARTBEAT_MS_DEFAULT,
            global_dir: None,
            env_allowlist: Vec::new(),
            progress_interval_ms: PROGRESS_INTERVAL_MS_DEFAULT,
            monitor_interval_ms: MONITOR_INTERVAL_MS_DEFAULT,
            backoff_override_ms: None,
            agents: Some(AgentConfig::default()),
            sandbox_defaults: SandboxDefaults::default(),
            egress_deny: Vec::new(),
            egress_allow: Vec::new(),
            allow_full_network: false,
            gateway_allow: Vec::new(),
            egress_ca: None,
            vm: VmConfig::default(),
            policy: squadron_core::worker_policy::WorkerPolicy::default(),
            disk_quota: true,
            output_retention: crate::OutputRetention::default(),
        }
    }

    /// The deny list of `outbound` sandboxes: `egress_deny` and every IPv4 address the
    /// control endpoints and the MCP upstreams (`--mcp-server`, reached only through the
    /// worker's gateway, with the grant) resolve to — looked up now; one that does not resolve
    /// adds nothing.
    pub(crate) fn egress_deny_networks(&self) -> Result<Vec<ipnet::Ipv4Net>, crate::WorkerError> {
        let mut deny = Vec::new();
        for cidr in &self.egress_deny {
            let net: ipnet::Ipv4Net = cidr.parse().map_err(|e| crate::WorkerError::Invalid {
                field: "egress_deny".to_string(),
                message: format!("{cidr:?} is not an IPv4 network (a.b.c.d/n): {e}"),
            })?;
            deny.push(net.trunc());
        }
        let control = self.control.iter().filter_map(|endpoint| {
            std::net::ToSocketAddrs::to_socket_addrs(crate::support::authority(endpoint))
                .ok()
                .map(Iterator::collect::<Vec<_>>)
        });
        let upstreams = self
            .agents
            .iter()
            .flat_map(|a| a.mcp_servers.values())
            .filter_map(|url| url.socket_addrs(|| None).ok());
        for addr in control.chain(upstreams).flatten() {
            if let std::net::IpAddr::V4(v4) = addr.ip() {
                deny.push(ipnet::Ipv4Net::from(v4));
            }
        }
        deny.sort();
        deny.dedup();
        Ok(deny)
    }

    /// Replaces each host name of `egress_allow` by the IPv4 addresses it resolves to now:
    /// called once, when the worker starts, so every runtime (tasks, agent attempts, Docker,
    /// KVM) enforces the same set, the one logged. Networks and addresses are kept as given
    /// (a malformed one is refused later, by [`WorkerConfig::validate`]). Blocks on the
    /// system's resolver.
    pub fn resolve_egress_allow_hosts(&mut self) -> Result<(), crate::WorkerError> {
        let mut resolved = Vec::with_capacity(self.egress_allow.len());
        for entry in &self.egress_allow {
            if names_a_network(entry) {
                resolved.push(entry.clone());
                continue;
            }
            let addresses =
                resolve_allowed_host(entry).map_err(|message| crate::WorkerError::Invalid {
                    field: "egress_allow".to_string(),
                    message,
                })?;
            resolved.extend(addresses.iter().map(|net| net.addr().to_string()));
        }
        self.egress_allow = resolved;
        Ok(())
    }

    /// The allow list of `outbound` sandboxes (`egress_allow`: IPv4 networks and single
    /// addresses, host names already resolved); `None` when it is empty, so every destination
    /// not denied is open.
    pub(crate) fn egress_allow_networks(
        &self,
    ) -> Result<Option<Vec<ipnet::Ipv4Net>>, crate::WorkerError> {
        use squadron_isolation::sandbox_network::EGRESS_ALLOW_ENTRIES_MAX;
        let bad = |message: String| crate::WorkerError::Invalid {
            field: "egress_allow".to_string(),
            message,
        };
        if self.egress_allow.len() > EGRESS_ALLOW_ENTRIES_MAX {
            return Err(bad(format!(
                "{} entries; at most {EGRESS_ALLOW_ENTRIES_MAX}",
                self.egress_allow.len()
            )));
        }
        let mut allow = Vec::new();
        for entry in &self.egress_allow {
            if let Ok(address) = entry.parse::<std::net::Ipv4Addr>() {
                allow.push(ipnet::Ipv4Net::from(address));
            } else if let Ok(net) = entry.parse::<ipnet::Ipv4Net>() {
                allow.push(net.trunc());
            } else if names_a_network(entry) {
                return Err(bad(format!(
                    "{entry:?} is not an IPv4 network (a.b.c.d/n), address or host name"
                )));
            } else {
                return Err(bad(format!(
                    "{entry:?} is a host name the worker has not resolved \
                     (resolve_egress_allow_hosts runs at its start)"
                )));
            }
        }
        allow.sort();
        allow.dedup();
        Ok((!allow.is_empty()).then_some(allow))
    }

    /// What `gateway` sandboxes may reach, or `None` where the worker allows nothing (the
    /// mode is then refused): the allow list, never this host, the always-denied ranges or
    /// `network`'s deny list.
    pub(crate) fn gateway_destinations(
        &self,
        network: &squadron_isolation::NetworkConfig,
    ) -> Result<Option<std::sync::Arc<crate::runtime::gateway::Destinations>>, crate::WorkerError>
    {
        use crate::runtime::gateway::{AllowList, Destinations};
        let allow = AllowList::parse(&self.gateway_allow)?;
        if allow.is_empty() {
            return Ok(None);
        }
        let destinations = Destinations::for_worker(allow, &network.deny, &network.ip)?;
        Ok(Some(std::sync::Arc::new(destinations)))
    }

    /// The URL control nodes reach the output server at.
    pub fn advertised_url(&self) -> String {
        self.advertise
            .clone()
            .unwrap_or_else(|| format!("https://{}", self.listen))
    }

    /// The host of the advertised URL, for the certificate's names.
    pub fn advertised_host(&self) -> Option<String> {
        host_of_url(&self.advertised_url())
    }

    pub fn validate(&self) -> Result<(), crate::WorkerError> {
        let bad = |field: &str, message: String| {
            Err(crate::WorkerError::Invalid {
                field: field.to_string(),
                message,
            })
        };
        // Sandboxes bind these by path: a relative one would resolve elsewhere (bubblewrap
        // resolves bind sources against its own working directory).
        for (field, dir) in [
            ("data_dir", Some(&self.data_dir)),
            ("global_dir", self.global_dir.as_ref()),
        ] {
            if dir.is_some_and(|d| d.is_relative()) {
                return bad(field, "must be an absolute path".into());
            }
        }
        if self.control.is_empty() {
            return bad("control", "at least one control endpoint is needed".into());
        }
        if self.runtimes.is_empty() {
            return bad("runtimes", "at least one runtime is needed".into());
        }
        if self.docker_warm_pool > crate::runtime::docker::WARM_POOL_SIZE_MAX {
            return bad(
                "docker_warm_pool",
                format!("must be 0..={}", crate::runtime::docker::WARM_POOL_SIZE_MAX),
            );
        }
        if self.capacity == 0 || self.capacity > CAPACITY_MAX {
            return bad("capacity", format!("must be 1..={CAPACITY_MAX}"));
        }
        if self.heartbeat_interval_ms < HEARTBEAT_INTERVAL_MS_MIN {
            return bad(
                "heartbeat_interval_ms",
                format!("must be at least {HEARTBEAT_INTERVAL_MS_MIN}"),
            );
        }
        self.sandbox_defaults.validate()?;
        self.egress_deny_networks()?;
        self.egress_allow_networks()?;
        let gateway = crate::runtime::gateway::AllowList::parse(&self.gateway_allow)?;
        let offered = self
            .policy
            .network_modes
            .contains(&squadron_core::manifest::NetworkMode::Gateway);
        if offered && gateway.is_empty() {
            return bad(
                "gateway_allow",
                "the policy offers network_mode gateway, but no destination is allowed \
                 (--gateway-allow)"
                    .into(),
            );
        }
        if let Some(agents) = &self.agents {
            agents.validate()?;
        }
        Ok(())
    }
}

/// Whether an `--egress-allow` entry is meant as an address or network (digits and dots, or a
/// prefix length), not a host name.
fn names_a_network(entry: &str) -> bool {
    entry.parse::<std::net::Ipv4Addr>().is_ok()
        || entry.contains('/')
        || entry.chars().all(|c| c.is_ascii_digit() || c == '.')
}

/// A host name of `--egress-allow`, resolved by the system's resolver to its IPv4 addresses
/// (each a /32), once, when the worker starts: an `outbound` sandbox reaches
/// what the name meant then, until the worker restarts. Names that change address often
/// (CDNs) belong in `--gateway-allow`, whose proxy resolves each connection.
fn resolve_allowed_host(name: &str) -> Result<Vec<ipnet::Ipv4Net>, String> {
    use std::net::ToSocketAddrs;
    // The gateway's own definition of a domain name (a trailing dot and case are DNS's).
    let name: &str = &crate::runtime::gateway::allow_list::normalise(name).map_err(|_| {
        let hint = if name.starts_with("*.") {
            " (subdomain patterns are --gateway-allow's)"
        } else {
            ""
        };
        format!("{name:?} is not an IPv4 network (a.b.c.d/n), address or host name{hint}")
    })?;
    let addresses = (name, 0)
        .to_socket_addrs()
        .map_err(|e| format!("{name:?} does not resolve: {e}"))?;
    let mut nets: Vec<ipnet::Ipv4Net> = addresses
        .filter_map(|a| match a.ip() {
            std::net::IpAddr::V4(v4) => Some(ipnet::Ipv4Net::from(v4)),
            std::net::IpAddr::V6(_) => None,
        })
        .take(EGRESS_ALLOW_ADDRESSES_PER_HOST_MAX)
        .collect();
    nets.sort();
    nets.dedup();
    if nets.is_empty() {
        return Err(format!("{name:?} resolves to no IPv4 address"));
    }
    tracing::info!(host = name, addresses = ?nets, "--egress-allow host name resolved");
    Ok(nets)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--docker-warm-pool` above its ceiling is refused naming the field; the ceiling itself
    /// and 0 (no pool) pass.
    #[test]
    fn a_warm_pool_larger_than_its_ceiling_is_refused_naming_the_field() {
        let listen: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        let with_pool = |n: usize| {
            let mut c = WorkerConfig::new(
                WorkerId::new("w").unwrap(),
                vec!["https://x".into()],
                "/data".into(),
                listen,
            );
            c.docker_warm_pool = n;
            c.validate()
        };
        let max = crate::runtime::docker::WARM_POOL_SIZE_MAX;
        assert!(with_pool(0).is_ok());
        assert!(with_pool(max).is_ok());
        let e = with_pool(max + 1).unwrap_err().to_string();
        assert!(
            e.contains("docker_warm_pool") && e.contains(&max.to_string()),
            "{e}"
        );
    }

    /// `--egress-allow` takes host names beside networks and addresses: a name is resolved
    /// to its IPv4 addresses (`localhost` is in every Debian's /etc/hosts); a name that does
    /// not resolve, a subdomain pattern or a malformed network is refused naming the field.
    #[test]
    fn egress_allow_resolves_host_names_and_names_the_field_when_bad() {
        let listen: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        let config = |entries: &[&str]| {
            let mut c = WorkerConfig::new(
                WorkerId::new("w").unwrap(),
                vec!["https://x".into()],
                "/data".into(),
                listen,
            );
            c.egress_allow = entries.iter().map(|e| e.to_string()).collect();
            c
        };
        let mut resolved = config(&["localhost", "192.0.2.7", "198.51.100.0/24"]);
        resolved.resolve_egress_allow_hosts().unwrap();
        assert_eq!(
            resolved.egress_allow,
            ["127.0.0.1", "192.0.2.7", "198.51.100.0/24"]
        );
        let allow = resolved.egress_allow_networks().unwrap().unwrap();
        let shown: Vec<String> = allow.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["127.0.0.1/32", "192.0.2.7/32", "198.51.100.0/24"]);
        for bad in [
            "no-such-host.invalid",
            "*.github.com",
            "300.1.2.3",
            "198.51.100.0/33",
            "exa mple.com",
        ] {
            let mut c = config(&[bad]);
            let e = c
                .resolve_egress_allow_hosts()
                .and_then(|()| c.egress_allow_networks().map(|_| ()))
                .unwrap_err()
                .to_string();
            assert!(e.contains("egress_allow") && e.contains(bad), "{bad}: {e}");
        }
        let e = config(&["*.github.com"])
            .resolve_egress_allow_hosts()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--gateway-allow"), "{e}");
        // Unresolved, a name is refused rather than looked up again by each runtime.
        let e = config(&["localhost"])
            .egress_allow_networks()
            .unwrap_err()
            .to_string();
        assert!(e.contains("not resolved"), "{e}");
    }

    #[test]
    fn a_sandbox_without_limits_gets_the_worker_s_defaults() {
        let d = SandboxDefaults::default();
        let none = d.limits(None, None);
        assert_eq!(none.cpus, Some(SANDBOX_CPUS_DEFAULT));
        assert_eq!(none.memory_bytes, Some(SANDBOX_MEMORY_BYTES_DEFAULT));
        assert_eq!(none.pids_max, Some(SANDBOX_PIDS_DEFAULT));
        let set = d.limits(Some(8), Some(1 << 30));
        assert_eq!((set.cpus, set.memory_bytes), (Some(8), Some(1 << 30)));
        assert_eq!(
            set.pids_max,
            Some(SANDBOX_PIDS_DEFAULT),
            "pids are never unbounded"
        );
    }

    #[test]
    fn out_of_range_defaults_are_refused_naming_the_flag() {
        let listen = "127.0.0.1:0".parse().unwrap();
        let id = WorkerId::new("w").unwrap();
        for (defaults, field) in [
            (
                SandboxDefaults {
                    cpus: 0,
                    ..SandboxDefaults::default()
                },
                "sandbox_cpus",
            ),
            (
                SandboxDefaults {
                    memory_bytes: 1024,
                    ..SandboxDefaults::default()
                },
                "sandbox_memory",
            ),
            (
                SandboxDefaults {
                    pids_max: 1,
                    ..SandboxDefaults::default()
                },
                "sandbox_pids",
            ),
            (
                SandboxDefaults {
                    disk_bytes: 4096,
                    ..SandboxDefaults::default()
                },
                "sandbox_disk",
            ),
            (
                SandboxDefaults {
                    project_disk_bytes: 4096,
                    ..SandboxDefaults::default()
                },
                "project_disk",
            ),
        ] {
            let mut c =
                WorkerConfig::new(id.clone(), vec!["https://x".into()], "/data".into(), listen);
            c.sandbox_defaults = defaults;
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }

    #[test]
    fn the_egress_deny_list_parses_and_adds_the_control_endpoints_and_mcp_upstreams() {
        let id = WorkerId::new("w").unwrap();
        let listen = "127.0.0.1:0".parse().unwrap();
        let mut c = WorkerConfig::new(
            id,
            vec!["https://192.0.2.7:8120".into()],
            "/data".into(),
            listen,
        );
        c.egress_deny = vec!["203.0.113.9/24".into()];
        let deny: Vec<String> = c
            .egress_deny_networks()
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(deny, ["192.0.2.7/32", "203.0.113.0/24"]);
        // An MCP upstream is reached only through the gateway: closed to sandboxes too.
        let (id, url) = crate::parse_mcp_server("notes=http://198.51.100.4:9000/mcp").unwrap();
        c.agents = Some(crate::AgentConfig::default());
        if let Some(a) = c.agents.as_mut() {
            a.mcp_servers.insert(id, url);
        }
        let deny: Vec<String> = c
            .egress_deny_networks()
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(deny, ["192.0.2.7/32", "198.51.100.4/32", "203.0.113.0/24"]);
        c.egress_deny = vec!["10.0.0.0/33".into()];
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("egress_deny"));
    }

    #[test]
    fn a_policy_offering_gateway_needs_an_allow_list() {
        let id = WorkerId::new("w").unwrap();
        let listen = "127.0.0.1:0".parse().unwrap();
        let mut c = WorkerConfig::new(id, vec!["https://x".into()], "/data".into(), listen);
        c.policy
            .network_modes
            .insert(squadron_core::manifest::NetworkMode::Gateway);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("gateway_allow"), "{e}");
        c.gateway_allow = vec!["bad domain".into()];
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("gateway_allow"), "{e}");
        c.gateway_allow = vec!["*.github.com".into()];
        c.validate().unwrap();
    }

    #[test]
    fn relative_directories_are_refused() {
        let id = WorkerId::new("w").unwrap();
        let listen = "127.0.0.1:0".parse().unwrap();
        let mut c = WorkerConfig::new(id, vec!["http://x".into()], "./data".into(), listen);
        assert!(c.validate().unwrap_err().to_string().contains("data_dir"));
        c.data_dir = "/var/lib/squadron".into();
        c.validate().unwrap();
        c.global_dir = Some("global".into());
        assert!(c.validate().unwrap_err().to_string().contains("global_dir"));
    }
}

/// The host of `https://host:port/…` (brackets of an IPv6 address removed).
pub fn host_of_url(url: &str) -> Option<String> {
    let authority = url.split_once("://")?.1.split('/').next()?;
    let host = match authority.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| host.to_string())
}

#[cfg(test)]
mod host_tests {
    use super::host_of_url;

    #[test]
    fn hosts_of_advertised_urls() {
        assert_eq!(
            host_of_url("https://w1.example:8130").as_deref(),
            Some("w1.example")
        );
        assert_eq!(host_of_url("https://[::1]:8130/x").as_deref(), Some("::1"));
        assert_eq!(
            host_of_url("https://192.0.2.1").as_deref(),
            Some("192.0.2.1")
        );
        assert_eq!(host_of_url("no scheme"), None);
    }
}
