//! `squadron soak`: ADR-0011's canary in a loop against a running cluster and its workers
//! (`cycle.rs`), with a sample after every cycle of what the cycle must have given back —
//! leases, slots, cgroup leaves, credential files, provider processes, the worker's task
//! sandboxes on every runtime (leaves, containers, domains), the project's worktrees — and
//! of the memory and open files of every Squadron process on this host (`sample.rs`). It
//! ends with a report and a verdict (`verdict.rs`, `report.rs`), and a plot of its samples
//! when asked (`plot.rs`), and exits non-zero unless the soak was leak-free. Crash takeovers
//! kill a generation's processes, so the soak runs on the host of the worker that holds the
//! project's sandbox (or with `--crash-takeovers false`).

pub mod cycle;
pub mod plot;
pub mod report;
pub mod sample;
pub mod verdict;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{ArgAction, Args};
use squadron_api::agents::SandboxRepository;
use squadron_api::projects::{CreateProfile, CreateProject};
use squadron_client::{ClientError, Consistency, SquadronClient};
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{ProfileKey, ProjectId, TenantId, WorkerId};
use squadron_core::manifest::RuntimeKind;
use squadron_core::provider::Provider;

use super::{Ctx, OutputFormat};
use crate::output::write_stdout;
use cycle::{Canary, CycleReport, PROFILES};
use report::{failed_cycles, progress_line, table, SoakReport, REPORT_FORMAT};
use sample::{counts_of, dir_size, squadron_processes, Count, Sample};
use verdict::{judge, Bounds};

/// The longest soak one command runs.
pub const SOAK_DURATION_S_MAX: u64 = 7 * 24 * 3600;
/// The longest pause between cycle starts.
pub const SOAK_INTERVAL_S_MAX: u64 = 3600;
/// How long a cycle's end may take to give everything back before it is sampled as it is.
pub const SETTLE_MS_MAX: u64 = 30_000;
const SETTLE_POLL_MS: u64 = 1_000;

#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    #[arg(long, default_value = "default")]
    pub tenant: TenantId,
    /// The soak's project: made with 8 profiles at 4 slots when it does not exist.
    #[arg(long, default_value = "soak")]
    pub project: ProjectId,
    /// How long to run cycles: `90s`, `10m`, `24h` (a cycle that started runs to its end).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Duration,
    /// A cycle starts at most once per interval (the next one right away when a cycle took
    /// longer): `0s` runs them back to back. The report grows by a sample per cycle, so a
    /// day at the default is some 1,440 cycles.
    #[arg(long, value_parser = parse_interval, default_value = "60s")]
    pub interval: Duration,
    /// The worker to make the project's sandbox on, when it has none.
    #[arg(long, requires = "repository")]
    pub worker: Option<WorkerId>,
    /// The repository the sandbox and the soak's tasks clone.
    #[arg(long)]
    pub repository: String,
    #[arg(long, default_value = "main")]
    pub branch: String,
    /// Runtimes a task runs on each cycle (repeat or comma-separate); default: every runtime
    /// the sandbox's worker offers.
    #[arg(long = "task-runtime", value_delimiter = ',', value_parser = super::parse_serde::<RuntimeKind>)]
    pub task_runtimes: Vec<RuntimeKind>,
    /// How long one task may take.
    #[arg(long, default_value_t = 600)]
    pub task_timeout_s: u64,
    /// Kill one generation's processes each cycle for a crash takeover (needs this host to be
    /// the sandbox's worker).
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub crash_takeovers: bool,
    /// How long a crash takeover waits for the dead generation's lease to expire.
    #[arg(long, default_value_t = 120_000)]
    pub expiry_wait_ms: u64,
    /// How much any Squadron process's resident memory may grow from the end of the first
    /// cycle to the end.
    #[arg(long, default_value_t = 64)]
    pub rss_growth_mib_max: u64,
    /// How many open files any Squadron process may gain over the same span.
    #[arg(long, default_value_t = 16)]
    pub fd_growth_max: u64,
    /// A directory whose size each sample reports (data directories: RocksDB, task
    /// directories); repeat.
    #[arg(long = "measure-dir", value_name = "DIR")]
    pub measure_dirs: Vec<PathBuf>,
    /// Sample only the Squadron processes whose command line contains this text (a cluster's
    /// directory, say) instead of every one on this host, so other clusters on the host are
    /// neither measured nor taken for leaks.
    #[arg(long, value_name = "TEXT")]
    pub processes_matching: Option<String>,
    /// Where the JSON report goes (what `squadron evidence --soak-report` takes).
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Where an SVG plot of the samples goes: each long-lived process's resident memory and
    /// open files, and every count a cycle must give back, over the run's minutes.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (say 0s, 60s, 5m)"))?;
    if d.as_secs() > SOAK_INTERVAL_S_MAX {
        return Err(format!("{s:?}: at most {SOAK_INTERVAL_S_MAX} s"));
    }
    Ok(d)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (say 90s, 10m, 24h)"))?;
    if d.is_zero() || d.as_secs() > SOAK_DURATION_S_MAX {
        return Err(format!("{s:?}: between 1 s and {SOAK_DURATION_S_MAX} s"));
    }
    Ok(d)
}

pub async fn run(ctx: &Ctx, args: SoakArgs) -> anyhow::Result<()> {
    let client = &ctx.client;
    let mut canary = prepare(client, &args).await?;
    let bounds = Bounds {
        rss_growth_bytes_max: args.rss_growth_mib_max << 20,
        fd_growth_max: args.fd_growth_max,
    };
    let started = Instant::now();
    let started_at_ms = squadron_client::now_ms();
    let mut samples = vec![take_sample(client, &args, 0).await];
    let mut cycles: Vec<CycleReport> = Vec::new();
    while cycles.is_empty() || started.elapsed() < args.duration {
        let n = cycles.len() as u32 + 1;
        let next_start = Instant::now() + args.interval;
        let c = canary.run(client, n).await;
        let s = settle(client, &args, n, &samples).await;
        if ctx.out == OutputFormat::Table {
            eprintln!(
                "{}",
                progress_line(&c, &s, started.elapsed().as_secs(), args.duration.as_secs())
            );
        }
        cycles.push(c);
        samples.push(s);
        let pause = next_start
            .min(started + args.duration)
            .saturating_duration_since(Instant::now());
        tokio::time::sleep(pause).await;
    }
    let verdict = judge(&samples, failed_cycles(&cycles), &bounds);
    let report = SoakReport {
        format: REPORT_FORMAT.into(),
        tenant: args.tenant.to_string(),
        project: args.project.to_string(),
        started_at_ms,
        duration_ms: started.elapsed().as_millis() as u64,
        bounds,
        cycles,
        samples,
        verdict,
    };
    if let Some(path) = &args.report {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("--report {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, plot::svg(&report))
            .with_context(|| format!("--plot {}", path.display()))?;
    }
    match ctx.out {
        OutputFormat::Json => {
            write_stdout(&format!("{}\n", serde_json::to_string_pretty(&report)?))?
        }
        OutputFormat::Table => write_stdout(&table(&report))?,
    }
    if !report.verdict.leak_free {
        bail!("the soak was not leak-free (see the report)");
    }
    Ok(())
}

/// The project with its eight profiles (made when missing), and what the cycles need.
async fn prepare(client: &SquadronClient, args: &SoakArgs) -> anyhow::Result<Canary> {
    let create = CreateProject {
        tenant: args.tenant.clone(),
        project: args.project.clone(),
        max_profiles: Some(PROFILES as u32),
        max_active: Some(cycle::ACTIVE_MAX),
    };
    tolerate_existing(client.create_project(&create, None).await).context("create the project")?;
    for i in 0..PROFILES {
        let req = CreateProfile {
            key: ProfileKey::new(format!("soak-{i}"))?,
            providers: vec![Provider::Codex, Provider::Claude],
            context_ref: None,
        };
        tolerate_existing(
            client
                .create_profile(&args.tenant, &args.project, &req, None)
                .await,
        )
        .with_context(|| format!("create profile soak-{i}"))?;
    }
    let all = client
        .list_profiles(&args.tenant, &args.project, Consistency::Linearizable)
        .await?;
    let mut profiles = Vec::new();
    for i in 0..PROFILES {
        let key = format!("soak-{i}");
        let p = all
            .iter()
            .find(|p| p.key.as_str() == key)
            .with_context(|| format!("profile {key} is not in the project"))?;
        profiles.push(p.id);
    }
    let project = client
        .get_project(&args.tenant, &args.project, Consistency::Linearizable)
        .await?;
    let repository = SandboxRepository {
        url: args.repository.clone(),
        branch: Some(args.branch.clone()),
    };
    let (sandbox, sandbox_worker) = match (&project.sandbox, &args.worker) {
        (Some(s), _) => (None, s.worker.clone()),
        (None, Some(w)) => (Some((w.clone(), repository.clone())), w.clone()),
        (None, None) => bail!(
            "project {}/{} has no sandbox yet: give --worker to make it",
            args.tenant,
            args.project
        ),
    };
    let task_runtimes = if args.task_runtimes.is_empty() {
        let workers = client.list_workers(Consistency::Linearizable).await?;
        let w = workers
            .iter()
            .find(|w| w.id == sandbox_worker)
            .with_context(|| format!("worker {sandbox_worker} is not registered"))?;
        w.runtimes.iter().copied().collect()
    } else {
        args.task_runtimes.clone()
    };
    Ok(Canary {
        profiles,
        sandbox,
        task_runtimes,
        task_repository: repository,
        crash_takeovers: args.crash_takeovers,
        expiry_wait_ms: args.expiry_wait_ms,
        task_timeout: Duration::from_secs(args.task_timeout_s),
    })
}

fn tolerate_existing<T>(r: Result<T, ClientError>) -> Result<(), ClientError> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.code() == ErrorCode::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Samples until every count is back where the verdict judges it from (`verdict::reference`:
/// the baseline, or the first cycle's end), or [`SETTLE_MS_MAX`] passed. `earlier` holds the
/// samples so far, the baseline first.
async fn settle(
    client: &SquadronClient,
    args: &SoakArgs,
    cycle: u32,
    earlier: &[Sample],
) -> Sample {
    let deadline = Instant::now() + Duration::from_millis(SETTLE_MS_MAX);
    let zero = Count::default();
    let Some((base, rest)) = earlier.split_first() else {
        return take_sample(client, args, cycle).await;
    };
    // Only the counts are polled; the process table and the directories are read once, when
    // the sample is final.
    let mut s = loop {
        let s = count_sample(client, args, cycle).await;
        // A series judged from this very sample (none before holds it) has nothing to go
        // back to.
        let back = s.errors.is_empty()
            && s.counts.iter().all(|(k, v)| {
                verdict::reference(k, base, rest)
                    .is_none_or(|r| v.n <= r.counts.get(k).unwrap_or(&zero).n)
            });
        if back || Instant::now() >= deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(SETTLE_POLL_MS)).await;
    };
    add_host_figures(&mut s, args);
    s
}

async fn take_sample(client: &SquadronClient, args: &SoakArgs, cycle: u32) -> Sample {
    let mut s = count_sample(client, args, cycle).await;
    add_host_figures(&mut s, args);
    s
}

/// The counts of the project's evidence.
async fn count_sample(client: &SquadronClient, args: &SoakArgs, cycle: u32) -> Sample {
    let mut s = Sample {
        at_ms: squadron_client::now_ms(),
        cycle,
        ..Sample::default()
    };
    match client.project_evidence(&args.tenant, &args.project).await {
        Ok(e) => {
            counts_of(&e, &mut s.counts);
            if let Some(w) = &e.worker {
                let failed = w.task_sandbox_errors.iter();
                s.errors
                    .extend(failed.map(|e| format!("the worker's task sandboxes: {e}")));
            }
            // Before the first launch there is no sandbox, so no worker to ask.
            if let (None, Some(why)) = (&e.worker, &e.worker_error) {
                s.errors.push(format!("the sandbox's worker: {why}"));
            }
        }
        Err(e) => s.errors.push(format!("project evidence: {e}")),
    }
    s
}

/// This host's Squadron processes and the measured directories.
fn add_host_figures(s: &mut Sample, args: &SoakArgs) {
    s.processes = squadron_processes(args.processes_matching.as_deref());
    s.dirs = args
        .measure_dirs
        .iter()
        .map(PathBuf::as_path)
        .map(dir_size)
        .collect();
}
