//! The command line: `squadron <command> [flags]`. Flags are named after the REST bodies'
//! fields (`--expected-generation` for `expected_generation`); the id of the command's own noun
//! (`task get ID`, `lease renew ID`) is positional.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::de::DeserializeOwned;
use squadron_core::ids::{
    Digest, Generation, LeaseId, McpServerId, ProfileId, ProfileKey, ProjectId, SkillId, TaskId,
    TenantId, WorkerId,
};
use squadron_core::lease::FenceReason;
use squadron_core::mailbox::MessageKind;
use squadron_core::manifest::RuntimeKind;
use squadron_core::provider::Provider;
use squadron_core::task::TaskState;
use squadron_core::ValidationError;

#[derive(Debug, Parser)]
#[command(
    name = "squadron",
    version,
    about = "Squadron: a Raft-replicated control plane for AI coding agents",
    long_about = "Squadron: a Raft-replicated control plane for AI coding agents.\n\n\
        `squadron dev` runs a single-node control plane; `squadron server --config FILE` runs \
        one node of a cluster; every other command is a client of the REST API of the nodes \
        given with --endpoint (tried in order; a write whose outcome is unknown is never sent \
        twice unless it carries --idempotency-key)."
)]
pub struct Cli {
    /// A control node's REST base URL; repeat for several nodes (tried in order).
    #[arg(
        long = "endpoint",
        global = true,
        value_name = "URL",
        env = "SQUADRON_ENDPOINT",
        value_delimiter = ',',
        default_value = squadron_client::ENDPOINT_DEFAULT
    )]
    pub endpoints: Vec<String>,

    /// How results are printed.
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,

    /// Read the answering node's applied state instead of a linearizable read.
    #[arg(long, global = true)]
    pub stale: bool,

    /// Send this idempotency key with the write (a retry with the same key gets the first
    /// answer, and may safely go to another endpoint).
    #[arg(long, global = true, value_name = "KEY")]
    pub idempotency_key: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned text for people.
    Table,
    /// The typed value as pretty JSON.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one control node of a cluster from a TOML configuration file.
    Server {
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Run a single-node cluster and a local worker on this machine.
    #[command(
        long_about = "Run a single-node cluster on this machine: embedded RocksDB under \
            --data-dir, the REST API and dashboard on --listen, gRPC on --grpc-listen, and a \
            local worker (data under --data-dir/worker) with the process runtime, plus the \
            Docker runtime when a Docker engine answers. --no-worker runs the control plane \
            only."
    )]
    Dev {
        #[arg(long, value_name = "DIR", default_value = "./.squadron")]
        data_dir: PathBuf,
        /// REST and dashboard address.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8120")]
        listen: SocketAddr,
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8121")]
        grpc_listen: SocketAddr,
        /// Address of the local worker's output server.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8130")]
        worker_listen: SocketAddr,
        /// Do not start the local worker.
        #[arg(long)]
        no_worker: bool,
    },
    /// Cluster membership and health.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Projects and their sandbox.
    #[command(subcommand)]
    Project(ProjectCmd),
    /// Agent profiles, capability manifests, MCP authorization.
    #[command(subcommand)]
    Profile(ProfileCmd),
    /// Runtime leases and takeovers.
    #[command(subcommand)]
    Lease(LeaseCmd),
    /// Continuity capsules.
    #[command(subcommand)]
    Capsule(CapsuleCmd),
    /// Profile mailboxes.
    #[command(subcommand)]
    Mailbox(MailboxCmd),
    /// Run a worker (with no subcommand), or manage worker nodes.
    Worker(WorkerArgs),
    /// Tasks.
    #[command(subcommand)]
    Task(TaskCmd),
    /// A project's release evidence: profiles, peak processes, takeovers, dual writers,
    /// refused stale commits, roster deliveries, MCP denials, leftovers.
    Evidence(EvidenceArgs),
    /// Closed-loop lease benchmark: acquire → renew → release cycles.
    Bench(BenchTop),
}

/// `squadron bench [flags]` runs the lease benchmark against --endpoint; `squadron bench
/// compare …` starts its own Squadron and etcd clusters and compares them.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchTop {
    #[command(subcommand)]
    pub cmd: Option<BenchCmd>,
    #[command(flatten)]
    pub args: BenchArgs,
}

#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Squadron against etcd, side by side on loopback, same load generator, ratios.
    Compare(CompareArgs),
}

#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// Nodes per cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Client counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    pub clients: Vec<usize>,
    /// Seconds per measured point.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub duration: u64,
    /// Workloads, comma-separated: lease-cycle, capacity, read, submit (default: all).
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Skip the kill -9 failover measurement.
    #[arg(long)]
    pub no_failover: bool,
    /// The etcd binary.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/etcd")]
    pub etcd: std::path::PathBuf,
    /// The squadron binary that runs the nodes (default: this one).
    #[arg(long, value_name = "PATH")]
    pub squadron: Option<std::path::PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCmd {
    /// Every node's own view (stale reads of every --endpoint and of every member), with the
    /// leader and term the cluster agrees on.
    Status,
    /// Add a node as a learner.
    Add {
        #[arg(long)]
        id: u64,
        /// The new node's REST `host:port`.
        #[arg(long, value_name = "HOST:PORT")]
        rest: String,
        /// The new node's gRPC `host:port`.
        #[arg(long, value_name = "HOST:PORT")]
        grpc: String,
    },
    /// Promote a learner to voter.
    Promote {
        #[arg(long)]
        id: u64,
    },
    /// Remove a voter or learner.
    Remove {
        #[arg(long)]
        id: u64,
    },
}

/// `--tenant T --project P`.
#[derive(Debug, Clone, Args)]
pub struct ProjectRef {
    #[arg(long)]
    pub tenant: TenantId,
    #[arg(long)]
    pub project: ProjectId,
}

#[derive(Debug, Subcommand)]
pub enum ProjectCmd {
    /// Create a project.
    Create {
        #[command(flatten)]
        at: ProjectRef,
        #[arg(long)]
        max_profiles: Option<u32>,
        #[arg(long)]
        max_active: Option<u32>,
    },
    /// List projects.
    List,
    /// Show a project with its sandbox, slots and stats.
    Get {
        #[command(flatten)]
        at: ProjectRef,
    },
    /// Attach the project's single sandbox.
    AttachSandbox {
        #[command(flatten)]
        at: ProjectRef,
        #[arg(long)]
        worker: WorkerId,
        #[arg(long, default_value = "process")]
        runtime: RuntimeKind,
        #[arg(long)]
        sandbox_ref: String,
    },
    /// Detach the project's sandbox (refused while slots are held).
    DetachSandbox {
        #[command(flatten)]
        at: ProjectRef,
        #[arg(long)]
        sandbox_ref: String,
    },
    /// The project's roster.
    Roster {
        #[command(flatten)]
        at: ProjectRef,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProfileCmd {
    /// Create an agent profile.
    Create {
        #[command(flatten)]
        at: ProjectRef,
        #[arg(long)]
        key: ProfileKey,
        /// Provider priority list, preferred first.
        #[arg(long, value_delimiter = ',', default_value = "codex,claude")]
        providers: Vec<Provider>,
        #[arg(long)]
        context_ref: Option<String>,
    },
    /// Show a profile: generation, live lease, capsule head, capabilities.
    Get { id: ProfileId },
    /// List a project's profiles.
    List {
        #[command(flatten)]
        at: ProjectRef,
    },
    /// Replace the capability manifest (compare-and-swap on its version).
    Capabilities {
        id: ProfileId,
        #[arg(long)]
        expected_version: u64,
        #[arg(long, value_delimiter = ',')]
        required_skills: Vec<SkillId>,
        #[arg(long, value_delimiter = ',')]
        mcp_servers: Vec<McpServerId>,
    },
    /// Grant the profile mcp_server:use on a server.
    McpGrant {
        id: ProfileId,
        #[arg(long)]
        server: McpServerId,
    },
    /// Revoke mcp_server:use.
    McpRevoke {
        id: ProfileId,
        #[arg(long)]
        server: McpServerId,
    },
    /// Check mcp_server:use (exit 1 with permission_denied when not allowed).
    McpCheck {
        id: ProfileId,
        #[arg(long)]
        server: McpServerId,
    },
    /// Launch the profile's provider in its project's sandbox under a new lease.
    Launch {
        id: ProfileId,
        /// The provider; by default the profile's first one the worker can launch.
        #[arg(long)]
        provider: Option<Provider>,
        /// The worker that makes the project's sandbox, when the project has none yet.
        #[arg(long)]
        worker: Option<WorkerId>,
        /// The repository the sandbox is cloned from, when this launch makes it.
        #[arg(long, value_name = "URL")]
        repository: Option<String>,
        #[arg(long, requires = "repository")]
        branch: Option<String>,
        /// A file whose text is given to the provider on standard input.
        #[arg(long, value_name = "FILE")]
        prompt_file: Option<PathBuf>,
    },
    /// Show the profile's provider attempt as its worker sees it.
    Observe { id: ProfileId },
    /// Take the profile over: graceful (capsule, fence, grant) or crash (expiry, evidence,
    /// grant); the next provider is started.
    Takeover {
        id: ProfileId,
        #[arg(long, value_enum)]
        kind: TakeoverKindArg,
        /// The next provider; by default the profile's preferred one other than the current.
        #[arg(long)]
        provider: Option<Provider>,
        /// Crash takeover: how long to wait for the old lease to expire.
        #[arg(long, value_name = "MS")]
        wait_for_expiry_ms: Option<u64>,
    },
    /// Stop the provider (SIGTERM, grace, SIGKILL), reap it and end its lease.
    Stop {
        id: ProfileId,
        #[arg(long, value_name = "MS")]
        grace_ms: Option<u64>,
    },
    /// Reap a dead or fenced generation and record the evidence (frees its slot).
    Reap { id: ProfileId },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TakeoverKindArg {
    Graceful,
    Crash,
}

/// `squadron evidence`: the ADR's release-gate evidence of one project.
#[derive(Debug, Clone, Args)]
pub struct EvidenceArgs {
    #[arg(long, default_value = "default")]
    pub tenant: TenantId,
    #[arg(long)]
    pub project: ProjectId,
}

/// The holder of a lease to be granted: `--provider --worker --process [--cgroup] --ttl-ms`.
#[derive(Debug, Clone, Args)]
pub struct HolderArgs {
    #[arg(long, default_value = "codex")]
    pub provider: Provider,
    /// The worker that launches the provider (the project sandbox's worker).
    #[arg(long)]
    pub worker: WorkerId,
    /// A descriptor of the process, for operators.
    #[arg(long, default_value = "squadron-cli")]
    pub process: String,
    /// The generation-owned cgroup leaf, if any.
    #[arg(long)]
    pub cgroup: Option<String>,
    #[arg(long, default_value_t = 30_000)]
    pub ttl_ms: u64,
}

/// A capsule draft: from `--capsule-file` (JSON of a `CapsuleDraft`) or from flags.
#[derive(Debug, Clone, Args)]
pub struct CapsuleArgs {
    /// A JSON file holding the whole draft (`sequence`, `previous`, `schema_version`,
    /// `payload`, `expected_digest`); `-` reads standard input.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["sequence", "previous", "task_state"])]
    pub capsule_file: Option<PathBuf>,
    /// The chain position this capsule takes (1 for the first).
    #[arg(long)]
    pub sequence: Option<u64>,
    /// The digest of the current chain head.
    #[arg(long)]
    pub previous: Option<Digest>,
    #[arg(long, default_value_t = squadron_core::limits::CAPSULE_SCHEMA_VERSION_CURRENT)]
    pub schema_version: u32,
    #[arg(long, default_value = "")]
    pub task_state: String,
    /// Repeat for several decisions.
    #[arg(long = "decision")]
    pub decisions: Vec<String>,
    /// Repeat for several items.
    #[arg(long = "pending-work")]
    pub pending_work: Vec<String>,
    #[arg(long, default_value = "")]
    pub repository_revision: String,
    #[arg(long, default_value_t = 0)]
    pub mailbox_cursor: u64,
    #[arg(long, default_value = "")]
    pub context_ref: String,
    /// Refuse the commit unless the computed digest equals this.
    #[arg(long)]
    pub expected_digest: Option<Digest>,
}

// Parsed once per run; the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum LeaseCmd {
    /// Acquire a lease: compare-and-swap on the profile's generation.
    Acquire {
        #[arg(long)]
        profile: ProfileId,
        /// The profile generation the caller last saw.
        #[arg(long)]
        expected_generation: Generation,
        #[command(flatten)]
        holder: HolderArgs,
    },
    /// Renew (heartbeat) a lease.
    Renew {
        id: LeaseId,
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        generation: Generation,
        #[arg(long, default_value_t = 30_000)]
        ttl_ms: u64,
    },
    /// Release a lease; frees its slot.
    Release {
        id: LeaseId,
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        generation: Generation,
    },
    /// Fence a lease; it keeps its slot until reaped.
    Fence {
        id: LeaseId,
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        generation: Generation,
        #[arg(long, default_value = "operator", value_parser = parse_serde::<FenceReason>)]
        reason: FenceReason,
    },
    /// Record reap evidence (cgroup populated 0) for the lease's generation.
    Evidence {
        id: LeaseId,
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        generation: Generation,
        #[arg(long)]
        cgroup: String,
        /// Whether the cgroup still had processes (evidence must say false).
        #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
        populated: bool,
        /// When the worker observed it (default: now).
        #[arg(long)]
        observed_at_ms: Option<u64>,
    },
    /// Show a lease.
    Get { id: LeaseId },
    /// List a project's leases.
    List {
        #[command(flatten)]
        at: ProjectRef,
    },
    /// Graceful takeover: commit a capsule, fence the lease, grant the next holder.
    TakeoverGraceful {
        #[arg(long)]
        profile: ProfileId,
        /// The lease being taken over.
        #[arg(long)]
        lease: LeaseId,
        #[arg(long)]
        generation: Generation,
        #[command(flatten)]
        capsule: CapsuleArgs,
        #[command(flatten)]
        next: HolderArgs,
        /// Reap evidence for the old process: its emptied cgroup.
        #[arg(long, value_name = "CGROUP")]
        old_evidence_cgroup: Option<String>,
    },
    /// Crash takeover: after expiry, with reap evidence for the dead generation.
    TakeoverCrash {
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        lease: LeaseId,
        #[arg(long)]
        generation: Generation,
        #[command(flatten)]
        next: HolderArgs,
        /// Reap evidence: the dead generation's emptied cgroup (unless recorded before).
        #[arg(long, value_name = "CGROUP")]
        evidence_cgroup: Option<String>,
    },
}

// Parsed once per run; the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum CapsuleCmd {
    /// Commit a continuity capsule under the profile's current lease.
    Commit {
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        lease: LeaseId,
        #[arg(long)]
        generation: Generation,
        #[command(flatten)]
        capsule: CapsuleArgs,
    },
    /// The profile's recent capsules, oldest first.
    List {
        #[arg(long)]
        profile: ProfileId,
    },
}

#[derive(Debug, Subcommand)]
pub enum MailboxCmd {
    /// Post a message to a profile's mailbox, as an operator.
    Post {
        #[arg(long)]
        profile: ProfileId,
        #[arg(long, default_value = "note", value_parser = parse_serde::<MessageKind>)]
        kind: MessageKind,
        #[arg(long)]
        body: String,
        /// The operator posting it.
        #[arg(long, default_value = "cli")]
        operator: String,
    },
    /// Read a profile's unacknowledged messages.
    Read {
        #[arg(long)]
        profile: ProfileId,
    },
    /// Acknowledge messages through a sequence (fenced by the reader's lease).
    Ack {
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        lease: LeaseId,
        #[arg(long)]
        generation: Generation,
        #[arg(long)]
        through_seq: u64,
    },
}

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
    /// Address of the output server (logs, artifacts, live stream) control nodes relay.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8130")]
    pub listen: SocketAddr,
    /// URL control nodes use to reach the output server (default `http://LISTEN`).
    #[arg(long, value_name = "URL")]
    pub advertise: Option<String>,
    /// cgroup v2 mount for the process runtime (detected when unset).
    #[arg(long, value_name = "DIR")]
    pub cgroup_root: Option<PathBuf>,
    /// Image of the Docker runtime.
    #[arg(long, default_value = "squadron-agent:latest")]
    pub docker_image: String,
    /// Host directory mounted read-only at /mnt/global in sandboxes.
    #[arg(long, value_name = "DIR")]
    pub global_dir: Option<PathBuf>,
    /// Worker environment variables copied into sandboxes (e.g. provider API keys).
    #[arg(long = "env-allow", value_name = "NAME", value_delimiter = ',')]
    pub env_allowlist: Vec<String>,
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
    /// Run a provider as a shell script from this host: `NAME=PATH` (codex, claude or
    /// script); repeat for several. Without it codex and claude run as the `codex` and
    /// `claude` commands.
    #[arg(long = "provider-script", value_name = "NAME=PATH")]
    pub provider_scripts: Vec<String>,
    /// Skills this host offers to agent profiles' capability manifests.
    #[arg(long, value_delimiter = ',')]
    pub skills: Vec<SkillId>,
    /// MCP servers this host offers to agent profiles' capability manifests.
    #[arg(long, value_delimiter = ',')]
    pub mcp_servers: Vec<McpServerId>,
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

#[derive(Debug, Subcommand)]
pub enum TaskCmd {
    /// Submit a task manifest (YAML, or JSON when the file ends in .json or starts with `{`).
    Submit {
        /// The manifest file; `-` reads standard input.
        file: PathBuf,
        /// Wait until the task is terminal and print it (with --output json: the task as
        /// JSON, with `id`, `state`, `exit_code` and `artifacts`).
        #[arg(long)]
        wait: bool,
        /// Show state changes and live output until the task ends (implies --wait).
        #[arg(long)]
        follow: bool,
        /// Give up waiting after this many seconds.
        #[arg(long, value_name = "SECS", default_value_t = 600)]
        timeout: u64,
    },
    /// A task's output: stdout (default), stderr or events.
    Logs {
        id: TaskId,
        #[arg(long, default_value = "stdout", value_parser = ["stdout", "stderr", "events"])]
        stream: String,
        /// Only the last N lines.
        #[arg(long, value_name = "N")]
        tail: Option<u64>,
        /// Keep printing output as it arrives until the task ends.
        #[arg(long)]
        follow: bool,
    },
    /// List a task's artifacts, or download one with --download NAME.
    Artifacts {
        id: TaskId,
        #[arg(long, value_name = "NAME")]
        download: Option<String>,
        /// Where to write the download (default: the artifact's base name; `-` for stdout).
        #[arg(long, value_name = "PATH", requires = "download")]
        to: Option<PathBuf>,
    },
    /// List tasks, oldest first.
    List {
        #[arg(long, value_parser = parse_task_state)]
        state: Option<TaskState>,
        /// Only tasks with a larger id.
        #[arg(long)]
        after: Option<u64>,
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Show a task.
    Get { id: TaskId },
    /// Cancel a task.
    Cancel {
        id: TaskId,
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Concurrent closed-loop clients.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Seconds to run.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub duration: u64,
    /// Profiles in the bench project (1..=64); client i uses profile i % P.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub profiles: u32,
    #[arg(long, default_value = "bench")]
    pub tenant: TenantId,
    /// Default: bench-<random>.
    #[arg(long)]
    pub project: Option<ProjectId>,
    /// TTL of the bench leases.
    #[arg(long, default_value_t = 30_000)]
    pub ttl_ms: u64,
}

/// Parses a snake_case keyword through the type's serde name.
pub fn parse_serde<T: DeserializeOwned>(s: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|e| e.to_string())
}

fn parse_task_state(s: &str) -> Result<TaskState, ValidationError> {
    TaskState::parse("state", s)
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected key=value, got {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_and_version_are_answered_by_the_parser() {
        let help = Cli::try_parse_from(["squadron", "--help"]).unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        let text = help.to_string();
        for command in ["server", "dev", "cluster", "task", "bench"] {
            assert!(text.contains(command), "{command} missing from --help");
        }
        let dev = Cli::try_parse_from(["squadron", "dev", "--help"]).unwrap_err();
        assert!(dev.to_string().contains("local worker"));
        let version = Cli::try_parse_from(["squadron", "--version"]).unwrap_err();
        assert_eq!(version.kind(), clap::error::ErrorKind::DisplayVersion);
    }

    #[test]
    fn endpoints_repeat_and_default() {
        let cli = Cli::try_parse_from(["squadron", "project", "list"]).unwrap();
        assert_eq!(cli.endpoints, vec![squadron_client::ENDPOINT_DEFAULT]);
        let cli = Cli::try_parse_from([
            "squadron",
            "cluster",
            "status",
            "--endpoint",
            "http://127.0.0.1:8211",
            "--endpoint",
            "http://127.0.0.1:8212",
            "--output",
            "json",
        ])
        .unwrap();
        assert_eq!(cli.endpoints.len(), 2);
        assert_eq!(cli.output, OutputFormat::Json);
    }

    #[test]
    fn bad_input_is_refused_by_the_parser() {
        assert!(Cli::try_parse_from(["squadron", "bench", "--profiles", "65"]).is_err());
        assert!(Cli::try_parse_from(["squadron", "task", "get", "zero"]).is_err());
        assert!(Cli::try_parse_from(["squadron", "task", "list", "--state", "nope"]).is_err());
        assert!(Cli::try_parse_from([
            "squadron",
            "project",
            "create",
            "--tenant",
            "Bad Name",
            "--project",
            "p"
        ])
        .is_err());
        let cli = Cli::try_parse_from([
            "squadron",
            "lease",
            "fence",
            "3",
            "--profile",
            "1",
            "--generation",
            "2",
            "--reason",
            "expired",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Lease(LeaseCmd::Fence {
                reason: FenceReason::Expired,
                ..
            })
        ));
    }
}
