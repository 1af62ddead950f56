//! One run: start the cluster, set up the workload, run clients against a nemesis for the time
//! limit, heal, measure recovery, read everything once more in a quiet phase, compare replicas,
//! and judge the history.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::json;
use squadron_client::{new_idempotency_key, Consistency, SquadronClient};
use squadron_core::ids::WorkerId;
use tokio::time::Instant;

use crate::anomaly::{Anomaly, AnomalyKind};
use crate::checker::Checker;
use crate::client_capsule::CapsuleClient;
use crate::client_cas::CasClient;
use crate::client_expiry::ExpiryClient;
use crate::client_lease::LeaseClient;
use crate::client_takeover::TakeoverClient;
use crate::client_task::TaskClient;
use crate::cluster::{faketime_lib, Cluster, ClusterError, NetMode};
use crate::digest_sampler::DigestSampler;
use crate::driver::Driver;
use crate::fault::Fault;
use crate::history::HistoryError;
use crate::invariants::digest_divergence;
use crate::late_writer::LateWriters;
use crate::nemesis::{Nemesis, NemesisError, NemesisKind, CLOCK_SKEW_S_LIMIT, CLOCK_SKEW_S_MIN};
use crate::recorder::Recorder;
use crate::recovery::RecoveryCheck;
use crate::report::HtmlReport;
use crate::results::Results;
use crate::workload::{final_input, setup, spawn_renewals, SetupError, Workload, WORKER};
use crate::workload_context::WorkloadContext;

/// How long one client request may take before its outcome is unknown. Longer than the
/// nodes' own forward and read-index timeout (4 s), so a slow cluster answers for itself.
pub const CLIENT_REQUEST_TIMEOUT_MS: u64 = 6_000;
/// The takeover workload's requests: a launch clones and starts a provider, a crash takeover
/// waits for the old lease's expiry.
pub const TAKEOVER_REQUEST_TIMEOUT_MS: u64 = 30_000;
/// How long connecting to one node may take before the next is tried.
pub const CLIENT_CONNECT_TIMEOUT_MS: u64 = 1_000;
/// Tries of one heal before the run goes on with what is left broken (recorded).
const HEAL_ATTEMPTS_MAX: u32 = 5;
/// Pause between those tries.
const HEAL_RETRY_MS: u64 = 1_000;
/// Process ids of the quiet phase's final reads start here (clients use small ids).
pub const FINAL_PROCESS_BASE: u64 = 1_000_000;
/// Attempts of one final read.
pub const FINAL_READ_ATTEMPTS_MAX: u32 = 60;
/// How long the quiet phase waits for every node to apply the same index.
pub const CONVERGENCE_TIMEOUT_MS: u64 = 60_000;
/// Most clients one run may have.
pub const CONCURRENCY_MAX: usize = 256;

/// Everything a run is configured with.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub nodes: u64,
    pub workload: Workload,
    pub nemesis: NemesisKind,
    pub time_limit: Duration,
    /// Operations per second, all clients together.
    pub rate: f64,
    pub seed: u64,
    pub out: PathBuf,
    pub bin: PathBuf,
    pub net: NetMode,
    pub concurrency: Option<usize>,
    /// Mean length of a fault, and of the quiet gap between faults.
    pub fault: Duration,
    pub quiet: Duration,
    /// After the last heal, a write must succeed within this bound.
    pub recovery_bound: Duration,
    /// After every heal, a read must succeed within this bound; no quiet gap is shorter, so
    /// every heal is judged.
    pub read_recovery: Duration,
    /// The clients' read consistency. `Stale` is a deliberate client bug: the checker must
    /// then find stale reads.
    pub reads: Consistency,
    /// The largest wall-clock offset the clock nemesis applies, in seconds.
    pub clock_skew_secs_max: i64,
    /// Faults by name (`packet-loss`, …), injected in this order instead of drawn from the
    /// nemesis's set; empty: drawn.
    pub faults: Vec<String>,
    /// Puts every node's data directory on the lazy filesystem (crash faults drop what was
    /// not fsynced); on by itself for `--nemesis crash` and listed crash faults.
    pub lazyfs: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("node binary {0} does not exist; build it (`cargo build -p squadron`) or pass --bin")]
    NoBinary(PathBuf),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid setting {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error(transparent)]
    Nemesis(#[from] NemesisError),
    #[error(transparent)]
    History(#[from] HistoryError),
}

fn write(path: PathBuf, bytes: &[u8]) -> Result<(), RunError> {
    std::fs::write(&path, bytes).map_err(|source| RunError::Write { path, source })
}

impl RunConfig {
    fn validate(&self) -> Result<(), RunError> {
        if !matches!(self.nodes, 1..=9) {
            return Err(RunError::Invalid {
                field: "nodes",
                reason: format!("must be 1..=9, got {}", self.nodes),
            });
        }
        if !(self.rate > 0.0 && self.rate <= 10_000.0) {
            return Err(RunError::Invalid {
                field: "rate",
                reason: format!("must be in (0, 10000] ops/s, got {}", self.rate),
            });
        }
        if let Some(c) = self
            .concurrency
            .filter(|c| !(1..=CONCURRENCY_MAX).contains(c))
        {
            return Err(RunError::Invalid {
                field: "concurrency",
                reason: format!("must be 1..={CONCURRENCY_MAX}, got {c}"),
            });
        }
        if !(CLOCK_SKEW_S_MIN..=CLOCK_SKEW_S_LIMIT).contains(&self.clock_skew_secs_max) {
            return Err(RunError::Invalid {
                field: "clock_skew_secs_max",
                reason: format!(
                    "must be {CLOCK_SKEW_S_MIN}..={CLOCK_SKEW_S_LIMIT} s, got {}",
                    self.clock_skew_secs_max
                ),
            });
        }
        if let Some(bad) = self.faults.iter().find(|f| Fault::by_name(f).is_none()) {
            let known: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
            return Err(RunError::Invalid {
                field: "faults",
                reason: format!("unknown fault {bad:?}; one of {}", known.join(", ")),
            });
        }
        let pauses_worker = self.faults.iter().any(|f| f == Fault::WorkerPause.name());
        if pauses_worker && self.workload != Workload::Takeover {
            return Err(RunError::Invalid {
                field: "faults",
                reason: format!(
                    "{} needs the takeover workload's worker (--workload takeover)",
                    Fault::WorkerPause.name()
                ),
            });
        }
        if !self.bin.is_file() {
            return Err(RunError::NoBinary(self.bin.clone()));
        }
        Ok(())
    }
}

/// Runs the whole test and writes `history.jsonl`, `nodes.json`, `results.json` and
/// `report.html` into the output directory.
pub async fn run(cfg: &RunConfig) -> Result<Results, RunError> {
    cfg.validate()?;
    std::fs::create_dir_all(&cfg.out).map_err(|source| RunError::Write {
        path: cfg.out.clone(),
        source,
    })?;
    let faults: Vec<Fault> = cfg
        .faults
        .iter()
        .filter_map(|f| Fault::by_name(f))
        .collect();
    let faketime = match cfg.nemesis {
        NemesisKind::Clock | NemesisKind::Mix => faketime_lib(),
        _ if faults.iter().any(|f| f.is_clock()) => faketime_lib(),
        _ => None,
    };
    let mut cluster = Cluster::prepare(
        &cfg.out.join("nodes"),
        &cfg.bin,
        cfg.nodes,
        cfg.net,
        faketime.as_deref(),
    )?;
    if let Some(note) = &cluster.net_note {
        eprintln!("squadron-jepsen: {note}");
    }
    if cfg.lazyfs || cfg.nemesis == NemesisKind::Crash || faults.iter().any(|f| f.is_crash()) {
        cluster.mount_lazyfs()?;
    }
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let nemesis = Nemesis::new(
        cfg.nemesis,
        &cluster,
        StdRng::seed_from_u64(cfg.seed ^ 0x5eed),
        cfg.clock_skew_secs_max,
    )?;
    let mut nemesis = if faults.is_empty() {
        nemesis
    } else {
        nemesis.in_order(faults, &cluster)?
    };
    cluster.start_all().await?;
    let endpoints = cluster.endpoints();
    let admin = cluster.client(
        endpoints.clone(),
        Duration::from_millis(CLIENT_REQUEST_TIMEOUT_MS),
        Duration::from_millis(CLIENT_CONNECT_TIMEOUT_MS),
    )?;
    let as_worker = cluster.worker_client(
        endpoints.clone(),
        Duration::from_millis(CLIENT_REQUEST_TIMEOUT_MS),
        Duration::from_millis(CLIENT_CONNECT_TIMEOUT_MS),
    )?;
    let repository = if cfg.workload == Workload::Takeover {
        cluster.start_worker().await?;
        cluster.worker.as_ref().map(|w| w.repository.clone())
    } else {
        None
    };
    let mut ctx = setup(cfg.workload, &admin, &as_worker, repository.as_deref()).await?;
    ctx.reads = cfg.reads;
    let ctx = Arc::new(ctx);
    let renewals = spawn_renewals(ctx.clone(), admin.clone());

    let recorder = Recorder::new();
    let concurrency = cfg
        .concurrency
        .unwrap_or_else(|| cfg.workload.default_concurrency(cfg.nodes));
    let mean_gap = Duration::from_secs_f64(concurrency as f64 / cfg.rate);
    let deadline = Instant::now() + cfg.time_limit;
    let mut clients = Vec::new();
    for i in 0..concurrency {
        // Each client starts at a different node, so every node serves (and forwards).
        let mut eps = endpoints.clone();
        let n = eps.len().max(1);
        eps.rotate_left(i % n);
        let client = if cfg.workload == Workload::Takeover {
            // Launches clone and start a provider; a crash takeover waits for the expiry.
            cluster.client(
                eps,
                Duration::from_millis(TAKEOVER_REQUEST_TIMEOUT_MS),
                Duration::from_millis(CLIENT_CONNECT_TIMEOUT_MS),
            )?
        } else {
            admin.with_endpoints(eps)
        };
        let driver = Driver::new(
            i as u64,
            concurrency as u64,
            recorder.clone(),
            mean_gap,
            deadline,
            StdRng::seed_from_u64(rand::Rng::gen(&mut rng)),
        );
        clients.push(spawn_client(
            cfg.workload,
            ctx.clone(),
            client,
            driver,
            concurrency,
        ));
    }

    let sampler = DigestSampler::start(
        admin.clone(),
        cluster.ids().into_iter().zip(cluster.endpoints()).collect(),
    );

    // The nemesis: quiet, fault, heal, until the time limit.
    let mut last_heal_ms = recorder.now_ms();
    let mut last_fault: Option<String> = None;
    while !nemesis.is_idle() {
        // Never shorter than the read bound of the heal before it, so every heal is judged.
        let read_bound = crate::recovery::read_bound_after(
            last_fault.as_deref().unwrap_or(""),
            cfg.read_recovery,
        );
        let quiet =
            Duration::from_millis(nemesis.jitter_ms(cfg.quiet.as_millis() as u64)).max(read_bound);
        if Instant::now() + quiet >= deadline {
            break;
        }
        tokio::time::sleep(quiet).await;
        let mut late = None;
        match nemesis.start(&mut cluster).await {
            Ok((fault, detail)) => {
                last_fault = Some(fault.to_string());
                recorder.nemesis("start", fault, detail);
                if let (true, Some(w)) = (fault == Fault::WorkerPause.name(), &cluster.worker) {
                    late = Some(LateWriters::capture(&admin, &ctx, &w.data_dir).await);
                }
            }
            Err(e) => {
                eprintln!("squadron-jepsen: nemesis: {e}");
                recorder.nemesis("error", "start", json!(e.to_string()));
            }
        }
        let fault = Duration::from_millis(nemesis.jitter_ms(cfg.fault.as_millis() as u64));
        let until = (Instant::now() + fault).min(deadline);
        tokio::time::sleep_until(until).await;
        heal_with_late_writers(&mut nemesis, &mut cluster, &recorder, late, &admin).await;
        last_heal_ms = recorder.now_ms();
    }
    tokio::time::sleep_until(deadline).await;
    if nemesis.has_damage() {
        heal(&mut nemesis, &mut cluster, &recorder).await;
        last_heal_ms = recorder.now_ms();
    }

    // Recovery: after the last heal a write must succeed within the bound. The probe starts
    // at once; clients still finishing their last operations do not delay it.
    let mut harness_anomalies = Vec::new();
    let recovered = recover(&ctx.as_worker, cfg.recovery_bound).await;
    let recovery_from_heal_ms = recovered
        .as_ref()
        .ok()
        .map(|_| recorder.now_ms() - last_heal_ms);
    if let Err(last) = &recovered {
        harness_anomalies.push(Anomaly::new(
            AnomalyKind::UnavailableAfterHeal,
            None,
            format!(
                "no write succeeded within {} ms of the last heal (the last probe: {last})",
                cfg.recovery_bound.as_millis()
            ),
            Vec::new(),
        ));
    }
    for c in clients {
        let _ = c.await;
    }
    let samples = sampler.finish();
    harness_anomalies.extend(digest_divergence(&samples, "mid-run"));
    let sampled_indexes = samples
        .iter()
        .filter_map(|s| s.applied)
        .collect::<std::collections::BTreeSet<u64>>()
        .len();

    // The quiet phase: a final read of every key, then the replicas' digests.
    final_reads(cfg.workload, &ctx, &admin, &recorder).await;
    renewals.abort();
    let mut takeover_evidence = None;
    if cfg.workload == Workload::Takeover {
        let (evidence, found) = crate::takeover_evidence::check(&admin, &ctx).await;
        harness_anomalies.extend(found);
        takeover_evidence = Some(evidence);
    }
    let nodes = cluster
        .final_views(Duration::from_millis(CONVERGENCE_TIMEOUT_MS))
        .await;
    let history = recorder.history();
    history.save(&cfg.out.join("history.jsonl"))?;
    write(
        cfg.out.join("nodes.json"),
        serde_json::to_string_pretty(&nodes)
            .unwrap_or_default()
            .as_bytes(),
    )?;
    let (heals, late) = RecoveryCheck {
        bound_ms: cfg.recovery_bound.as_secs_f64() * 1000.0,
        read_bound_ms: cfg.read_recovery.as_secs_f64() * 1000.0,
    }
    .check(
        &history.operations().unwrap_or_default(),
        &history.nemesis_intervals(),
    );
    harness_anomalies.extend(late);
    let mut results = Checker::default().check(&history, Some(&nodes), harness_anomalies);
    let facts = [
        ("nodes", json!(cfg.nodes)),
        ("workload", json!(cfg.workload.name())),
        (
            "nemesis",
            json!(format!("{:?}", cfg.nemesis).to_lowercase()),
        ),
        ("time_limit_s", json!(cfg.time_limit.as_secs_f64())),
        ("rate", json!(cfg.rate)),
        ("concurrency", json!(concurrency)),
        ("seed", json!(cfg.seed)),
        ("reads", json!(format!("{:?}", cfg.reads).to_lowercase())),
        (
            "network",
            json!(if cluster.net.is_some() {
                "netns"
            } else {
                "loopback"
            }),
        ),
        ("network_note", json!(cluster.net_note)),
        ("faults", json!(history.nemesis_intervals().len())),
        (
            "recovery_bound_ms",
            json!(cfg.recovery_bound.as_millis() as u64),
        ),
        (
            "first_write_after_last_heal_ms",
            json!(recovery_from_heal_ms),
        ),
        ("heals", json!(heals)),
        ("lazyfs", json!(cluster.lazyfs_stats())),
        ("digest_samples", json!(samples.len())),
        ("digest_sampled_indexes", json!(sampled_indexes)),
        ("takeover_evidence", json!(takeover_evidence)),
    ];
    for (k, v) in facts {
        results.run.insert(k.to_string(), v);
    }
    write(
        cfg.out.join("results.json"),
        serde_json::to_string_pretty(&results)
            .unwrap_or_default()
            .as_bytes(),
    )?;
    let html = HtmlReport::render(&history, &results);
    write(cfg.out.join("report.html"), html.as_bytes())?;
    cluster.stop_all();
    Ok(results)
}

fn spawn_client(
    workload: Workload,
    ctx: Arc<WorkloadContext>,
    client: SquadronClient,
    driver: Driver,
    concurrency: usize,
) -> tokio::task::JoinHandle<()> {
    match workload {
        Workload::Takeover => {
            // The last client reads (when there are two or more); driver i owns profiles
            // i, i + drivers, …: no two clients drive one agent.
            let drivers = concurrency.saturating_sub(1).max(1);
            let me = driver.process as usize;
            let owned = ctx
                .profiles
                .iter()
                .enumerate()
                .filter(|(n, _)| me < drivers && n % drivers == me)
                .map(|(_, p)| *p)
                .collect();
            let all = ctx.profiles.clone();
            tokio::spawn(TakeoverClient::new(client, driver, owned, all).run())
        }
        Workload::Lease | Workload::Capacity => {
            tokio::spawn(LeaseClient::new(ctx, client, driver).run())
        }
        Workload::Cas | Workload::Keyed => tokio::spawn(CasClient::new(ctx, client, driver).run()),
        Workload::Capsule => tokio::spawn(CapsuleClient::new(ctx, client, driver).run()),
        Workload::Tasks => tokio::spawn(TaskClient::new(ctx, client, driver).run()),
        Workload::Expiry => tokio::spawn(ExpiryClient::new(ctx, client, driver).run()),
    }
}

/// Heals, trying again (a heal keeps what it could not undo) until nothing is left to undo
/// or [`HEAL_ATTEMPTS_MAX`] tries failed; the history gets one `heal` stop with what was done
/// and every error on the way.
async fn heal(nemesis: &mut Nemesis, cluster: &mut Cluster, recorder: &Recorder) {
    let mut errors = Vec::new();
    for attempt in 1..=HEAL_ATTEMPTS_MAX {
        match nemesis.heal(cluster).await {
            Ok(mut detail) => {
                if !errors.is_empty() {
                    detail["errors"] = json!(errors);
                }
                recorder.nemesis("stop", "heal", detail);
                return;
            }
            Err(e) => {
                eprintln!("squadron-jepsen: heal (attempt {attempt}): {e}");
                errors.push(e.to_string());
            }
        }
        if !nemesis.has_damage() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(HEAL_RETRY_MS)).await;
    }
    recorder.nemesis("stop", "heal", json!({ "errors": errors }));
}

/// A heal; after a `worker-pause`, first the wait (the worker still stopped) until the leader
/// has fenced every lease the paused worker held, and after the heal those generations' late
/// commits.
async fn heal_with_late_writers(
    nemesis: &mut Nemesis,
    cluster: &mut Cluster,
    recorder: &Recorder,
    late: Option<LateWriters>,
    admin: &SquadronClient,
) {
    let Some(mut late) = late else {
        return heal(nemesis, cluster, recorder).await;
    };
    let unfenced = late.keep_fenced(admin).await;
    let git = late.send_git_commits(recorder).await;
    heal(nemesis, cluster, recorder).await;
    let mut detail = late.commit(admin, recorder, git).await;
    detail["not_fenced_in_time"] = json!(unfenced.iter().map(|l| l.get()).collect::<Vec<_>>());
    recorder.nemesis("info", "late-commits", detail);
}

/// Writes (a worker heartbeat, keyed, so retrying it is safe) until one succeeds. Returns the
/// milliseconds it took, or `None` past the bound.
/// The time from the heal to the first successful probe write, or the last probe's error.
async fn recover(as_worker: &SquadronClient, bound: Duration) -> Result<u64, String> {
    let started = Instant::now();
    // No waiting for every node to agree on a leader first: a write is the test, and a node
    // that is slow to agree must not eat the bound.
    let worker = WorkerId::new(WORKER).map_err(|e| e.to_string())?;
    let mut last = String::from("no probe was sent");
    while started.elapsed() < bound {
        let key = new_idempotency_key();
        match as_worker.worker_heartbeat(&worker, Some(&key)).await {
            Ok(_) => return Ok(started.elapsed().as_millis() as u64),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(last)
}

async fn final_reads(
    workload: Workload,
    ctx: &Arc<WorkloadContext>,
    admin: &SquadronClient,
    recorder: &Recorder,
) {
    let far = Instant::now() + Duration::from_secs(3600);
    if workload == Workload::Tasks {
        return final_task_reads(ctx, admin, recorder, far).await;
    }
    for (i, profile) in ctx.profiles.iter().enumerate() {
        let driver = Driver::new(
            FINAL_PROCESS_BASE + i as u64,
            ctx.profiles.len() as u64,
            recorder.clone(),
            Duration::ZERO,
            far,
            StdRng::seed_from_u64(i as u64),
        );
        let mut attempts = 0;
        match workload {
            Workload::Lease | Workload::Capacity => {
                let mut c = LeaseClient::new(ctx.clone(), admin.clone(), driver);
                c.reads = Consistency::Linearizable;
                while attempts < FINAL_READ_ATTEMPTS_MAX
                    && c.read(*profile, final_input()).await.is_none()
                {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            Workload::Cas | Workload::Keyed => {
                let mut c = CasClient::new(ctx.clone(), admin.clone(), driver);
                c.reads = Consistency::Linearizable;
                while attempts < FINAL_READ_ATTEMPTS_MAX
                    && c.read(*profile, final_input()).await != crate::event::EventType::Ok
                {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            Workload::Expiry => {
                let mut c = ExpiryClient::new(ctx.clone(), admin.clone(), driver);
                c.reads = Consistency::Linearizable;
                while attempts < FINAL_READ_ATTEMPTS_MAX && !c.final_read(*profile).await {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            // Its final reads are of tasks, above; it has no profiles.
            Workload::Tasks => {}
            Workload::Takeover => {
                let mut c = TakeoverClient::new(admin.clone(), driver, Vec::new(), Vec::new());
                while attempts < FINAL_READ_ATTEMPTS_MAX
                    && c.read(*profile, final_input()).await.is_none()
                {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            Workload::Capsule => {
                let mut c = CapsuleClient::new(ctx.clone(), admin.clone(), driver);
                c.reads = Consistency::Linearizable;
                while attempts < FINAL_READ_ATTEMPTS_MAX
                    && c.read(*profile, final_input()).await.is_none()
                {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                while attempts < FINAL_READ_ATTEMPTS_MAX
                    && c.chain(*profile).await != crate::event::EventType::Ok
                {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
}

/// The `tasks` workload's final reads: every task submitted, linearizably.
async fn final_task_reads(
    ctx: &Arc<WorkloadContext>,
    admin: &SquadronClient,
    recorder: &Recorder,
    far: Instant,
) {
    let tasks = ctx.all_tasks();
    for (i, task) in tasks.iter().enumerate() {
        let driver = Driver::new(
            FINAL_PROCESS_BASE + i as u64,
            tasks.len() as u64,
            recorder.clone(),
            Duration::ZERO,
            far,
            StdRng::seed_from_u64(i as u64),
        );
        let mut c = TaskClient::new(ctx.clone(), admin.clone(), driver);
        c.reads = Consistency::Linearizable;
        let mut attempts = 0;
        while attempts < FINAL_READ_ATTEMPTS_MAX && c.read(*task, final_input()).await.is_none() {
            attempts += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
