//! A cluster of `squadron server` processes on loopback, each with its own generated TOML
//! config, data directory and log file.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::squadron_load::BENCH_WORKER;
use backon::{ConstantBuilder, RetryableWithContext};
use squadron_client::{Consistency, Credentials, SquadronClient};

use crate::error::BenchError;
use crate::options::ClientRoute;
use crate::process::{free_port, NodeMemory, NodeProcess};
use crate::squadron_load::Endpoints;

/// How long a cluster may take to start and agree on a leader (generous: the machine is
/// shared and small).
pub(crate) const STARTUP_TIMEOUT_MS: u64 = 60_000;
/// Between two polls of the nodes' status.
pub(crate) const POLL_INTERVAL_MS: u64 = 100;
/// One status request.
const STATUS_TIMEOUT_MS: u64 = 2_000;

#[derive(Debug)]
struct SquadronNode {
    id: u64,
    rest: String,
    process: NodeProcess,
    /// Its directory and config: what a restart runs it from again.
    base: std::path::PathBuf,
    config: std::path::PathBuf,
}

/// Why a look at a cluster found no agreed leader.
#[derive(Debug)]
pub(crate) enum LeaderWait {
    /// Not yet: what was wrong.
    NotYet(String),
    /// A node process ended: no leader is coming.
    Exited(String),
}

/// One look at the cluster, in the shape a retry with context takes: the cluster and the last
/// problem seen go in and come out again.
async fn look(
    (cluster, last): (&mut SquadronCluster, String),
) -> ((&mut SquadronCluster, String), Result<u64, LeaderWait>) {
    match cluster.agreed_leader(last).await {
        Ok(leader) => ((cluster, String::new()), Ok(leader)),
        Err(LeaderWait::NotYet(last)) => ((cluster, last.clone()), Err(LeaderWait::NotYet(last))),
        Err(exited) => ((cluster, String::new()), Err(exited)),
    }
}

/// `squadron init` over the nodes' configs (CA, node certificates, admin token under `dir`);
/// the credentials the benchmark's clients present.
fn init_pki(
    bin: &Path,
    dir: &Path,
    configs: &[(u64, String, std::path::PathBuf, std::path::PathBuf)],
) -> Result<(Credentials, Credentials), BenchError> {
    let token_file = dir.join("squadron-admin.token");
    let failed = |message: String| BenchError::Startup {
        system: "squadron",
        message: format!("squadron init: {message}"),
        logs: String::new(),
    };
    // `squadron init <every node's config> <extra>`; its stderr is the error when it fails.
    let init = |extra: &[&std::ffi::OsStr]| {
        let out = Command::new(bin)
            .arg("init")
            .args(configs.iter().map(|c| &c.3))
            .args(extra)
            .output()
            .map_err(|e| failed(e.to_string()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(failed(String::from_utf8_lossy(&out.stderr).into_owned()))
        }
    };
    init(&["--admin-token-file".as_ref(), token_file.as_os_str()])?;
    let worker_dir = dir.join("squadron-bench-worker-pki");
    let worker_cert = format!("{BENCH_WORKER}={}", worker_dir.display());
    init(&["--worker-cert".as_ref(), worker_cert.as_ref()])?;
    let worker = Credentials::from_cert_dir(&worker_dir, squadron_client::WORKER_CERT_NAME)
        .map_err(|e| failed(format!("the bench worker's certificate: {e}")))?;
    let first = configs.first().ok_or_else(|| failed("no nodes".into()))?;
    let ca_path = first.2.join("data/pki/ca.pem");
    let ca = std::fs::read_to_string(&ca_path).map_err(|e| BenchError::io("read", &ca_path, e))?;
    let token =
        std::fs::read_to_string(&token_file).map_err(|e| BenchError::io("read", &token_file, e))?;
    let operator = Credentials::operator(&ca, Some(token)).map_err(|e| failed(e.to_string()))?;
    Ok((operator, worker))
}

/// A running Squadron cluster; dropping it kills every node.
#[derive(Debug)]
pub(crate) struct SquadronCluster {
    bin: std::path::PathBuf,
    nodes: Vec<SquadronNode>,
    /// The CA and admin token `squadron init` made for this cluster.
    credentials: Credentials,
    /// The bench worker's certificate (its registration is its own).
    worker_credentials: Credentials,
    /// The run's directory, and what every node's config adds to the generated one.
    dir: std::path::PathBuf,
    extra_config: String,
    /// The leader the nodes last agreed on (`wait_for_leader`).
    leader: Option<u64>,
}

impl SquadronCluster {
    /// Starts `n` nodes under `dir` and waits until they agree on a leader.
    pub(crate) async fn start(bin: &Path, dir: &Path, n: usize) -> Result<Self, BenchError> {
        Self::start_with(bin, dir, n, "").await
    }

    /// [`Self::start`], every node's config ending with `extra_config` (TOML tables).
    pub(crate) async fn start_with(
        bin: &Path,
        dir: &Path,
        n: usize,
        extra_config: &str,
    ) -> Result<Self, BenchError> {
        let mut members = Vec::with_capacity(n);
        for id in 1..=n as u64 {
            members.push((
                id,
                format!("127.0.0.1:{}", free_port()?),
                format!("127.0.0.1:{}", free_port()?),
                format!("127.0.0.1:{}", free_port()?),
            ));
        }
        let initial: String = members
            .iter()
            .map(|(id, rest, grpc, peer)| {
                format!(
                    "[[initial_members]]\nid = {id}\nrest = \"{rest}\"\ngrpc = \"{grpc}\"\n\
                     peer = \"{peer}\"\n\n"
                )
            })
            .collect();
        let mut configs = Vec::new();
        for (id, rest, grpc, peer) in &members {
            let (base, path) = write_config(
                dir,
                (*id, rest, grpc, peer),
                &format!("{initial}{extra_config}"),
            )?;
            configs.push((*id, rest.clone(), base, path));
        }
        let (credentials, worker_credentials) = init_pki(bin, dir, &configs)?;
        let mut cluster = SquadronCluster {
            bin: bin.to_path_buf(),
            nodes: Vec::new(),
            credentials,
            worker_credentials,
            dir: dir.to_path_buf(),
            extra_config: extra_config.to_string(),
            leader: None,
        };
        for (id, rest, base, path) in &configs {
            let process = spawn_node(bin, *id, base, path)?;
            cluster.nodes.push(SquadronNode {
                id: *id,
                rest: rest.clone(),
                process,
                base: base.clone(),
                config: path.clone(),
            });
        }
        cluster
            .wait_for_leader(Duration::from_millis(STARTUP_TIMEOUT_MS))
            .await?;
        Ok(cluster)
    }

    /// Starts a node that is not a member yet (no `initial_members`), with a certificate from
    /// the cluster's CA; the caller adds it. Returns its id and its REST, gRPC and peer
    /// addresses.
    pub(crate) fn start_new_node(&mut self) -> Result<(u64, [String; 3]), BenchError> {
        let id = self.nodes.iter().map(|n| n.id).max().unwrap_or(0) + 1;
        let addrs = [
            format!("127.0.0.1:{}", free_port()?),
            format!("127.0.0.1:{}", free_port()?),
            format!("127.0.0.1:{}", free_port()?),
        ];
        let [rest, grpc, peer] = &addrs;
        let (base, config) = write_config(&self.dir, (id, rest, grpc, peer), &self.extra_config)?;
        let first = self.nodes.first().ok_or_else(|| BenchError::Startup {
            system: "squadron",
            message: "no node to take the CA from".into(),
            logs: String::new(),
        })?;
        let pki = first.base.join("data/pki");
        let out = Command::new(&self.bin)
            .arg("init")
            .arg(&config)
            .arg("--ca-cert")
            .arg(pki.join("ca.pem"))
            .arg("--ca-key")
            .arg(pki.join("ca.key"))
            .output()
            .map_err(|e| BenchError::io("run squadron init for", &config, e))?;
        if !out.status.success() {
            return Err(BenchError::Startup {
                system: "squadron",
                message: format!(
                    "squadron init of node {id}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ),
                logs: String::new(),
            });
        }
        let process = spawn_node(&self.bin, id, &base, &config)?;
        self.nodes.push(SquadronNode {
            id,
            rest: rest.clone(),
            process,
            base,
            config,
        });
        Ok((id, addrs))
    }

    /// A client of node `id` alone (no other endpoint to fall back on).
    pub(crate) fn node_client(&self, id: u64) -> Result<SquadronClient, BenchError> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.id == id)
            .ok_or_else(|| BenchError::setup("squadron", "a node's client", "no such node"))?;
        SquadronClient::secured_with_timeouts(
            vec![node.rest.clone()],
            &self.credentials,
            Duration::from_millis(STATUS_TIMEOUT_MS),
            Duration::from_millis(STATUS_TIMEOUT_MS),
        )
        .map_err(|e| BenchError::setup("squadron", "a node's client", e))
    }

    /// Every node's id and REST address (`https://…`), running or not.
    pub(crate) fn node_urls(&self) -> Vec<(u64, String)> {
        self.nodes
            .iter()
            .map(|n| (n.id, format!("https://{}", n.rest)))
            .collect()
    }

    /// `https://host:port` of every running node, with the cluster's credentials.
    /// The running nodes, the last agreed leader first; clients spread over them.
    pub(crate) fn endpoints(&self) -> Endpoints {
        let mut running: Vec<&SquadronNode> =
            self.nodes.iter().filter(|n| n.process.running()).collect();
        running.sort_by_key(|n| Some(n.id) != self.leader);
        Endpoints {
            urls: running
                .iter()
                .map(|n| format!("https://{}", n.rest))
                .collect(),
            credentials: self.credentials.clone(),
            worker_credentials: self.worker_credentials.clone(),
            route: ClientRoute::Spread,
        }
    }

    /// Waits until every running node names the same running leader.
    pub(crate) async fn wait_for_leader(&mut self, timeout: Duration) -> Result<u64, BenchError> {
        let start = Instant::now();
        let polls = ConstantBuilder::default()
            .with_delay(Duration::from_millis(POLL_INTERVAL_MS))
            .with_max_times(usize::MAX);
        let ((this, _), agreed) = look
            .retry(polls)
            .context((self, String::from("no answer yet")))
            .when(|e| matches!(e, LeaderWait::NotYet(_)) && start.elapsed() < timeout)
            .await;
        match agreed {
            Ok(leader) => {
                this.leader = Some(leader);
                Ok(leader)
            }
            Err(LeaderWait::Exited(message)) => Err(this.startup_error(message)),
            Err(LeaderWait::NotYet(last)) => {
                Err(this.startup_error(format!("no agreed leader after {timeout:?}: {last}")))
            }
        }
    }

    /// One look at every running node: the leader they all name, if they agree on a running
    /// one. `last` is what the previous look found wrong, kept when this one learns nothing.
    async fn agreed_leader(&mut self, mut last: String) -> Result<u64, LeaderWait> {
        let exited = self.nodes.iter_mut().find_map(|n| {
            n.process
                .exited()
                .map(|s| format!("{} exited: {s}", n.process.name))
        });
        if let Some(message) = exited {
            return Err(LeaderWait::Exited(message));
        }
        let mut seen = Vec::new();
        for node in self.nodes.iter().filter(|n| n.process.running()) {
            let client = SquadronClient::secured_with_timeouts(
                vec![node.rest.clone()],
                &self.credentials,
                Duration::from_millis(STATUS_TIMEOUT_MS),
                Duration::from_millis(STATUS_TIMEOUT_MS),
            )
            .map_err(|e| LeaderWait::Exited(e.to_string()))?;
            match client
                .cluster_status_without_digest(Consistency::Stale)
                .await
            {
                Ok(s) => seen.push(s.leader),
                Err(e) => {
                    last = format!("node {}: {e}", node.id);
                    seen.push(None);
                }
            }
        }
        if let Some(Some(leader)) = seen.first().copied() {
            let alive = self
                .nodes
                .iter()
                .any(|n| n.id == leader && n.process.running());
            if alive && seen.iter().all(|s| *s == Some(leader)) {
                return Ok(leader);
            }
            last = format!("leaders seen: {seen:?}");
        }
        Err(LeaderWait::NotYet(last))
    }

    /// SIGKILL of one node.
    pub(crate) fn kill(&mut self, id: u64) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.id == id) {
            n.process.kill();
        }
    }

    /// Starts a killed node again from its own data directory and config.
    pub(crate) fn restart(&mut self, id: u64) -> Result<(), BenchError> {
        let bin = self.bin.clone();
        if let Some(n) = self.nodes.iter_mut().find(|n| n.id == id) {
            n.process.kill();
            n.process = spawn_node(&bin, id, &n.base, &n.config)?;
        }
        Ok(())
    }

    /// Node `id`'s resident memory, if it runs.
    pub(crate) fn rss_kib(&self, id: u64) -> Option<u64> {
        self.nodes.iter().find(|n| n.id == id)?.process.rss_kib()
    }

    pub(crate) fn memory(&self) -> Vec<NodeMemory> {
        self.nodes
            .iter()
            .filter_map(|n| {
                Some(NodeMemory {
                    node: n.process.name.clone(),
                    rss_kib: n.process.rss_kib()?,
                })
            })
            .collect()
    }

    fn startup_error(&self, message: String) -> BenchError {
        BenchError::Startup {
            system: "squadron",
            message,
            logs: self
                .nodes
                .iter()
                .map(|n| n.process.log_tail())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// Writes node `id`'s config under `dir` (its own directory, created): its listeners, a data
/// directory beside the config, then `tables`. Returns the directory and the config's path.
fn write_config(
    dir: &Path,
    (id, rest, grpc, peer): (u64, &str, &str, &str),
    tables: &str,
) -> Result<(std::path::PathBuf, std::path::PathBuf), BenchError> {
    let base = dir.join(format!("squadron-node{id}"));
    std::fs::create_dir_all(&base).map_err(|e| BenchError::io("create", &base, e))?;
    // Durable defaults: the store syncs every log append; nothing here relaxes it.
    let config = format!(
        "node_id = {id}\ncluster_name = \"squadron-bench\"\nrest_listen = \"{rest}\"\n\
         grpc_listen = \"{grpc}\"\npeer_listen = \"{peer}\"\ndata_dir = \"data\"\n\n{tables}"
    );
    let path = base.join("node.toml");
    std::fs::write(&path, config).map_err(|e| BenchError::io("write", &path, e))?;
    Ok((base, path))
}

/// The nodes' log filter (`RUST_LOG` syntax); `warn` when unset. With `--keep-work-dir`,
/// `SQUADRON_BENCH_NODE_LOG=info` keeps each election's steps in the nodes' logs.
pub const NODE_LOG_ENV: &str = "SQUADRON_BENCH_NODE_LOG";

/// `squadron server --config PATH`, its output appended to `node.log` beside the config.
fn spawn_node(bin: &Path, id: u64, base: &Path, config: &Path) -> Result<NodeProcess, BenchError> {
    let filter = std::env::var(NODE_LOG_ENV).unwrap_or_else(|_| "warn".into());
    let mut command = Command::new(bin);
    command
        .args(["server", "--config"])
        .arg(config)
        .env("RUST_LOG", filter);
    NodeProcess::spawn(
        format!("squadron node {id}"),
        command,
        base.join("node.log"),
    )
}
