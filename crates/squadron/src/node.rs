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
    peer_listen: SocketAddr,
    worker_listen: Option<SocketAddr>,
    docker_warm_pool: usize,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let data_dir = absolute("--data-dir", &data_dir)?;
    let config = NodeConfig::single_node(data_dir.clone(), listen, grpc_listen, peer_listen);
    let first_start = dev_pki(&config)?;
    let node_pki = config.pki_dir();
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
    println!("  REST API:  https://{rest}/api/v1   (OpenAPI: https://{rest}/api/v1/openapi.json)");
    println!("  dashboard: https://{rest}/");
    println!(
        "  gRPC:      {}   peer: {}",
        running.grpc_addr, running.peer_addr
    );
    if first_start {
        println!("  made a cluster CA, certificates and an admin token; from another directory:");
    } else {
        println!("  from another directory:");
    }
    println!(
        "    export SQUADRON_CACERT={}",
        node_pki.ca_cert().display()
    );
    println!(
        "    export SQUADRON_TOKEN_FILE={}",
        data_dir
            .join(crate::cli::init::ADMIN_TOKEN_FILE_NAME)
            .display()
    );
    let worker = match worker_listen {
        None => {
            println!("  no local worker (--no-worker). Ctrl-C stops it.");
            None
        }
        Some(addr) => {
            let id = WorkerId::new("dev-worker").context("the dev worker's id")?;
            let worker_dir = data_dir.join("worker");
            let tls = dev_worker_identity(&node_pki, &id, &worker_dir)?;
            let mut config =
                WorkerConfig::new(id, vec![format!("https://{rest}")], worker_dir, addr);
            config.tls = Some(tls);
            config.docker_warm_pool = docker_warm_pool;
            config.runtimes = [RuntimeKind::Process, RuntimeKind::Docker].into();
            // A build with the KVM runtime offers it too where libvirt answers (the probe
            // leaves it out, saying why, elsewhere).
            if cfg!(feature = "libvirt") {
                config.runtimes.insert(RuntimeKind::Kvm);
            }
            config.agent_binary = Some(
                std::env::current_exe()
                    .context("find this binary, which Docker sandboxes run as their agent")?,
            );
            // Dev mode is one user trying things on their machine, often on a local clone.
            config
                .policy
                .repository_sources
                .insert(squadron_core::worker_policy::RepositorySource::Local);
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
        w.stop().await;
    }
    Ok(())
}

/// Makes the dev node's CA, certificate and admin token on first start (0600, under the data
/// directory); true when it did.
fn dev_pki(config: &NodeConfig) -> anyhow::Result<bool> {
    let pki = config.pki_dir();
    if pki.cert(squadron_pki::NODE_CERT_NAME).exists() {
        return Ok(false);
    }
    let target = crate::cli::init::NodeTarget::of_config(config);
    let token = config
        .data_dir
        .join(crate::cli::init::ADMIN_TOKEN_FILE_NAME);
    crate::cli::init::initialise(&[target], None, None, &token)?;
    Ok(true)
}

/// The dev worker's certificate, issued from the dev node's CA into the worker's `pki/` on
/// first start. This (and the test harness) is the one place a worker gets a certificate
/// without enrolling.
/// `--policy FILE` (or the secure default), widened by `--allow-full-network`,
/// `--gateway-allow` and `--allow-local-repositories`.
fn worker_policy(
    args: &WorkerRunArgs,
) -> anyhow::Result<squadron_core::worker_policy::WorkerPolicy> {
    use squadron_core::manifest::NetworkMode;
    use squadron_core::worker_policy::{RepositorySource, WorkerPolicy};
    let mut policy = match &args.policy {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--policy {}", path.display()))?;
            toml::from_str::<WorkerPolicy>(&text)
                .with_context(|| format!("--policy {}", path.display()))?
        }
        None => WorkerPolicy::default(),
    };
    if args.allow_full_network {
        policy.network_modes.insert(NetworkMode::Full);
    }
    if !args.gateway_allow.is_empty() {
        policy.network_modes.insert(NetworkMode::Gateway);
    }
    if args.allow_local_repositories {
        policy.repository_sources.insert(RepositorySource::Local);
    }
    Ok(policy)
}

fn dev_worker_identity(
    node_pki: &squadron_pki::PkiDir,
    id: &WorkerId,
    worker_dir: &Path,
) -> anyhow::Result<squadron_pki::TlsIdentity> {
    let pki = squadron_pki::PkiDir::of_data_dir(worker_dir);
    if !pki.cert(squadron_pki::WORKER_CERT_NAME).exists() {
        let ca = squadron_pki::load_ca(node_pki).context("the dev node's CA")?;
        let cert = squadron_pki::issue_worker_cert(&ca, id)?;
        pki.write_identity(squadron_pki::WORKER_CERT_NAME, &cert)?;
    }
    squadron_pki::TlsIdentity::load(&pki, squadron_pki::WORKER_CERT_NAME)
        .context("the dev worker's certificate")
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
pub async fn worker(args: WorkerRunArgs, cacert: Option<PathBuf>) -> anyhow::Result<()> {
    if args.control.is_empty() {
        anyhow::bail!("--control: give at least one control node REST URL");
    }
    let policy = worker_policy(&args)?;
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
    let cert_dir = match &args.cert_dir {
        Some(d) => absolute("--cert-dir", d)?,
        None => data_dir.join("pki"),
    };
    let ca_pem = cacert
        .map(|f| std::fs::read_to_string(&f).with_context(|| format!("--cacert {}", f.display())))
        .transpose()?;
    if let Some(token_file) = &args.bootstrap_token_file {
        let ca = ca_pem.as_deref().context(
            "--bootstrap-token-file needs --cacert: the CA the control nodes prove themselves with",
        )?;
        let hosts = args
            .advertise
            .as_deref()
            .and_then(squadron_worker::host_of_url)
            .into_iter()
            .collect();
        crate::enroll::enroll_worker(&id, &args.control, ca, token_file, &cert_dir, hosts).await?;
    }
    let tls = squadron_pki::TlsIdentity::load_with_ca(
        &squadron_pki::PkiDir::new(&cert_dir),
        squadron_pki::WORKER_CERT_NAME,
        ca_pem.as_deref(),
    )
    .with_context(|| format!("the worker's certificate in {}", cert_dir.display()))?;
    let mut config = WorkerConfig::new(id, args.control, data_dir, args.listen);
    config.tls = Some(tls);
    config.policy = policy;
    config.runtimes = args.runtimes.into_iter().collect();
    config.capacity = args.capacity;
    config.heartbeat_interval_ms = args.heartbeat_interval_ms;
    config.agent_heartbeat_ms = args.agent_heartbeat_interval_ms;
    config.advertise = args.advertise;
    config.cgroup_root = args
        .cgroup_root
        .map(|d| absolute("--cgroup-root", &d))
        .transpose()?;
    config.docker_image = args.docker_image;
    config.docker_warm_pool = args.docker_warm_pool;
    // Docker sandboxes run `squadron agent` from this very binary (bound read-only), so the
    // agent is always the worker's own version.
    config.agent_binary = Some(
        std::env::current_exe()
            .context("find this binary, which Docker sandboxes run as their agent")?,
    );
    config.global_dir = args
        .global_dir
        .map(|d| absolute("--global-dir", &d))
        .transpose()?;
    config.vm = squadron_worker::VmConfig {
        uri: args.vm_uri,
        image_dir: args
            .vm_image_dir
            .map(|d| absolute("--vm-image-dir", &d))
            .transpose()?,
        state_dir: absolute("--vm-state-dir", &args.vm_state_dir)?,
        virtiofsd: args
            .virtiofsd
            .map(|d| absolute("--virtiofsd", &d))
            .transpose()?,
        domain_type: args.vm_domain_type,
        test_boot_delay_ms: args.vm_test_boot_delay_ms,
    };
    config.env_allowlist = args.env_allowlist;
    config.backoff_override_ms = args.backoff_override_ms;
    config.egress_deny = args.egress_deny;
    config.egress_allow = args.egress_allow;
    // Host names become addresses once, here: every runtime then enforces the same set.
    config.resolve_egress_allow_hosts()?;
    config.allow_full_network = args.allow_full_network;
    config.gateway_allow = args.gateway_allow;
    config.egress_ca = args.egress_ca;
    config.disk_quota = !args.no_disk_quota;
    config.output_retention = args.output_retention.iter().try_fold(
        squadron_worker::OutputRetention::default(),
        |r, (class, ms)| r.with_age(class, *ms),
    )?;
    config.sandbox_defaults = squadron_worker::SandboxDefaults {
        cpus: args.sandbox_cpus,
        memory_bytes: squadron_core::quantity::parse_byte_size(
            "--sandbox-memory",
            &args.sandbox_memory,
        )?,
        pids_max: args.sandbox_pids,
        disk_bytes: squadron_core::quantity::parse_byte_size("--sandbox-disk", &args.sandbox_disk)?,
        project_disk_bytes: squadron_core::quantity::parse_byte_size(
            "--project-disk",
            &args.project_disk,
        )?,
    };
    config.agents = if args.no_agents {
        None
    } else {
        let mut agents = squadron_worker::AgentConfig {
            lease_ttl_ms: args.agent_lease_ttl_ms,
            stop_grace_ms: args.agent_stop_grace_ms,
            detached_sandbox_retention_ms: args.detached_sandbox_retention,
            detached_sweep_interval_ms: args.detached_sweep_interval_ms,
            // A short TTL (tests) gets a proportionally short margin.
            self_fence_margin_ms: squadron_worker::SELF_FENCE_MARGIN_MS_DEFAULT
                .min(args.agent_lease_ttl_ms / 4),
            skills: args.skills.into_iter().collect(),
            ..Default::default()
        };
        for spec in &args.mcp_servers {
            let (id, url) = squadron_worker::parse_mcp_server(spec)
                .map_err(|e| anyhow::anyhow!("--mcp-server: {e}"))?;
            agents.mcp_servers.insert(id, url);
        }
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
    w.stop().await;
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
