//! `squadron-jepsen`: run a chaos test against real nodes, re-check a recorded history, or
//! clean up what a crashed run left behind.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use squadron_client::Consistency;
use squadron_jepsen::checker::Checker;
use squadron_jepsen::cluster::NetMode;
use squadron_jepsen::history::History;
use squadron_jepsen::nemesis::NemesisKind;
use squadron_jepsen::netns::NamespaceNet;
use squadron_jepsen::node_final::NodeFinal;
use squadron_jepsen::recovery::{
    RecoveryCheck, READ_RECOVERY_MS_DEFAULT, READ_RECOVERY_MS_MAX, READ_RECOVERY_MS_MIN,
};
use squadron_jepsen::report::HtmlReport;
use squadron_jepsen::results::{Results, Validity};
use squadron_jepsen::runner::{run, RunConfig};
use squadron_jepsen::workload::Workload;

#[derive(Debug, Parser)]
#[command(
    name = "squadron-jepsen",
    about = "Jepsen-style chaos tests for Squadron"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start a cluster, run a workload under a nemesis, and judge the history.
    Run(RunArgs),
    /// Judge a recorded run again (DIR/history.jsonl, and DIR/nodes.json if present).
    Check {
        /// The run's output directory.
        dir: PathBuf,
        /// After a heal a write must succeed within this many seconds.
        #[arg(long, default_value_t = 30)]
        recovery_bound_secs: u64,
        /// After a heal a read must succeed within this many milliseconds.
        #[arg(long, default_value_t = READ_RECOVERY_MS_DEFAULT,
              value_parser = clap::value_parser!(u64).range(READ_RECOVERY_MS_MIN..=READ_RECOVERY_MS_MAX))]
        read_recovery_ms: u64,
    },
    /// Remove namespaces, links and iptables rules left by runs that no longer run.
    Cleanup {
        /// Also remove those of runs that still run.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    #[arg(long, value_enum, default_value_t = Workload::Lease)]
    workload: Workload,
    #[arg(long, value_enum, default_value_t = NemesisKind::PartitionKill)]
    nemesis: NemesisKind,
    /// Seconds of workload under faults (setup, recovery and the quiet phase come on top).
    #[arg(long, default_value_t = 60)]
    time_limit: u64,
    /// Operations per second, all clients together.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output directory (history.jsonl, results.json, report.html, node logs).
    #[arg(long)]
    out: PathBuf,
    /// The `squadron` binary. Default: $SQUADRON_BIN, else `squadron` beside this program.
    #[arg(long)]
    bin: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = NetMode::Auto)]
    net: NetMode,
    /// Clients (default depends on the workload).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Mean seconds a fault lasts.
    #[arg(long, default_value_t = 8)]
    fault_secs: u64,
    /// Mean seconds between faults.
    #[arg(long, default_value_t = 5)]
    quiet_secs: u64,
    /// After the last heal a write must succeed within this many seconds.
    #[arg(long, default_value_t = 30)]
    recovery_bound_secs: u64,
    /// After every heal a read must succeed within this many milliseconds; no quiet gap is
    /// shorter, so every heal is judged.
    #[arg(long, default_value_t = READ_RECOVERY_MS_DEFAULT,
          value_parser = clap::value_parser!(u64).range(READ_RECOVERY_MS_MIN..=READ_RECOVERY_MS_MAX))]
    read_recovery_ms: u64,
    /// Client reads: `linearizable`, or `stale` (a deliberate client bug the checkers must
    /// catch; the quiet phase's final reads stay linearizable).
    #[arg(long, value_enum, default_value_t = ReadMode::Linearizable)]
    reads: ReadMode,
    /// The largest wall-clock offset the clock nemesis applies, in seconds (5 up to a week;
    /// 86400 makes day-sized jumps).
    #[arg(long, default_value_t = squadron_jepsen::nemesis::CLOCK_SKEW_S_MAX)]
    clock_skew_secs_max: i64,
    /// Faults by name, comma-separated, injected in this order round and round instead of
    /// drawn from --nemesis's set (e.g. partition-one-way-from-leader,packet-loss).
    #[arg(long, value_delimiter = ',')]
    faults: Vec<String>,
    /// Mount the lazy filesystem under every node's data directory, so that `--nemesis mix`
    /// includes crashes that drop unsynced writes (`--nemesis crash` mounts it by itself).
    #[arg(long)]
    lazyfs: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ReadMode {
    Linearizable,
    Stale,
}

fn default_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("SQUADRON_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locating this program")?;
    let beside = exe.with_file_name("squadron");
    if beside.is_file() {
        return Ok(beside);
    }
    bail!(
        "no node binary: pass --bin, set SQUADRON_BIN, or put `squadron` beside {}",
        exe.display()
    )
}

fn exit_code(r: &Results) -> ExitCode {
    match r.valid {
        Validity::Valid => ExitCode::SUCCESS,
        Validity::Invalid => ExitCode::from(1),
        Validity::Unknown => ExitCode::from(2),
    }
}

fn check(dir: &Path, recovery_bound_secs: u64, read_recovery_ms: u64) -> anyhow::Result<Results> {
    let history = History::load(&dir.join("history.jsonl"))?;
    let nodes_path = dir.join("nodes.json");
    let nodes: Option<Vec<NodeFinal>> = if nodes_path.is_file() {
        let text = std::fs::read_to_string(&nodes_path)
            .with_context(|| format!("reading {}", nodes_path.display()))?;
        Some(
            serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", nodes_path.display()))?,
        )
    } else {
        None
    };
    let (heals, late) = RecoveryCheck {
        bound_ms: recovery_bound_secs as f64 * 1000.0,
        read_bound_ms: read_recovery_ms as f64,
    }
    .check(&history.operations()?, &history.nemesis_intervals());
    let mut results = Checker::default().check(&history, nodes.as_deref(), late);
    // Keep the facts of the run (settings, recovery times) from the earlier verdict.
    if let Some(earlier) = std::fs::read_to_string(dir.join("results.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Results>(&t).ok())
    {
        results.run = earlier.run;
    }
    results
        .run
        .insert("heals".into(), serde_json::to_value(&heals)?);
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    std::fs::write(
        dir.join("report.html"),
        HtmlReport::render(&history, &results),
    )?;
    Ok(results)
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Run(a) => {
            let bin = match a.bin {
                Some(b) => b,
                None => default_bin()?,
            };
            let cfg = RunConfig {
                nodes: a.nodes,
                workload: a.workload,
                nemesis: a.nemesis,
                time_limit: Duration::from_secs(a.time_limit),
                rate: a.rate,
                seed: a.seed,
                out: a.out.clone(),
                bin,
                net: a.net,
                concurrency: a.concurrency,
                fault: Duration::from_secs(a.fault_secs),
                quiet: Duration::from_secs(a.quiet_secs),
                recovery_bound: Duration::from_secs(a.recovery_bound_secs),
                read_recovery: Duration::from_millis(a.read_recovery_ms),
                reads: match a.reads {
                    ReadMode::Linearizable => Consistency::Linearizable,
                    ReadMode::Stale => Consistency::Stale,
                },
                clock_skew_secs_max: a.clock_skew_secs_max,
                faults: a.faults,
                lazyfs: a.lazyfs,
            };
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            // On Ctrl-C or SIGTERM the run's future is dropped, and with it the cluster: its
            // drop guards kill the nodes and tear the namespaces down.
            let results = rt.block_on(async {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .context("installing the SIGTERM handler")?;
                tokio::select! {
                    r = run(&cfg) => Ok(r?),
                    _ = tokio::signal::ctrl_c() => bail!("interrupted; the cluster was torn down"),
                    _ = term.recv() => bail!("terminated; the cluster was torn down"),
                }
            })?;
            print!("{}", results.summary());
            println!("results: {}", a.out.join("results.json").display());
            println!("report:  {}", a.out.join("report.html").display());
            Ok(exit_code(&results))
        }
        Cmd::Check {
            dir,
            recovery_bound_secs,
            read_recovery_ms,
        } => {
            let results = check(&dir, recovery_bound_secs, read_recovery_ms)?;
            print!("{}", results.summary());
            Ok(exit_code(&results))
        }
        Cmd::Cleanup { all } => {
            let removed = NamespaceNet::cleanup_stale(all)?;
            if removed.is_empty() {
                println!("nothing to clean up");
            }
            for r in removed {
                println!("removed {r}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
