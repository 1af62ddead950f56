//! `squadron bench`: the closed-loop lease benchmark against --endpoint, and `bench compare`,
//! which starts its own Squadron and etcd clusters and compares them.

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use squadron_core::ids::{ProjectId, TenantId};

use super::{Ctx, OutputFormat};
use crate::lease_bench;
use crate::output::emit;
use crate::progress::Progress;

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
    /// Sandbox start latency per runtime: submit → READY and submit → RUNNING (p50/p99)
    /// over tasks run one after the other against --endpoint.
    SandboxStart(SandboxStartArgs),
    /// kill -9 of the leader under load, again and again on its own cluster: kill → first
    /// successful write and kill → new leader, p50/p99/max.
    Failover(FailoverArgs),
    /// A cluster of its own loaded to DESIGN §7's size (100,000 profiles, a million tasks):
    /// load rate, apply times, snapshots, memory, a restart and a new follower's catch-up.
    Scale(ScaleArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ScaleArgs {
    /// Nodes in the cluster (1..=7).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Projects to create (1..=100000).
    #[arg(long, default_value_t = squadron_bench::SCALE_PROJECTS_DEFAULT)]
    pub projects: usize,
    /// Profiles in each project (1..=64).
    #[arg(long, default_value_t = squadron_bench::SCALE_PROFILES_PER_PROJECT_DEFAULT)]
    pub profiles_per_project: usize,
    /// Task records to submit (1..=2000000).
    #[arg(long, default_value_t = squadron_bench::SCALE_TASKS_DEFAULT)]
    pub tasks: usize,
    /// Of those, how many stay PENDING; the others are cancelled as they are accepted.
    #[arg(long, default_value_t = squadron_bench::SCALE_PENDING_TASKS_DEFAULT)]
    pub pending_tasks: usize,
    /// Concurrent clients while loading (1..=1024).
    #[arg(long, default_value_t = squadron_bench::SCALE_CLIENTS_DEFAULT)]
    pub clients: usize,
    /// The nodes' raft.snapshot_after_entries (default: the node's own, 10,000).
    #[arg(long, value_name = "N")]
    pub snapshot_after_entries: Option<u64>,
    /// The nodes' raft.max_in_snapshot_log_to_keep: log entries kept behind a snapshot
    /// (default: the node's own, 1,000).
    #[arg(long, value_name = "N")]
    pub log_kept_after_snapshot: Option<u64>,
    /// The squadron binary that runs the nodes (default: this one).
    #[arg(long, value_name = "PATH")]
    pub squadron: Option<std::path::PathBuf>,
    /// Where the nodes' directories go (default: the system's temporary directory; a million
    /// tasks take about a gigabyte per node).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<std::path::PathBuf>,
    /// Keep the nodes' directories (configs, data, logs) and print where.
    #[arg(long)]
    pub keep_work_dir: bool,
}

#[derive(Debug, Clone, Args)]
pub struct FailoverArgs {
    /// Nodes in the cluster (3..=7).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Kills, each after the previous victim rejoined (1..=1000).
    #[arg(long, default_value_t = 20)]
    pub trials: usize,
    /// Closed-loop lease-cycle clients around each kill (1..=256).
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// The squadron binary that runs the nodes (default: this one).
    #[arg(long, value_name = "PATH")]
    pub squadron: Option<std::path::PathBuf>,
    /// Keep the nodes' directories (configs, data, logs) and print where.
    #[arg(long)]
    pub keep_work_dir: bool,
}

#[derive(Debug, Clone, Args)]
pub struct SandboxStartArgs {
    /// Runtimes to measure, comma-separated (each needs a live worker offering it).
    #[arg(long, value_delimiter = ',', default_value = "process,docker")]
    pub runtimes: Vec<String>,
    /// Tasks per runtime (1..=1000).
    #[arg(long, default_value_t = 20)]
    pub tasks: usize,
    /// The repository every task clones (a URL the workers' policy accepts).
    #[arg(long, value_name = "URL")]
    pub repository: String,
    #[arg(long, default_value = "main")]
    pub branch: String,
    /// The tasks' `network_mode` on every runtime (isolated, outbound, gateway, full); unset,
    /// the manifest's default (`outbound`), but `isolated` for kvm as docs/performance.md's
    /// first VM figures were measured.
    #[arg(long, value_name = "MODE")]
    pub network_mode: Option<String>,
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
    /// How the load reaches etcd: `grpc` (its own client protocol, as etcd's users use it) or
    /// `gateway` (its JSON gateway, which etcd 3.4 turns into a second gRPC call).
    #[arg(long, value_name = "grpc|gateway", default_value = "grpc")]
    pub etcd_client: squadron_bench::EtcdProtocol,
    /// Which node each client of either system sends to first: `leader` (every client, as
    /// Squadron's agents and workers and a leader-aware client do) or `spread` (client i at
    /// node i mod n; followers pass writes on to the leader).
    #[arg(long, value_name = "leader|spread", default_value = "leader")]
    pub route: squadron_bench::ClientRoute,
    /// The squadron binary that runs the nodes (default: this one).
    #[arg(long, value_name = "PATH")]
    pub squadron: Option<std::path::PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
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
    /// Directory with the bench worker's certificate (`squadron init … --worker-cert
    /// bench-worker=DIR`): its registration and heartbeats are a worker's own, which an
    /// operator's token may not send.
    #[arg(long, value_name = "DIR")]
    pub worker_cert_dir: Option<std::path::PathBuf>,
}

pub async fn run(ctx: &Ctx, top: BenchTop) -> anyhow::Result<()> {
    match top.cmd {
        None => {
            let a = &top.args;
            let progress = Progress::start(
                ctx.out,
                format!("lease cycles: {} clients for {} s", a.clients, a.duration),
            );
            let report = lease_bench::run(&ctx.client, a).await?;
            progress.finish(format!("lease cycles: {} clients", a.clients));
            emit(ctx.out, &report, lease_bench::render)
        }
        Some(BenchCmd::Compare(args)) => compare(ctx.out, args).await,
        Some(BenchCmd::Failover(args)) => failover(ctx.out, args).await,
        Some(BenchCmd::Scale(args)) => scale(ctx.out, args).await,
        Some(BenchCmd::SandboxStart(args)) => {
            let opts = crate::start_bench::StartBenchOptions {
                runtimes: args.runtimes,
                tasks: args.tasks,
                repository: args.repository,
                branch: args.branch,
                network_mode: crate::start_bench::network_mode(args.network_mode.as_deref())?,
            };
            let progress = Progress::start(ctx.out, "sandbox starts");
            let report = crate::start_bench::run(&ctx.client, &opts, &progress).await?;
            progress.finish("sandbox starts measured");
            emit(ctx.out, &report, crate::start_bench::render)
        }
    }
}

/// `squadron bench compare`: both clusters are stopped when the comparison ends or on Ctrl-C.
async fn compare(out: OutputFormat, args: CompareArgs) -> anyhow::Result<()> {
    let bin = node_binary(args.squadron)?;
    let mut opts = squadron_bench::CompareOptions::new(bin);
    opts.nodes = args.nodes;
    opts.clients = args.clients;
    opts.duration = Duration::from_secs(args.duration);
    if !args.workloads.is_empty() {
        opts.workloads = args
            .workloads
            .iter()
            .map(|w| w.parse())
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("--workloads: {e}"))?;
    }
    opts.failover = !args.no_failover;
    opts.etcd_bin = args.etcd;
    opts.etcd_protocol = args.etcd_client;
    opts.route = args.route;
    opts.seed = args.seed;
    opts.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let progress = Progress::start(out, "bench compare");
    let steps = |step: &str| progress.say(format!("bench compare: {step}"));
    let report = tokio::select! {
        r = squadron_bench::compare_with(&opts, &steps) => r?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; both clusters were stopped"),
    };
    progress.finish("bench compare: done");
    emit(out, &report, squadron_bench::render_table)
}

/// `squadron bench failover`: the cluster is stopped when the trials end or on Ctrl-C.
async fn failover(out: OutputFormat, args: FailoverArgs) -> anyhow::Result<()> {
    let squadron_bin = node_binary(args.squadron)?;
    let opts = squadron_bench::FailoverOptions {
        squadron_bin,
        nodes: args.nodes,
        trials: args.trials,
        clients: args.clients,
        progress: out != OutputFormat::Json,
        keep_work_dir: args.keep_work_dir,
    };
    opts.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let report = tokio::select! {
        r = squadron_bench::failover(&opts) => r?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; the cluster was stopped"),
    };
    emit(out, &report, squadron_bench::render_failover)
}

/// `squadron bench scale`: the cluster is stopped when the run ends or on Ctrl-C.
async fn scale(out: OutputFormat, args: ScaleArgs) -> anyhow::Result<()> {
    let bin = node_binary(args.squadron)?;
    let mut opts = squadron_bench::ScaleOptions::new(bin);
    opts.nodes = args.nodes;
    opts.projects = args.projects;
    opts.profiles_per_project = args.profiles_per_project;
    opts.tasks = args.tasks;
    opts.pending_tasks = args.pending_tasks;
    opts.clients = args.clients;
    opts.snapshot_after_entries = args.snapshot_after_entries;
    opts.log_kept_after_snapshot = args.log_kept_after_snapshot;
    opts.work_dir = args.work_dir;
    opts.keep_work_dir = args.keep_work_dir;
    opts.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let progress = Progress::start(out, "bench scale");
    let steps = |step: &str| progress.say(format!("bench scale: {step}"));
    let report = tokio::select! {
        r = squadron_bench::scale_with(&opts, &steps) => r?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; the cluster was stopped"),
    };
    progress.finish("bench scale: done");
    emit(out, &report, squadron_bench::render_scale)
}

/// The squadron binary the benchmark's nodes run: the one given, else this one.
fn node_binary(given: Option<std::path::PathBuf>) -> anyhow::Result<std::path::PathBuf> {
    match given {
        Some(p) => Ok(p),
        None => std::env::current_exe().context("locating this squadron binary"),
    }
}
