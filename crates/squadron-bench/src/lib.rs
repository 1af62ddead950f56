//! `squadron bench compare`: a Squadron cluster and an etcd cluster, started side by side on
//! loopback with durable writes, driven one after the other by the same closed-loop load
//! generator through the same workloads, reported as figures per system and as ratios
//! (Squadron / etcd), which move much less than absolute numbers on a shared machine.
//!
//! [`compare`] runs it; [`render_table`] prints a report. Each system: start the cluster,
//! create the data, run every workload at every client count (warm-up, then a measured
//! window), read each node's RSS, kill -9 the leader under a lease-cycle load and time the
//! first successful write, stop the cluster. Every process is killed and every directory
//! removed when the run ends, also on error.
//!
//! [`failover`] kills the leader again and again on one cluster; [`scale`] loads one to
//! DESIGN §7's size (100,000 profiles, a million tasks) and reports what that costs it.

mod error;
mod etcd_client;
mod etcd_cluster;
mod etcd_grpc;
mod etcd_load;
mod failover;
mod histogram;
mod load;
mod machine;
mod options;
mod process;
mod report;
mod scale;
mod scale_load;
mod scale_options;
mod scale_report;
mod squadron_cluster;
mod squadron_load;
mod table;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ConstantBuilder, Retryable};

pub use error::BenchError;
pub use failover::{failover, render_failover, FailoverOptions, FailoverReport, TRIALS_MAX};
pub use histogram::{LatencyHistogram, LatencySummary};
pub use load::PointStats;
pub use machine::MachineInfo;
pub use options::{
    ClientRoute, CompareOptions, EtcdProtocol, System, Workload, CLIENTS_MAX, ETCD_BIN_DEFAULT,
    FAILOVER_CLIENTS_DEFAULT, NODES_MAX,
};
pub use process::{free_port, rss_kib, NodeMemory};
pub use report::{
    ComparePoint, CompareReport, FailoverComparison, FailoverResult, MemoryComparison, Ratios,
    SquadronInternals,
};
pub use scale::{scale, scale_with};
pub use scale_load::LoadPhase;
pub use scale_options::{
    ScaleOptions, SCALE_CLIENTS_DEFAULT, SCALE_CLIENTS_MAX, SCALE_PENDING_TASKS_DEFAULT,
    SCALE_PROFILES_PER_PROJECT_DEFAULT, SCALE_PROJECTS_DEFAULT, SCALE_PROJECTS_MAX,
    SCALE_TASKS_DEFAULT, SCALE_TASKS_MAX,
};
pub use scale_report::{render_scale, BucketSummary, CatchUp, NodeFigures, ScaleReport};
pub use table::render_table;

use etcd_cluster::EtcdCluster;
use load::{run_clients, FailoverProbe, LoadControl};
use report::{mean_rss_kib, ratio};
use squadron_cluster::SquadronCluster;

/// Load before the leader is killed.
const FAILOVER_PRE_KILL_MS: u64 = 2_000;
/// Longest wait for a write after the kill.
const FAILOVER_WAIT_MS_MAX: u64 = 30_000;
/// Between two looks at the failover probe (the figure itself comes from the probe's clock).
const FAILOVER_POLL_MS: u64 = 10;
/// Longest wait for the agreed leader before the kill.
const LEADER_WAIT_MS: u64 = 10_000;

/// What one system measured.
#[derive(Debug, Default)]
struct SystemRun {
    points: Vec<(Workload, usize, PointStats)>,
    memory: Vec<NodeMemory>,
    internals: Option<SquadronInternals>,
    failover: Option<FailoverResult>,
}

/// What a comparison is doing, said to a watcher (the CLI's progress line) as it goes.
pub type Steps<'a> = &'a (dyn Fn(&str) + Sync);

/// Runs the comparison the options describe.
pub async fn compare(opts: &CompareOptions) -> Result<CompareReport, BenchError> {
    compare_with(opts, &|_| {}).await
}

/// [`compare`], saying each step (a cluster starting, a point measured) to `steps`.
pub async fn compare_with(
    opts: &CompareOptions,
    steps: Steps<'_>,
) -> Result<CompareReport, BenchError> {
    opts.validate()?;
    let wants = |s: System| opts.systems.contains(&s);
    check_binaries(opts)?;
    let dir = run_dir(opts.work_dir.as_deref(), "squadron-bench-")?;

    let squadron = if wants(System::Squadron) {
        Some(run_squadron(opts, dir.path(), steps).await?)
    } else {
        None
    };
    let etcd = if wants(System::Etcd) {
        Some(run_etcd(opts, dir.path(), steps).await?)
    } else {
        None
    };

    let points = compare_points(opts, &squadron, &etcd);
    let failover = compare_failover(&squadron, &etcd);
    let memory = compare_memory(&squadron, &etcd);
    let squadron_internals = squadron.as_ref().and_then(|r| r.internals.clone());
    let machine = MachineInfo::probe(dir.path());
    let work_dir = if opts.keep_work_dir {
        Some(dir.keep().display().to_string())
    } else {
        None
    };
    Ok(CompareReport {
        machine,
        squadron_version: if wants(System::Squadron) {
            version_line(&opts.squadron_bin)
        } else {
            String::new()
        },
        etcd_version: if wants(System::Etcd) {
            etcd_cluster::etcd_version(&opts.etcd_bin)
        } else {
            String::new()
        },
        etcd_protocol: opts.etcd_protocol,
        route: opts.route,
        nodes: opts.nodes,
        clients: opts.clients.clone(),
        duration_s: opts.duration.as_secs_f64(),
        warmup_s: opts.warmup.as_secs_f64(),
        seed: opts.seed,
        points,
        failover,
        memory,
        squadron_internals,
        work_dir,
    })
}

/// The run's temporary directory, `prefix…` under `work_dir` (the system's by default),
/// removed when dropped.
pub(crate) fn run_dir(
    work_dir: Option<&Path>,
    prefix: &str,
) -> Result<tempfile::TempDir, BenchError> {
    let parent = work_dir.map_or_else(std::env::temp_dir, Path::to_path_buf);
    std::fs::create_dir_all(&parent).map_err(|e| BenchError::io("create", &parent, e))?;
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&parent)
        .map_err(|e| BenchError::io("create a directory in", &parent, e))
}

/// Refuses a run whose binaries are missing, saying how to get them.
fn check_binaries(opts: &CompareOptions) -> Result<(), BenchError> {
    let wants = |s: System| opts.systems.contains(&s);
    if wants(System::Squadron) && !opts.squadron_bin.is_file() {
        return Err(BenchError::MissingBinary {
            what: "the squadron binary",
            path: opts.squadron_bin.clone(),
            hint: "build it (cargo build -p squadron) or pass its path",
        });
    }
    if wants(System::Etcd) && !opts.etcd_bin.is_file() {
        return Err(BenchError::MissingBinary {
            what: "etcd",
            path: opts.etcd_bin.clone(),
            hint: "install Debian's etcd-server package (apt-get install etcd-server) or pass its path",
        });
    }
    Ok(())
}

/// Both systems' figures at every workload and client count, with their ratios.
fn compare_points(
    opts: &CompareOptions,
    squadron: &Option<SystemRun>,
    etcd: &Option<SystemRun>,
) -> Vec<ComparePoint> {
    let mut points = Vec::new();
    for &workload in &opts.workloads {
        for &clients in &opts.clients {
            let find = |run: &Option<SystemRun>| {
                run.as_ref().and_then(|r| {
                    r.points
                        .iter()
                        .find(|(w, c, _)| *w == workload && *c == clients)
                        .map(|(_, _, s)| s.clone())
                })
            };
            let (s, e) = (find(squadron), find(etcd));
            let ratio = match (&s, &e) {
                (Some(s), Some(e)) => Some(Ratios::of(s, e)),
                _ => None,
            };
            points.push(ComparePoint {
                workload,
                clients,
                squadron: s,
                etcd: e,
                ratio,
            });
        }
    }
    points
}

fn compare_failover(squadron: &Option<SystemRun>, etcd: &Option<SystemRun>) -> FailoverComparison {
    let failover_of = |run: &Option<SystemRun>| run.as_ref().and_then(|r| r.failover.clone());
    let (s, e) = (failover_of(squadron), failover_of(etcd));
    let r = match (&s, &e) {
        (Some(s), Some(e)) => match (s.recovery_ms, e.recovery_ms) {
            (Some(a), Some(b)) => ratio(a, b),
            _ => None,
        },
        _ => None,
    };
    FailoverComparison {
        squadron: s,
        etcd: e,
        ratio: r,
    }
}

fn compare_memory(squadron: &Option<SystemRun>, etcd: &Option<SystemRun>) -> MemoryComparison {
    let memory_of =
        |run: &Option<SystemRun>| run.as_ref().map(|r| r.memory.clone()).unwrap_or_default();
    let (sm, em) = (memory_of(squadron), memory_of(etcd));
    MemoryComparison {
        ratio: if sm.is_empty() || em.is_empty() {
            None
        } else {
            ratio(mean_rss_kib(&sm), mean_rss_kib(&em))
        },
        squadron: sm,
        etcd: em,
    }
}

/// Every node's batching counters, summed; `None` if a node did not answer.
async fn squadron_internals(endpoints: &squadron_load::Endpoints) -> Option<SquadronInternals> {
    let http = metrics_http(&endpoints.credentials)?;
    let mut sum = SquadronInternals::default();
    for e in &endpoints.urls {
        sum.add_metrics(&metrics_text(&http, e, &endpoints.credentials).await?);
    }
    Some(sum)
}

/// How long a node may take to answer `/metrics` (it tallies every task it holds).
const METRICS_TIMEOUT_MS: u64 = 60_000;

/// An HTTP client that trusts the cluster's CA, for `/metrics`.
fn metrics_http(credentials: &squadron_client::Credentials) -> Option<reqwest::Client> {
    let mut http = reqwest::Client::builder().timeout(Duration::from_millis(METRICS_TIMEOUT_MS));
    if let Some(tls) = credentials.tls_config().ok()? {
        http = http.use_preconfigured_tls(tls);
    }
    http.build().ok()
}

/// A node's `/metrics` exposition; `None` if it did not answer with one.
async fn metrics_text(
    http: &reqwest::Client,
    url: &str,
    credentials: &squadron_client::Credentials,
) -> Option<String> {
    let mut request = http.get(format!("{}/metrics", url.trim_end_matches('/')));
    // /metrics is a viewer's read: without the token every counter read as 0.
    if let Some(token) = credentials.token() {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.ok()?.error_for_status().ok()?;
    response.text().await.ok()
}

fn version_line(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

async fn run_squadron(
    opts: &CompareOptions,
    dir: &Path,
    steps: Steps<'_>,
) -> Result<SystemRun, BenchError> {
    steps(&format!("squadron: starting {} nodes", opts.nodes));
    let mut cluster = SquadronCluster::start(&opts.squadron_bin, dir, opts.nodes).await?;
    let endpoints = cluster.endpoints().routed(opts.route);
    let setup_client = squadron_load::client_for(&endpoints, 0);
    let as_worker = squadron_load::worker_client(&endpoints)?;
    let data = squadron_load::setup(&setup_client, &as_worker, opts.clients_max()).await?;
    let mut run = SystemRun::default();
    let seed = opts.seed;
    for &workload in &opts.workloads {
        for &clients in &opts.clients {
            steps(&format!("squadron: {workload} × {clients} clients"));
            let control = LoadControl::new(opts.warmup, opts.duration);
            let stats = match workload {
                Workload::LeaseCycle => {
                    run_clients(control, clients, |i, rec| {
                        squadron_load::lease_cycle(&data, &endpoints, i, rec, None)
                    })
                    .await
                }
                Workload::Capacity => {
                    run_clients(control, clients, |i, rec| {
                        squadron_load::capacity(&data, &endpoints, i, seed, rec)
                    })
                    .await
                }
                Workload::Read => {
                    run_clients(control, clients, |i, rec| {
                        squadron_load::read(&data, &endpoints, i, seed, rec)
                    })
                    .await
                }
                Workload::Submit => {
                    let stats = run_clients(control, clients, |i, rec| {
                        squadron_load::submit(&endpoints, i, rec)
                    })
                    .await;
                    squadron_load::drain_submitted(&endpoints).await?;
                    stats
                }
            };
            run.points.push((workload, clients, stats));
        }
    }
    run.memory = cluster.memory();
    run.internals = squadron_internals(&endpoints).await;
    if opts.failover {
        steps("squadron: failover (kill -9 of the leader)");
        run.failover =
            Some(squadron_failover(opts.failover_clients, &mut cluster, &data, &endpoints).await?);
    }
    Ok(run)
}

/// Kill -9 of the leader under a lease-cycle load: the time to the first successful write.
async fn squadron_failover(
    clients: usize,
    cluster: &mut SquadronCluster,
    data: &squadron_load::SquadronData,
    endpoints: &squadron_load::Endpoints,
) -> Result<FailoverResult, BenchError> {
    let leader = cluster
        .wait_for_leader(Duration::from_millis(LEADER_WAIT_MS))
        .await?;
    let probe = Arc::new(FailoverProbe::default());
    let control = LoadControl::new(
        Duration::ZERO,
        Duration::from_millis(FAILOVER_PRE_KILL_MS + FAILOVER_WAIT_MS_MAX),
    );
    let load = run_clients(control.clone(), clients, |i, rec| {
        squadron_load::lease_cycle(data, endpoints, i, rec, Some(probe.clone()))
    });
    let kill = async {
        tokio::time::sleep(Duration::from_millis(FAILOVER_PRE_KILL_MS)).await;
        cluster.kill(leader);
        let killed_at = Instant::now();
        probe.killed(killed_at);
        let elected = cluster
            .wait_for_leader(Duration::from_millis(FAILOVER_WAIT_MS_MAX))
            .await
            .ok()
            .map(|_| killed_at.elapsed());
        wait_for_recovery(&probe).await;
        control.stop();
        elected
    };
    let (stats, elected) = tokio::join!(load, kill);
    Ok(FailoverResult {
        clients,
        killed: format!("squadron node {leader}"),
        recovery_ms: probe.recovery().map(|d| d.as_secs_f64() * 1_000.0),
        leader_elected_ms: elected.map(|d| d.as_secs_f64() * 1_000.0),
        wait_ms_max: FAILOVER_WAIT_MS_MAX,
        load: stats,
    })
}

async fn run_etcd(
    opts: &CompareOptions,
    dir: &Path,
    steps: Steps<'_>,
) -> Result<SystemRun, BenchError> {
    steps(&format!("etcd: starting {} nodes", opts.nodes));
    let mut cluster = EtcdCluster::start(&opts.etcd_bin, dir, opts.nodes).await?;
    let endpoints = etcd_load::EtcdEndpoints {
        urls: cluster.endpoints(),
        protocol: opts.etcd_protocol,
        route: opts.route,
    };
    let setup_client = etcd_load::client_for(&endpoints, 0);
    let data = etcd_load::setup(&setup_client, opts.clients_max()).await?;
    let mut run = SystemRun::default();
    let seed = opts.seed;
    for &workload in &opts.workloads {
        for &clients in &opts.clients {
            steps(&format!("etcd: {workload} × {clients} clients"));
            let control = LoadControl::new(opts.warmup, opts.duration);
            let stats = match workload {
                Workload::LeaseCycle => {
                    run_clients(control, clients, |i, rec| {
                        etcd_load::lease_cycle(&data, &endpoints, i, rec, None)
                    })
                    .await
                }
                Workload::Capacity => {
                    run_clients(control, clients, |i, rec| {
                        etcd_load::capacity(&endpoints, i, seed, rec)
                    })
                    .await
                }
                Workload::Read => {
                    run_clients(control, clients, |i, rec| {
                        etcd_load::read(&endpoints, i, seed, rec)
                    })
                    .await
                }
                Workload::Submit => {
                    // No clean-up: etcd keeps the keys, as Squadron keeps its cancelled
                    // task records; deleting them would leave etcd a growing MVCC history.
                    run_clients(control, clients, |i, rec| {
                        etcd_load::submit(&data, &endpoints, i, rec)
                    })
                    .await
                }
            };
            run.points.push((workload, clients, stats));
        }
    }
    run.memory = cluster.memory();
    if opts.failover {
        steps("etcd: failover (kill -9 of the leader)");
        run.failover = Some(etcd_failover(opts, &mut cluster, &data, &endpoints).await?);
    }
    Ok(run)
}

/// Kill -9 of the leader under a lease-cycle load: the time to the first successful write.
async fn etcd_failover(
    opts: &CompareOptions,
    cluster: &mut EtcdCluster,
    data: &etcd_load::EtcdData,
    endpoints: &etcd_load::EtcdEndpoints,
) -> Result<FailoverResult, BenchError> {
    let leader = cluster
        .wait_for_leader(Duration::from_millis(LEADER_WAIT_MS))
        .await?;
    let clients = opts.failover_clients;
    let probe = Arc::new(FailoverProbe::default());
    let control = LoadControl::new(
        Duration::ZERO,
        Duration::from_millis(FAILOVER_PRE_KILL_MS + FAILOVER_WAIT_MS_MAX),
    );
    let load = run_clients(control.clone(), clients, |i, rec| {
        etcd_load::lease_cycle(data, endpoints, i, rec, Some(probe.clone()))
    });
    let kill = async {
        tokio::time::sleep(Duration::from_millis(FAILOVER_PRE_KILL_MS)).await;
        cluster.kill(leader);
        let killed_at = Instant::now();
        probe.killed(killed_at);
        let elected = cluster
            .wait_for_leader(Duration::from_millis(FAILOVER_WAIT_MS_MAX))
            .await
            .ok()
            .map(|_| killed_at.elapsed());
        wait_for_recovery(&probe).await;
        control.stop();
        elected
    };
    let (stats, elected) = tokio::join!(load, kill);
    Ok(FailoverResult {
        clients,
        killed: format!("etcd m{}", leader + 1),
        recovery_ms: probe.recovery().map(|d| d.as_secs_f64() * 1_000.0),
        leader_elected_ms: elected.map(|d| d.as_secs_f64() * 1_000.0),
        wait_ms_max: FAILOVER_WAIT_MS_MAX,
        load: stats,
    })
}

async fn wait_for_recovery(probe: &FailoverProbe) {
    let start = Instant::now();
    let polls = ConstantBuilder::default()
        .with_delay(Duration::from_millis(FAILOVER_POLL_MS))
        .with_max_times(usize::MAX);
    // Err: no write succeeded yet (the probe's clock measures; this only waits).
    let _ = (|| async { probe.recovery().ok_or(()) })
        .retry(polls)
        .when(|_| start.elapsed() < Duration::from_millis(FAILOVER_WAIT_MS_MAX))
        .await;
}
