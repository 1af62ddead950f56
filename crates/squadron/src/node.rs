//! `squadron server` and `squadron dev`: start a control node and run it until a signal.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use backon::{ConstantBuilder, Retryable};
use squadron_core::ids::WorkerId;
use squadron_core::manifest::RuntimeKind;
use squadron_server::NodeConfig;
use squadron_worker::WorkerConfig;

use crate::cli::worker::WorkerRunArgs;

/// How long `dev` waits for its single node to elect itself before printing anyway.
const DEV_LEADER_WAIT: Duration = Duration::from_secs(15);
/// Between two looks for that leader.
const DEV_LEADER_POLL_MS: u64 = 50;

/// A directory or file the binary was given, made absolute against the working directory:
/// sandboxes bind data directories by path, and bubblewrap would resolve a relative bind
/// source against its own working directory, not ours.
fn absolute(flag: &str, path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("{flag}: making {} absolute", path.display()))
}

pub async fn server(config_path: &Path) -> anyhow::Result<()> {
    // Absolute, so a data dir relative to the config file is absolute too.
    let config_path = absolute("--config", config_path)?;
    let config = NodeConfig::load(&config_path)
        .with_context(|| format!("loading {}", config_path.display()))?;
    let id = config.node_id;
    let running = squadron_server::start(config)
        .await
        .context("starting the node")?;
    println!(
        "squadron node {id} listening rest={} grpc={}",
        running.rest_addr, running.grpc_addr
    );
    running.wait().await;
    tracing::info!(node = id, "stopped");
    Ok(())
}

pub async fn dev(
    data_dir: PathBuf,
    listen: SocketAddr,
    grpc_listen: SocketAddr,
    worker_listen: Option<SocketAddr>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let data_dir = absolute("--data-dir", &data_dir)?;
    let config = NodeConfig::single_node(data_dir.clone(), listen, grpc_listen);
    let running = squadron_server::start(config)
        .await
        .context("starting the dev node")?;
    let started = Instant::now();
    let polls = ConstantBuilder::default()
        .with_delay(Duration::from_millis(DEV_LEADER_POLL_MS))
        .with_max_times(usize::MAX);
    let elected = (|| async { running.node.leader().ok_or(()) })
        .retry(polls)
        .when(|_| started.elapsed() < DEV_LEADER_WAIT)
        .await;
    if elected.is_err() {
        tracing::warn!(
            "no leader after {:?}; the API answers unavailable until one is elected",
            DEV_LEADER_WAIT
        );
    }
    let rest = running.rest_addr;
    println!(
        "squadron dev: single-node control plane (data in {})",
        data_dir.display()
    );
    println!("  REST API:  http://{rest}/api/v1   (OpenAPI: http://{rest}/api/v1/openapi.json)");
    println!("  dashboard: http://{rest}/");
    println!("  gRPC:      {}", running.grpc_addr);
    let worker = match worker_listen {
        None => {
            println!("  no local worker (--no-worker). Ctrl-C stops it.");
            None
        }
        Some(addr) => {
            let id = WorkerId::new("dev-worker").context("the dev worker's id")?;
            let mut config = WorkerConfig::new(
                id,
                vec![format!("http://{rest}")],
                data_dir.join("worker"),
                addr,
            );
            config.runtimes = [RuntimeKind::Process, RuntimeKind::Docker].into();
            let w = start_worker(config).await?;
            println!(
                "  worker:    dev-worker, output server {} (Ctrl-C stops everything)",
                w.url
            );
            Some(w)
        }
    };
    running.wait().await;
    if let Some(w) = worker {
        w.shutdown();
    }
    Ok(())
}

/// Probes the runtimes asked for, says which this host cannot offer and why, and starts the
/// worker with the rest.
async fn start_worker(config: WorkerConfig) -> anyhow::Result<squadron_worker::RunningWorker> {
    let (runtimes, unavailable) = squadron_worker::probe_runtimes(&config).await;
    for (kind, why) in &unavailable {
        println!("  runtime {kind} unavailable: {why}");
    }
    if runtimes.is_empty() {
        anyhow::bail!("no runtime is available on this host");
    }
    squadron_worker::start(config, runtimes)
        .await
        .context("starting the worker")
}

/// `squadron worker`: runs a worker until a signal.
pub async fn worker(args: WorkerRunArgs) -> anyhow::Result<()> {
    if args.control.is_empty() {
        anyhow::bail!("--control: give at least one control node REST URL");
    }
    let id = match args.id {
        Some(id) => id,
        None => {
            let host = std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default();
            WorkerId::new(if host.is_empty() {
                "worker".to_string()
            } else {
                host
            })
            .context("--id: the host name is not a valid worker id; pass --id")?
        }
    };
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data_dir = absolute("--data-dir", &args.data_dir)?;
    let mut config = WorkerConfig::new(id, args.control, data_dir, args.listen);
    config.runtimes = args.runtimes.into_iter().collect();
    config.capacity = args.capacity;
    config.heartbeat_interval_ms = args.heartbeat_interval_ms;
    config.advertise = args.advertise;
    config.cgroup_root = args
        .cgroup_root
        .map(|d| absolute("--cgroup-root", &d))
        .transpose()?;
    config.docker_image = args.docker_image;
    config.global_dir = args
        .global_dir
        .map(|d| absolute("--global-dir", &d))
        .transpose()?;
    config.env_allowlist = args.env_allowlist;
    config.backoff_override_ms = args.backoff_override_ms;
    config.agents = if args.no_agents {
        None
    } else {
        let mut agents = squadron_worker::AgentConfig {
            lease_ttl_ms: args.agent_lease_ttl_ms,
            stop_grace_ms: args.agent_stop_grace_ms,
            // A short TTL (tests) gets a proportionally short margin.
            self_fence_margin_ms: squadron_worker::SELF_FENCE_MARGIN_MS_DEFAULT
                .min(args.agent_lease_ttl_ms / 4),
            skills: args.skills.into_iter().collect(),
            mcp_servers: args.mcp_servers.into_iter().collect(),
            ..Default::default()
        };
        for spec in &args.provider_scripts {
            let (provider, launcher) = squadron_worker::AgentConfig::parse_provider_script(spec)
                .map_err(|e| anyhow::anyhow!("--provider-script: {e}"))?;
            agents.providers.insert(provider, launcher);
        }
        Some(agents)
    };
    config.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let w = start_worker(config).await?;
    println!("squadron worker running; output server {}", w.url);
    shutdown_signal().await;
    w.shutdown();
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
