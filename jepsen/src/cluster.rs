//! A cluster of real `squadron server` processes, on loopback or in network namespaces.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use squadron_client::{ClusterStatus, Consistency, Credentials, SquadronClient};
use squadron_core::ids::WorkerId;
use squadron_core::worker::WorkerStatus;

use crate::lazyfs::LazyMount;
use crate::netns::{
    NamespaceNet, NetError, NODE_GRPC_PORT, NODE_PEER_PORT, NODE_REST_PORT, WORKER_PORT,
};
use crate::node::{NodeError, NodeProcess, NodeSpec};
use crate::node_final::NodeFinal;
use crate::worker_process::{WorkerError, WorkerProcess, WORKER_START_MS_MAX};

/// How long a status request to one node may take.
pub const STATUS_TIMEOUT_MS: u64 = 2_000;
/// How long a started node may take to answer `/healthz`.
pub const NODE_START_TIMEOUT_MS: u64 = 30_000;
/// Poll interval of every wait.
pub const POLL_INTERVAL_MS: u64 = 200;
/// Where Debian's libfaketime lives (the multi-threaded variant: the node is multi-threaded).
pub const FAKETIME_LIBS: [&str; 2] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
];
/// The name of each node's clock-offset file, re-read by libfaketime about once a second.
pub const FAKETIME_FILE: &str = "faketime.rc";

/// The installed libfaketime, if any.
pub fn faketime_lib() -> Option<PathBuf> {
    FAKETIME_LIBS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Where the nodes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetMode {
    /// Network namespaces when they can be made, else loopback.
    Auto,
    /// Network namespaces, or fail.
    Netns,
    /// Loopback: process faults only, no partitions.
    Loopback,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error(transparent)]
    Net(#[from] NetError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error("the worker did not come up alive within {waited_ms} ms ({last}); its log:\n{log}")]
    WorkerNotAlive {
        waited_ms: u64,
        last: String,
        log: String,
    },
    #[error("this run has no worker process (only the takeover workload starts one)")]
    NoWorker,
    #[error("no free loopback port: {0}")]
    Port(std::io::Error),
    #[error("{what} within {waited_ms} ms; node logs:\n{logs}")]
    Timeout {
        what: String,
        waited_ms: u64,
        logs: String,
    },
    #[error("node {0} is not part of this cluster")]
    UnknownNode(u64),
    #[error("`squadron init`: {0}")]
    Init(String),
    #[error(transparent)]
    LazyFs(#[from] crate::lazyfs::LazyFsError),
    #[error("node {0} has no lazy filesystem: a crash needs the run's --lazyfs")]
    NoLazyFs(u64),
}

/// Runs `squadron init` over the nodes' configs: the CA, node certificates and an admin token
/// (written under `dir`), then the harness worker's certificate; returns the credentials the
/// clients use, as operator and as that worker.
fn init_pki(
    dir: &Path,
    bin: &Path,
    nodes: &BTreeMap<u64, NodeProcess>,
) -> Result<(Credentials, Credentials), ClusterError> {
    let token = dir.join("admin.token");
    let worker_dir = dir.join("worker-pki");
    let worker_cert = format!("{}={}", crate::workload::WORKER, worker_dir.display());
    run_init(
        bin,
        nodes,
        &["--admin-token-file".as_ref(), token.as_os_str()],
    )?;
    run_init(
        bin,
        nodes,
        &["--worker-cert".as_ref(), worker_cert.as_ref()],
    )?;
    let first = nodes.values().next().ok_or(ClusterError::UnknownNode(1))?;
    let ca = std::fs::read_to_string(first.dir.join("data/pki/ca.pem"))
        .map_err(|e| ClusterError::Init(format!("reading the CA: {e}")))?;
    let token = std::fs::read_to_string(&token)
        .map_err(|e| ClusterError::Init(format!("reading the admin token: {e}")))?;
    let operator =
        Credentials::operator(&ca, Some(token)).map_err(|e| ClusterError::Init(e.to_string()))?;
    let worker = Credentials::from_cert_dir(&worker_dir, squadron_client::WORKER_CERT_NAME)
        .map_err(|e| ClusterError::Init(format!("reading the worker's certificate: {e}")))?;
    Ok((operator, worker))
}

/// `squadron init <every node's config> <extra>`; its stderr is the error when it fails.
fn run_init(
    bin: &Path,
    nodes: &BTreeMap<u64, NodeProcess>,
    extra: &[&std::ffi::OsStr],
) -> Result<(), ClusterError> {
    let out = std::process::Command::new(bin)
        .arg("init")
        .args(nodes.values().map(|n| &n.config))
        .args(extra)
        .output()
        .map_err(|e| ClusterError::Init(e.to_string()))?;
    if !out.status.success() {
        return Err(ClusterError::Init(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    Ok(())
}

fn client_of(
    credentials: &Credentials,
    endpoints: Vec<String>,
    request: Duration,
    connect: Duration,
) -> Result<SquadronClient, ClusterError> {
    SquadronClient::secured_with_timeouts(endpoints, credentials, request, connect)
        .map_err(|e| ClusterError::Init(e.to_string()))
}

fn free_port() -> Result<u16, ClusterError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(ClusterError::Port)
}

/// The nodes of one run and the network they share.
#[derive(Debug)]
pub struct Cluster {
    pub bin: PathBuf,
    pub nodes: BTreeMap<u64, NodeProcess>,
    /// The takeover workload's real worker; declared before `net` so it goes first.
    pub worker: Option<WorkerProcess>,
    /// Where the nodes' (and the worker's) files are.
    dir: PathBuf,
    /// Each node's lazy filesystem over its data directory, when mounted; declared after
    /// `nodes` so nothing uses a mount when it goes.
    lazy: BTreeMap<u64, LazyMount>,
    /// Declared after `nodes` so the processes die before their namespaces go.
    pub net: Option<NamespaceNet>,
    /// Why namespaces are not used, when they are not.
    pub net_note: Option<String>,
    /// Whether the nodes run under libfaketime (clock faults possible).
    pub faketime: bool,
    /// The cluster CA and the admin token `squadron init` made for this run.
    pub credentials: Credentials,
    /// The harness's worker certificate (`workload::WORKER`), made by `squadron init`.
    pub worker_credentials: Credentials,
    http: SquadronClient,
}

impl Cluster {
    /// Prepares `n` nodes under `dir` (configs written, nothing started). With `faketime`,
    /// every node runs under libfaketime with a zero offset the clock nemesis can change.
    pub fn prepare(
        dir: &Path,
        bin: &Path,
        n: u64,
        mode: NetMode,
        faketime: Option<&Path>,
    ) -> Result<Self, ClusterError> {
        let (net, net_note) = match mode {
            NetMode::Loopback => (
                None,
                Some("loopback chosen: partitions are not available".to_string()),
            ),
            NetMode::Netns => (Some(NamespaceNet::create(n)?), None),
            NetMode::Auto => match NamespaceNet::create(n) {
                Ok(net) => (Some(net), None),
                Err(e) => (
                    None,
                    Some(format!(
                        "network namespaces unavailable ({e}); loopback with process faults only"
                    )),
                ),
            },
        };
        let mut specs = Vec::new();
        for id in 1..=n {
            specs.push(match &net {
                Some(net) => NodeSpec {
                    id,
                    rest: format!("{}:{NODE_REST_PORT}", net.address(id)),
                    grpc: format!("{}:{NODE_GRPC_PORT}", net.address(id)),
                    peer: format!("{}:{NODE_PEER_PORT}", net.address(id)),
                },
                None => NodeSpec {
                    id,
                    rest: format!("127.0.0.1:{}", free_port()?),
                    grpc: format!("127.0.0.1:{}", free_port()?),
                    peer: format!("127.0.0.1:{}", free_port()?),
                },
            });
        }
        let mut nodes = BTreeMap::new();
        for spec in &specs {
            let mut node = NodeProcess::prepare(dir, spec.clone(), &specs)?;
            if let Some(net) = &net {
                node.exec_prefix = net.exec_prefix(spec.id);
            }
            if let Some(lib) = faketime {
                let file = node.dir.join(FAKETIME_FILE);
                std::fs::write(&file, "+0\n").map_err(|source| {
                    ClusterError::Node(NodeError::Write {
                        id: spec.id,
                        path: file.clone(),
                        source,
                    })
                })?;
                node.extra_env = vec![
                    ("LD_PRELOAD".into(), lib.display().to_string()),
                    ("FAKETIME_TIMESTAMP_FILE".into(), file.display().to_string()),
                    ("FAKETIME_CACHE_DURATION".into(), "1".into()),
                    // Only the wall clock moves: the leader stamps commands with it, while
                    // timers and timeouts keep the true monotonic clock.
                    ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
                ];
            }
            nodes.insert(spec.id, node);
        }
        let (credentials, worker_credentials) = init_pki(dir, bin, &nodes)?;
        let http = client_of(
            &credentials,
            Vec::new(),
            Duration::from_millis(STATUS_TIMEOUT_MS),
            Duration::from_millis(STATUS_TIMEOUT_MS),
        )?;
        Ok(Self {
            bin: bin.into(),
            nodes,
            worker: None,
            dir: dir.into(),
            lazy: BTreeMap::new(),
            net,
            net_note,
            credentials,
            worker_credentials,
            http,
            faketime: faketime.is_some(),
        })
    }

    /// A client of `endpoints` with this run's CA and admin token.
    pub fn client(
        &self,
        endpoints: Vec<String>,
        request: Duration,
        connect: Duration,
    ) -> Result<SquadronClient, ClusterError> {
        client_of(&self.credentials, endpoints, request, connect)
    }

    /// A client presenting the harness's worker certificate instead of the admin token.
    pub fn worker_client(
        &self,
        endpoints: Vec<String>,
        request: Duration,
        connect: Duration,
    ) -> Result<SquadronClient, ClusterError> {
        client_of(&self.worker_credentials, endpoints, request, connect)
    }

    /// Sets node `id`'s wall-clock offset (libfaketime syntax: `+30s`, `-2m`, `+0`).
    pub fn set_clock_offset(&self, id: u64, offset: &str) -> Result<(), ClusterError> {
        let node = self.nodes.get(&id).ok_or(ClusterError::UnknownNode(id))?;
        let file = node.dir.join(FAKETIME_FILE);
        std::fs::write(&file, format!("{offset}\n")).map_err(|source| {
            ClusterError::Node(NodeError::Write {
                id,
                path: file,
                source,
            })
        })
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// Every node's REST URL, running or not: clients fail over among them.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.values().map(NodeProcess::url).collect()
    }

    fn node_mut(&mut self, id: u64) -> Result<&mut NodeProcess, ClusterError> {
        self.nodes.get_mut(&id).ok_or(ClusterError::UnknownNode(id))
    }

    /// Puts every node's data directory on a lazy filesystem (`lazyfs`): what `squadron
    /// init` wrote moves to the disk underneath, as if synced long ago.
    pub fn mount_lazyfs(&mut self) -> Result<(), ClusterError> {
        for (id, node) in &self.nodes {
            let data = node.dir.join("data");
            let disk = node.dir.join("disk");
            if data.exists() {
                std::fs::rename(&data, &disk).map_err(|source| NodeError::Write {
                    id: *id,
                    path: disk.clone(),
                    source,
                })?;
            }
            self.lazy.insert(*id, LazyMount::mount(&disk, &data)?);
        }
        Ok(())
    }

    pub fn has_lazyfs(&self) -> bool {
        !self.lazy.is_empty()
    }

    /// Kills node `id`, then drops every write its filesystem had not synced: a power cut.
    /// Returns the (files, bytes) lost.
    pub fn crash(&mut self, id: u64) -> Result<(u64, u64), ClusterError> {
        self.kill(id)?;
        let lazy = self.lazy.get(&id).ok_or(ClusterError::NoLazyFs(id))?;
        Ok(lazy.crash())
    }

    /// What each node's lazy filesystem did (empty without `--lazyfs`).
    pub fn lazyfs_stats(&self) -> BTreeMap<u64, crate::lazyfs::Stats> {
        self.lazy.iter().map(|(id, l)| (*id, l.stats())).collect()
    }

    pub fn start(&mut self, id: u64) -> Result<(), ClusterError> {
        if let Some(lazy) = self.lazy.get(&id) {
            lazy.restart();
        }
        let bin = self.bin.clone();
        self.node_mut(id)?.start(&bin)?;
        Ok(())
    }

    /// Kills node `id` and replaces its disk by an empty one (`NodeProcess::wipe`); returns
    /// what was removed.
    pub fn kill_and_wipe(&mut self, id: u64) -> Result<Vec<String>, ClusterError> {
        let node = self.node_mut(id)?;
        node.kill();
        Ok(node.wipe()?)
    }

    pub fn kill(&mut self, id: u64) -> Result<(), ClusterError> {
        self.node_mut(id)?.kill();
        Ok(())
    }

    /// A graceful stop (SIGTERM; SIGKILL after a grace period).
    pub fn stop(&mut self, id: u64) -> Result<(), ClusterError> {
        self.node_mut(id)?.stop()?;
        Ok(())
    }

    pub fn pause(&mut self, id: u64) -> Result<(), ClusterError> {
        self.node_mut(id)?.pause()?;
        Ok(())
    }

    pub fn resume(&mut self, id: u64) -> Result<(), ClusterError> {
        self.node_mut(id)?.resume()?;
        Ok(())
    }

    /// Starts the takeover workload's worker (certificate `worker-pki`, files under
    /// `worker/`) where every node reaches it, and waits until the cluster reports it alive.
    pub async fn start_worker(&mut self) -> Result<(), ClusterError> {
        let listen = match &self.net {
            Some(net) => format!("{}:{WORKER_PORT}", net.gateway()),
            None => format!("127.0.0.1:{}", free_port()?),
        };
        let mut worker = WorkerProcess::prepare(
            &self.dir.join("worker"),
            listen,
            self.endpoints(),
            &self.dir.join("worker-pki"),
        )?;
        worker.start(&self.bin)?;
        self.worker = Some(worker);
        let client = self.client(
            self.endpoints(),
            Duration::from_millis(STATUS_TIMEOUT_MS),
            Duration::from_millis(STATUS_TIMEOUT_MS),
        )?;
        let id = WorkerId::new(crate::workload::WORKER)
            .map_err(|e| ClusterError::Init(e.to_string()))?;
        let deadline = Instant::now() + Duration::from_millis(WORKER_START_MS_MAX);
        let mut last = String::from("not asked yet");
        while Instant::now() < deadline {
            match client.get_worker(&id, Consistency::Linearizable).await {
                Ok(w) if w.status == WorkerStatus::Alive => return Ok(()),
                Ok(w) => last = format!("status {:?}", w.status),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
        }
        Err(ClusterError::WorkerNotAlive {
            waited_ms: WORKER_START_MS_MAX,
            last,
            log: self
                .worker
                .as_ref()
                .map(|w| w.log_tail(30))
                .unwrap_or_default(),
        })
    }

    pub fn pause_worker(&mut self) -> Result<(), ClusterError> {
        self.worker
            .as_mut()
            .ok_or(ClusterError::NoWorker)?
            .pause()?;
        Ok(())
    }

    pub fn resume_worker(&mut self) -> Result<(), ClusterError> {
        self.worker
            .as_mut()
            .ok_or(ClusterError::NoWorker)?
            .resume()?;
        Ok(())
    }

    /// Starts every node and waits until each answers and a leader is agreed.
    pub async fn start_all(&mut self) -> Result<u64, ClusterError> {
        for id in self.ids() {
            self.start(id)?;
        }
        let deadline = Instant::now() + Duration::from_millis(NODE_START_TIMEOUT_MS);
        for id in self.ids() {
            loop {
                if self.status(id).await.is_ok() {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(
                        self.timeout(format!("node {id} did not answer"), NODE_START_TIMEOUT_MS)
                    );
                }
                tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
            }
        }
        self.wait_for_leader(Duration::from_millis(NODE_START_TIMEOUT_MS))
            .await
    }

    fn timeout(&self, what: String, waited_ms: u64) -> ClusterError {
        ClusterError::Timeout {
            what,
            waited_ms,
            logs: self.logs(20),
        }
    }

    pub fn logs(&self, lines: usize) -> String {
        self.nodes
            .values()
            .map(|n| {
                format!(
                    "--- node {} ({}) ---\n{}",
                    n.spec.id,
                    n.log.display(),
                    n.log_tail(lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// One node's own view (stale: answered without a leader).
    pub async fn status(&self, id: u64) -> Result<ClusterStatus, String> {
        let node = self.nodes.get(&id).ok_or_else(|| format!("no node {id}"))?;
        if !node.is_running() || node.is_paused() {
            return Err(format!("node {id} is not running"));
        }
        self.http
            .with_endpoints(vec![node.url()])
            .cluster_status(Consistency::Stale)
            .await
            .map_err(|e| e.to_string())
    }

    /// The leader named in the highest term any reachable node reports.
    pub async fn leader(&self) -> Option<u64> {
        let mut best: Option<(u64, u64)> = None;
        for id in self.ids() {
            if let Ok(s) = self.status(id).await {
                if let Some(l) = s.leader {
                    if best.is_none_or(|(term, _)| s.term > term) {
                        best = Some((s.term, l));
                    }
                }
            }
        }
        best.map(|(_, l)| l)
    }

    /// Waits until every running node names the same running leader.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<u64, ClusterError> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut seen = Vec::new();
            for (id, n) in &self.nodes {
                if n.is_running() && !n.is_paused() {
                    seen.push(self.status(*id).await.ok().and_then(|s| s.leader));
                }
            }
            if let Some(Some(l)) = seen.first() {
                let agreed = seen.iter().all(|s| s == &Some(*l));
                if agreed
                    && self
                        .nodes
                        .get(l)
                        .is_some_and(|n| n.is_running() && !n.is_paused())
                {
                    return Ok(*l);
                }
            }
            if Instant::now() > deadline {
                return Err(self.timeout("no agreed leader".into(), timeout.as_millis() as u64));
            }
            tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
        }
    }

    /// Waits (up to `timeout`) until every node reports one applied index, then returns each
    /// node's applied index and digest (whatever they are when the time runs out).
    pub async fn final_views(&self, timeout: Duration) -> Vec<NodeFinal> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut views = Vec::new();
            for id in self.ids() {
                views.push(match self.status(id).await {
                    Ok(s) => NodeFinal::answered(id, s),
                    Err(e) => NodeFinal {
                        id,
                        applied: None,
                        digest: None,
                        snapshot: None,
                        purged: None,
                        error: Some(e),
                    },
                });
            }
            let first = views.first().and_then(|v| v.applied);
            let converged = first.is_some() && views.iter().all(|v| v.applied == first);
            if converged || Instant::now() > deadline {
                return views;
            }
            tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
        }
    }

    /// Kills every node (and with the namespaces dropped later, the network goes too).
    pub fn stop_all(&mut self) {
        if let Some(w) = self.worker.as_mut() {
            w.stop();
        }
        for n in self.nodes.values_mut() {
            let _ = n.resume();
            n.kill();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}
