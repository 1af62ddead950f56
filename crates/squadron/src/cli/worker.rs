//! `squadron worker`: runs a worker (no subcommand), or manages worker nodes.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use squadron_client::{Decommission, RegisterWorker};
use squadron_core::ids::{SkillId, WorkerId};
use squadron_core::manifest::RuntimeKind;
use squadron_core::worker::Worker;

use super::Ctx;
use crate::node;
use crate::output::{self, emit, emit_generic, Table};

/// `squadron worker --control URL… --data-dir DIR --runtimes process,docker` runs a worker;
/// `squadron worker list|get|…` manages them.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct WorkerArgs {
    #[command(subcommand)]
    pub cmd: Option<WorkerCmd>,
    #[command(flatten)]
    pub run: WorkerRunArgs,
}

/// A duration (`30m`, `12h`, `7d`, `0s`) in ms.
fn parse_duration_ms(s: &str) -> Result<u64, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (say 30m, 12h, 7d)"))?;
    u64::try_from(d.as_millis()).map_err(|_| format!("{s:?}: too long"))
}

/// `CLASS=DURATION` of `--output-retention`, the duration in ms; checked as the worker's
/// configuration will check it, so a bad value stops the command before anything starts.
fn parse_retention(s: &str) -> Result<(String, u64), String> {
    let (class, age) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: say CLASS=DURATION, e.g. short=12h"))?;
    let ms = parse_duration_ms(age).map_err(|e| format!("{s:?}: {e}"))?;
    squadron_worker::OutputRetention::default()
        .with_age(class, ms)
        .map_err(|e| e.to_string())?;
    Ok((class.to_string(), ms))
}

#[derive(Debug, Clone, Args)]
pub struct WorkerRunArgs {
    /// This worker's id; defaults to the host name.
    #[arg(long)]
    pub id: Option<WorkerId>,
    /// A control node's REST URL; repeat or comma-separate for several.
    #[arg(long = "control", value_name = "URL", value_delimiter = ',')]
    pub control: Vec<String>,
    /// Where task directories live.
    #[arg(long, value_name = "DIR", default_value = "./.squadron-worker")]
    pub data_dir: PathBuf,
    /// Runtimes to offer; each is probed at start and left out, with the reason, if this host
    /// cannot run it.
    #[arg(long, value_delimiter = ',', default_value = "process")]
    pub runtimes: Vec<RuntimeKind>,
    /// Tasks run at once.
    #[arg(long, default_value_t = 4)]
    pub capacity: u32,
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub heartbeat_interval_ms: u64,
    /// How often the agent inside each Docker sandbox heartbeats (with its CPU, memory and
    /// disk figures).
    #[arg(long, value_name = "MS", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(100..=300_000))]
    pub agent_heartbeat_interval_ms: u64,
    /// Address of the output server (logs, artifacts, live stream) control nodes relay.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8130")]
    pub listen: SocketAddr,
    /// URL control nodes use to reach the output server (default `https://LISTEN`).
    #[arg(long, value_name = "URL")]
    pub advertise: Option<String>,
    /// Directory holding this worker's certificate (`worker.pem`, `worker.key`) and the
    /// cluster CA (`ca.pem`, unless --cacert names it); default `DATA_DIR/pki`.
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,
    /// A one-time bootstrap token (`squadron token bootstrap --token-out F`): without a
    /// certificate in the cert dir, the worker exchanges it for one, then scrubs the file.
    #[arg(long, value_name = "FILE")]
    pub bootstrap_token_file: Option<PathBuf>,
    /// cgroup v2 mount for the process runtime (detected when unset).
    #[arg(long, value_name = "DIR")]
    pub cgroup_root: Option<PathBuf>,
    /// Image of the Docker runtime.
    #[arg(long, default_value = "squadron-agent:latest")]
    pub docker_image: String,
    /// Warm Docker containers kept started, so a task of the default shape (hardened,
    /// `network_mode: outbound`) skips the engine's create and start; needs root. 0: none.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub docker_warm_pool: usize,
    /// libvirt URI of the KVM runtime.
    #[arg(long, value_name = "URI", default_value = "qemu:///system")]
    pub vm_uri: String,
    /// Directory of the KVM runtime's image (`scripts/build-vm-image`; default
    /// ~/.cache/squadron-vm).
    #[arg(long, value_name = "DIR")]
    pub vm_image_dir: Option<PathBuf>,
    /// Where the KVM runtime keeps what QEMU reads (image copies, console logs); it and every
    /// parent must be searchable by other users (QEMU runs as libvirt's own user).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/squadron/vm")]
    pub vm_state_dir: PathBuf,
    /// The virtiofs daemon of the KVM runtime (looked for on PATH and in the usual places).
    #[arg(long, value_name = "FILE")]
    pub virtiofsd: Option<PathBuf>,
    /// The KVM runtime's domain type: `auto` boots the image under `kvm` once and falls back
    /// to `qemu` (software emulation) where that fails.
    #[arg(long, value_name = "TYPE", default_value = "auto", value_parser = ["auto", "kvm", "qemu"])]
    pub vm_domain_type: String,
    /// Test hook: KVM guests wait this long before starting their agent (a slow boot on
    /// purpose, for the provision timeout's test).
    #[arg(long, value_name = "MS", hide = true)]
    pub vm_test_boot_delay_ms: Option<u64>,
    /// Host directory mounted read-only at /mnt/global in sandboxes.
    #[arg(long, value_name = "DIR")]
    pub global_dir: Option<PathBuf>,
    /// Worker environment variables copied into sandboxes (e.g. provider API keys).
    #[arg(long = "env-allow", value_name = "NAME", value_delimiter = ',')]
    pub env_allowlist: Vec<String>,
    /// CPUs of a sandbox whose manifest sets none, and of every agent attempt.
    #[arg(long, value_name = "N", default_value_t = squadron_worker::SANDBOX_CPUS_DEFAULT)]
    pub sandbox_cpus: u32,
    /// Memory of a sandbox whose manifest sets none, and of every agent attempt (`4Gi`).
    #[arg(long, value_name = "SIZE", default_value = "4Gi")]
    pub sandbox_memory: String,
    /// Disk quota of a task's directory (its clone, outputs and logs) whose manifest sets no
    /// `disk` (`10Gi`); a task that fills it is stopped.
    #[arg(long, value_name = "SIZE", default_value = "10Gi")]
    pub sandbox_disk: String,
    /// Disk quota of a project's sandbox (`placement: project`: its clone and every agent
    /// profile's worktree, state and logs); agents that fill it meet "no space left". Applies
    /// to sandboxes made from now on: an existing one keeps the size it was made with.
    #[arg(long, value_name = "SIZE", default_value = "20Gi")]
    pub project_disk: String,
    /// Run tasks and project sandboxes without a disk quota (quotas loop-mount an image, so
    /// a worker that is not root refuses to start without this).
    #[arg(long)]
    pub no_disk_quota: bool,
    /// How long an ended task's files (logs, events, artifacts) stay on this worker, by its
    /// manifest's `retention_class`: `CLASS=DURATION`, repeat or comma-separate.
    /// Default: standard=7d, short=1d, credentialed-short=1d (a task kept for break-glass
    /// stays until it is removed).
    #[arg(long, value_name = "CLASS=DURATION", value_delimiter = ',', value_parser = parse_retention)]
    pub output_retention: Vec<(String, u64)>,
    /// Processes one sandbox may hold.
    #[arg(long, value_name = "N", default_value_t = squadron_worker::SANDBOX_PIDS_DEFAULT)]
    pub sandbox_pids: u64,
    /// IPv4 networks `outbound` sandboxes may not reach (CIDR), on top of the host itself,
    /// loopback, link-local, other sandboxes and the control endpoints.
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    pub egress_deny: Vec<String>,
    /// The only IPv4 networks (CIDR), addresses or host names `outbound` sandboxes may open
    /// connections to; the deny list and the always-denied ranges still win. A host name is
    /// resolved to its IPv4 addresses when the worker starts (restart it to follow a change;
    /// names whose addresses rotate belong in --gateway-allow). Unset: anywhere not denied.
    /// Name servers are not added: list them if sandboxes resolve names.
    #[arg(long, value_name = "CIDR|HOST", value_delimiter = ',')]
    pub egress_allow: Vec<String>,
    /// Let manifests use `network_mode: full` (the host's own network); refused otherwise.
    #[arg(long)]
    pub allow_full_network: bool,
    /// What `network_mode: gateway` sandboxes may reach through the worker's HTTP CONNECT
    /// proxy: a domain (`api.anthropic.com`), its subdomains (`*.github.com`) or an IPv4
    /// network (CIDR); never this host, link-local or the control endpoints. Given, the
    /// worker offers the mode.
    #[arg(long, value_name = "DESTINATION", value_delimiter = ',')]
    pub gateway_allow: Vec<String>,
    /// Extra trust anchors (PEM) for the upstreams of credentials injected at egress, beside
    /// the system's bundle: an internal API gateway's CA.
    #[arg(long, value_name = "FILE")]
    pub egress_ca: Option<std::path::PathBuf>,
    /// Let manifests clone a local path or `file://` URL on this host (off: another task's
    /// inbox or a project's checkout is a local path too).
    #[arg(long)]
    pub allow_local_repositories: bool,
    /// What this worker runs, as TOML (`network_modes`, `full_control`,
    /// `repository_sources`, `cpus_max`, `memory_bytes_max`, `disk_bytes_max`); the flags
    /// above widen it. Default: isolated and outbound networks, https/ssh/git repositories,
    /// no full control, no ceilings.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Replace every retry delay of manifests (clone, provision) with this many ms.
    #[arg(long, value_name = "MS")]
    pub backoff_override_ms: Option<u64>,
    /// Do not run agent profiles (`placement: project`) on this worker.
    #[arg(long)]
    pub no_agents: bool,
    /// Time to live of the leases this worker's agents hold; renewed every third of it.
    #[arg(long, value_name = "MS", default_value_t = squadron_worker::AGENT_LEASE_TTL_MS_DEFAULT)]
    pub agent_lease_ttl_ms: u64,
    /// Grace between SIGTERM and SIGKILL when a provider is stopped or taken over.
    #[arg(long, value_name = "MS", default_value_t = squadron_worker::AGENT_STOP_GRACE_MS_DEFAULT)]
    pub agent_stop_grace_ms: u64,
    /// How long a project's sandbox (its clone, worktrees, state and volume) stays on this
    /// worker once the project is no longer attached here (detached, or attached to another
    /// worker), e.g. `12h`, `0s`; attaching it here again meanwhile from the same repository
    /// finds it as it was.
    #[arg(long, value_name = "DURATION", default_value = "1d", value_parser = parse_duration_ms)]
    pub detached_sandbox_retention: u64,
    /// How often the worker reads whether its project sandboxes are still attached here (ms).
    #[arg(long, value_name = "MS", hide = true, default_value_t = squadron_worker::DETACHED_SWEEP_INTERVAL_MS_DEFAULT)]
    pub detached_sweep_interval_ms: u64,
    /// Run a provider as a shell script from this host: `NAME=PATH` (codex, claude or
    /// script); repeat for several. Without it codex and claude run as the `codex` and
    /// `claude` commands.
    #[arg(long = "provider-script", value_name = "NAME=PATH")]
    pub provider_scripts: Vec<String>,
    /// Skills this host offers to agent profiles' capability manifests.
    #[arg(long, value_delimiter = ',')]
    pub skills: Vec<SkillId>,
    /// An MCP server this host offers to agent profiles: `NAME=URL`, its streamable-HTTP
    /// endpoint. Providers reach it only through the worker's MCP gateway, with the
    /// profile's `mcp_server:use` grant; repeat for several.
    #[arg(long = "mcp-server", value_name = "NAME=URL")]
    pub mcp_servers: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum WorkerCmd {
    /// Register (or re-register) a worker.
    Register {
        #[arg(long)]
        worker: WorkerId,
        #[arg(long, default_value = "127.0.0.1:0")]
        address: String,
        #[arg(long, value_delimiter = ',', default_value = "process")]
        runtimes: Vec<RuntimeKind>,
        #[arg(long, default_value_t = 4)]
        capacity: u32,
        /// `key=value`; repeat for several labels.
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        #[arg(long)]
        heartbeat_interval_ms: Option<u64>,
    },
    /// List workers.
    List,
    /// Show a worker.
    Get { id: WorkerId },
    /// Send one heartbeat for a worker.
    Heartbeat { id: WorkerId },
    /// An operator's audited decision that a worker and its processes are gone.
    Decommission {
        id: WorkerId,
        #[arg(long)]
        operator: String,
        #[arg(long)]
        reason: String,
    },
}

/// `squadron worker [flags]` runs a worker until a signal; a subcommand manages workers.
pub async fn run(ctx: &Ctx, args: WorkerArgs, cacert: Option<PathBuf>) -> anyhow::Result<()> {
    match args.cmd {
        Some(cmd) => manage(ctx, cmd).await,
        None => node::worker(args.run, cacert).await,
    }
}

async fn manage(ctx: &Ctx, cmd: WorkerCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        WorkerCmd::Register {
            worker,
            address,
            runtimes,
            capacity,
            labels,
            heartbeat_interval_ms,
        } => {
            let req = RegisterWorker {
                worker,
                address,
                runtimes,
                capacity,
                labels: labels.into_iter().collect(),
                heartbeat_interval_ms,
                policy: None,
            };
            ctx.outcome(&c.register_worker(&req, ctx.key()).await?)
        }
        WorkerCmd::List => {
            let list = c.list_workers(ctx.consistency).await?;
            emit(ctx.out, &list, |list| workers_table(list))
        }
        WorkerCmd::Get { id } => emit_generic(ctx.out, &c.get_worker(&id, ctx.consistency).await?),
        WorkerCmd::Heartbeat { id } => ctx.outcome(&c.worker_heartbeat(&id, ctx.key()).await?),
        WorkerCmd::Decommission {
            id,
            operator,
            reason,
        } => ctx.outcome(
            &c.decommission_worker(&id, &Decommission { operator, reason }, ctx.key())
                .await?,
        ),
    }
}

fn workers_table(list: &[Worker]) -> String {
    let mut t = Table::new(&[
        "id",
        "status",
        "runtimes",
        "capacity",
        "tasks",
        "last_heartbeat_ms",
        "address",
    ]);
    for w in list {
        t.row(vec![
            w.id.to_string(),
            serde_json::to_value(w.status)
                .map(|v| output::cell(&v))
                .unwrap_or_default(),
            w.runtimes
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(","),
            w.capacity.to_string(),
            w.tasks.len().to_string(),
            w.last_heartbeat_ms.to_string(),
            w.address.clone(),
        ]);
    }
    t.render()
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected key=value, got {s:?}"))
}
