//! A real cluster of `squadron server` processes on loopback, for the end-to-end tests.
//! Each node gets its own config, data directory and log file under a temporary directory.

#![allow(dead_code)]

pub mod browser;
mod browser_net;
mod process_scan;
mod tls;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[allow(unused_imports)]
pub use process_scan::{
    assert_placeholder_holders_lack, memchr_find, memory_holds, memory_holds_within, pids_with_env,
};
use serde_json::{json, Value};
#[allow(unused_imports)]
pub use tls::{pki, presenting};

pub const BIN: &str = env!("CARGO_BIN_EXE_squadron");

/// A free loopback port for a node or worker to bind later, below the kernel's ephemeral
/// range, counting up from this binary's own offset (`squadron_bench::free_port` says why).
pub fn free_port() -> u16 {
    squadron_bench::free_port().expect("a free loopback port")
}

#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub id: u64,
    pub rest: String,
    pub grpc: String,
    pub peer: String,
}

impl NodeSpec {
    /// A node on free loopback ports.
    pub fn loopback(id: u64) -> Self {
        NodeSpec {
            id,
            rest: format!("127.0.0.1:{}", free_port()),
            grpc: format!("127.0.0.1:{}", free_port()),
            peer: format!("127.0.0.1:{}", free_port()),
        }
    }
}

#[derive(Debug)]
pub struct Node {
    pub spec: NodeSpec,
    pub config: PathBuf,
    pub log: PathBuf,
    pub child: Option<Child>,
}

impl Node {
    pub fn url(&self) -> String {
        format!("https://{}", self.spec.rest)
    }
}

/// Knobs a test may turn in every node's config.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub snapshot_after_entries: u64,
    pub keep_entries_after_snapshot: u64,
    pub sweep_interval_ms: u64,
    /// `server.schedule_interval_ms`: the scheduler's tick (commands wake it in between).
    pub schedule_interval_ms: u64,
    /// The nodes' `RUST_LOG`.
    pub log_filter: &'static str,
    /// `server.agent_cert_ttl_ms`: the life of an agent's certificate.
    pub agent_cert_ttl_ms: u64,
    /// `server.leader_wait_ms`.
    pub leader_wait_ms: u64,
    /// TOML appended to every node's configuration (tables after `[server]`).
    pub extra_config: &'static str,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            snapshot_after_entries: 10_000,
            keep_entries_after_snapshot: 1_000,
            sweep_interval_ms: 500,
            schedule_interval_ms: 500,
            log_filter: "info",
            agent_cert_ttl_ms: 24 * 3_600_000,
            leader_wait_ms: 2_000,
            extra_config: "",
        }
    }
}

#[derive(Debug)]
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub nodes: BTreeMap<u64, Node>,
    pub options: ClusterOptions,
}

impl Cluster {
    pub fn start(n: u64) -> Self {
        Self::start_with(n, ClusterOptions::default())
    }

    pub fn start_with(n: u64, options: ClusterOptions) -> Self {
        let mut cluster = Self::configure(n, options);
        for id in 1..=n {
            cluster.start_node(id);
        }
        cluster.wait_for_leader(Duration::from_secs(30));
        cluster
    }

    /// Writes `n` nodes' configurations and certificates, and starts none of them.
    pub fn configure(n: u64, options: ClusterOptions) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let specs: Vec<NodeSpec> = (1..=n).map(NodeSpec::loopback).collect();
        let mut cluster = Cluster {
            dir,
            nodes: BTreeMap::new(),
            options,
        };
        for spec in &specs {
            let node = cluster.write_node(spec.clone(), &specs);
            cluster.nodes.insert(spec.id, node);
        }
        let configs: Vec<PathBuf> = cluster.nodes.values().map(|n| n.config.clone()).collect();
        cluster.init_pki(&configs, &cluster.admin_token_file());
        cluster
    }

    fn write_node(&self, spec: NodeSpec, initial: &[NodeSpec]) -> Node {
        let base = self.dir.path().join(format!("node{}", spec.id));
        std::fs::create_dir_all(&base).expect("node dir");
        let members: String = initial
            .iter()
            .map(|m| {
                format!(
                    "[[initial_members]]\nid = {}\nrest = \"{}\"\ngrpc = \"{}\"\npeer = \"{}\"\n\n",
                    m.id, m.rest, m.grpc, m.peer
                )
            })
            .collect();
        let o = &self.options;
        let text = format!(
            "node_id = {id}\nrest_listen = \"{rest}\"\ngrpc_listen = \"{grpc}\"\npeer_listen = \"{peer}\"\n\
             data_dir = \"data\"\n\n\
             {members}[raft]\nsnapshot_after_entries = {snap}\nmax_in_snapshot_log_to_keep = {keep}\n\n\
             [server]\nsweep_interval_ms = {sweep}\nschedule_interval_ms = {schedule}\n\
             agent_cert_ttl_ms = {agent_ttl}\n\
             leader_wait_ms = {leader_wait}\n\n{extra}",
            id = spec.id,
            rest = spec.rest,
            grpc = spec.grpc,
            peer = spec.peer,
            snap = o.snapshot_after_entries,
            keep = o.keep_entries_after_snapshot,
            sweep = o.sweep_interval_ms,
            schedule = o.schedule_interval_ms,
            agent_ttl = o.agent_cert_ttl_ms,
            leader_wait = o.leader_wait_ms,
            extra = o.extra_config,
        );
        let config = base.join("node.toml");
        std::fs::write(&config, text).expect("config");
        Node {
            spec,
            config,
            log: base.join("node.log"),
            child: None,
        }
    }

    /// Adds a node that is not part of the initial members (to join as a learner).
    pub fn add_node(&mut self) -> u64 {
        let id = self.nodes.keys().max().copied().unwrap_or(0) + 1;
        let node = self.write_node(NodeSpec::loopback(id), &[]);
        let config = node.config.clone();
        self.nodes.insert(id, node);
        // Its certificate from the same CA; the token `init` makes for it stays unused (the
        // cluster's admin token was made when it started).
        let unused = self
            .dir
            .path()
            .join(format!("node{id}"))
            .join("unused.token");
        self.init_pki(&[config], &unused);
        self.start_node(id);
        id
    }

    /// The cluster's first admin token, written by `squadron init`.
    pub fn admin_token_file(&self) -> PathBuf {
        self.dir.path().join("admin.token")
    }

    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.admin_token_file())
            .expect("admin token")
            .trim()
            .to_string()
    }

    /// `squadron init` over `configs` with the process's test CA; every node's REST address
    /// is then known to carry the cluster's admin token.
    fn init_pki(&self, configs: &[PathBuf], token_file: &Path) {
        let pki = pki();
        let mut init = Command::new(BIN);
        init.arg("init")
            .args(configs)
            .arg("--ca-cert")
            .arg(&pki.ca_cert)
            .arg("--ca-key")
            .arg(&pki.ca_key)
            .arg("--admin-token-file")
            .arg(token_file);
        // A joining node takes the cluster's data key, as an operator would hand it over.
        let key = self.dir.path().join("node1/data/pki/data.key");
        if key.exists() {
            init.arg("--data-key").arg(key);
        }
        let out = init.output().expect("squadron init");
        assert!(
            out.status.success(),
            "squadron init: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let token = self.admin_token();
        for n in self.nodes.values() {
            pki.register_token(&n.spec.rest, &token);
        }
    }

    /// A typed client of these REST URLs with the cluster's CA and admin token.
    pub fn client(&self, urls: Vec<String>) -> squadron_client::SquadronClient {
        client(urls)
    }

    pub fn start_node(&mut self, id: u64) {
        let log_filter = self.options.log_filter;
        let node = self.nodes.get_mut(&id).expect("node");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .expect("log");
        let child = Command::new(BIN)
            .args(["server", "--config"])
            .arg(&node.config)
            .env("RUST_LOG", log_filter)
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn squadron server");
        node.child = Some(child);
        wait_until(Duration::from_secs(20), || {
            http_ok(&format!("{}/healthz", node.url()))
        })
        .unwrap_or_else(|_| panic!("node {id} did not start; log:\n{}", tail(&node.log)));
    }

    /// SIGTERM, the node's own shutdown; answers how long it took to exit.
    pub fn terminate(&mut self, id: u64) -> Duration {
        let mut child = self
            .nodes
            .get_mut(&id)
            .and_then(|n| n.child.take())
            .unwrap_or_else(|| panic!("node {id} is not running"));
        let started = Instant::now();
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(sent.success(), "kill -TERM node {id}: {sent}");
        let exited = wait_until(Duration::from_secs(30), || {
            matches!(child.try_wait(), Ok(Some(_)))
        });
        if exited.is_err() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("node {id} did not stop within 30 s of SIGTERM");
        }
        started.elapsed()
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.nodes.get_mut(&id).and_then(|n| n.child.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn url(&self, id: u64) -> String {
        self.nodes[&id].url()
    }

    /// `https://` of node `id`'s peer listener (node certificates only).
    pub fn peer_url(&self, id: u64) -> String {
        format!("https://{}", self.nodes[&id].spec.peer)
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .values()
            .filter(|n| n.child.is_some())
            .map(Node::url)
            .collect()
    }

    pub fn status(&self, id: u64) -> Result<Value, String> {
        http_get(&format!(
            "{}/api/v1/cluster/status?consistency=stale",
            self.url(id)
        ))
    }

    /// Waits until every running node names the same leader, itself running; returns it.
    pub fn wait_for_leader(&self, timeout: Duration) -> u64 {
        let mut leader = 0;
        wait_until(timeout, || {
            let seen: Vec<Option<u64>> = self
                .nodes
                .iter()
                .filter(|(_, n)| n.child.is_some())
                .map(|(id, _)| self.status(*id).ok().and_then(|s| s["leader"].as_u64()))
                .collect();
            match seen.first() {
                Some(Some(l))
                    if seen.iter().all(|s| s == &Some(*l))
                        && self.nodes.get(l).is_some_and(|n| n.child.is_some()) =>
                {
                    leader = *l;
                    true
                }
                _ => false,
            }
        })
        .unwrap_or_else(|_| panic!("no agreed leader; logs:\n{}", self.logs()));
        leader
    }

    /// Waits until every running node applied the same index and reports the same digest.
    pub fn wait_for_equal_digests(&self, timeout: Duration) -> String {
        let mut digest = String::new();
        wait_until(timeout, || {
            let views: Vec<(Option<u64>, String)> = self
                .nodes
                .iter()
                .filter(|(_, n)| n.child.is_some())
                .filter_map(|(id, _)| self.status(*id).ok())
                .map(|s| {
                    (
                        s["applied"].as_u64(),
                        s["digest"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect();
            let running = self.nodes.values().filter(|n| n.child.is_some()).count();
            let equal = views.len() == running && views.windows(2).all(|w| w[0] == w[1]);
            if equal {
                digest = views[0].1.clone();
            }
            equal
        })
        .unwrap_or_else(|_| panic!("digests never converged; logs:\n{}", self.logs()));
        digest
    }

    pub fn logs(&self) -> String {
        self.nodes
            .values()
            .map(|n| format!("--- node {} ---\n{}", n.spec.id, tail(&n.log)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in self.nodes.values_mut() {
            if let Some(mut c) = node.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A task's events once they hold `needle` (or after 10 s, as they are): a driver writes some
/// events — `egress_closed` — after the end it reported is committed.
pub fn task_events_with(url: &str, task: impl std::fmt::Display, needle: &str) -> String {
    let events = || {
        http_text(&format!("{url}/api/v1/tasks/{task}/logs?stream=events"))
            .expect("events")
            .1
    };
    let _ = wait_until(Duration::from_secs(10), || events().contains(needle));
    events()
}

pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> Result<(), ()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(())
}

/// An HTTPS agent trusting the test CA (or the node's own), without a client certificate
/// (an operator).
fn agent_for(url: &str) -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .tls_config(pki().operator_for(url))
        .build()
}

/// An agent presenting the harness's node certificate (a worker's output server admits
/// only nodes).
pub fn node_agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .tls_config(pki().as_node.clone())
        .build()
}

/// A request with the admin token of the cluster `url` belongs to, as every client sends.
pub fn request(method: &str, url: &str) -> ureq::Request {
    let req = agent_for(url).request(method, url);
    match pki().token_for(url) {
        Some(t) => req.set("Authorization", &format!("Bearer {t}")),
        None => req,
    }
}

/// The `squadron` CLI as an operator of the cluster at `url` runs it: the test CA in
/// `SQUADRON_CACERT`, the cluster's admin token in `SQUADRON_TOKEN`.
pub fn cli(url: &str) -> Command {
    let mut command = Command::new(BIN);
    command.env("SQUADRON_CACERT", &pki().ca_cert);
    if let Some(t) = pki().token_for(url) {
        command.env("SQUADRON_TOKEN", t);
    }
    command
}

/// A typed client of REST URLs with the test CA and their cluster's admin token.
pub fn client(urls: Vec<String>) -> squadron_client::SquadronClient {
    client_with_timeouts(
        urls,
        squadron_client::REQUEST_TIMEOUT_DEFAULT,
        squadron_client::CONNECT_TIMEOUT_DEFAULT,
    )
}

pub fn client_with_timeouts(
    urls: Vec<String>,
    request: Duration,
    connect: Duration,
) -> squadron_client::SquadronClient {
    let credentials = pki().operator_credentials(urls.first().map_or("", String::as_str));
    squadron_client::SquadronClient::secured_with_timeouts(urls, &credentials, request, connect)
        .expect("client")
}

/// True when a GET answers 2xx, whatever the body.
pub fn http_ok(url: &str) -> bool {
    request("GET", url).call().is_ok()
}

/// GET a JSON document; Err carries status and body for non-2xx.
pub fn http_get(url: &str) -> Result<Value, String> {
    match request("GET", url).call() {
        Ok(r) => r.into_json().map_err(|e| e.to_string()),
        Err(ureq::Error::Status(code, r)) => {
            Err(format!("{code} {}", r.into_string().unwrap_or_default()))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The answer of a write: status and JSON body.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    pub fn ok(&self) -> bool {
        self.status == 200
    }
}

pub fn http_send(
    method: &str,
    url: &str,
    body: Option<Value>,
    key: Option<&str>,
) -> Result<Reply, String> {
    let mut req = request(method, url);
    if let Some(k) = key {
        req = req.set("Idempotency-Key", k);
    }
    let res = match body {
        Some(b) => req.send_json(b),
        None => req.call(),
    };
    reply(res)
}

/// A request with the headers a browser (or an attacker's page) would add, and a raw body
/// sent with the content type given.
pub fn http_send_raw(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<(&str, &str)>,
) -> Result<Reply, String> {
    let mut req = request(method, url);
    for (name, value) in headers {
        req = req.set(name, value);
    }
    let res = match body {
        Some((content_type, text)) => req.set("Content-Type", content_type).send_string(text),
        None => req.call(),
    };
    reply(res)
}

pub fn post(url: &str, body: Value) -> Result<Reply, String> {
    http_send("POST", url, Some(body), None)
}

/// A POST as worker `worker` sends it: its certificate, no bearer token (reports,
/// registrations and heartbeats are a worker's own; an operator's token is refused).
pub fn worker_post(worker: &str, url: &str, body: Value) -> Result<Reply, String> {
    let id = squadron_pki::SpiffeId::Worker(squadron_core::ids::WorkerId::new(worker).expect("id"));
    reply(
        agent_with(pki().presenting_id(&id))
            .post(url)
            .send_json(body),
    )
}

/// An agent with a client configuration of the test's choosing.
pub fn agent_with(config: std::sync::Arc<rustls::ClientConfig>) -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .tls_config(config)
        .build()
}

/// A POST to a peer listener, presenting the harness's node certificate.
pub fn peer_post(url: &str, body: Value) -> Result<Reply, String> {
    reply(node_agent().post(url).send_json(body))
}

pub fn reply(res: Result<ureq::Response, ureq::Error>) -> Result<Reply, String> {
    match res {
        Ok(r) => Ok(Reply {
            status: r.status(),
            body: r.into_json().unwrap_or(Value::Null),
        }),
        Err(ureq::Error::Status(code, r)) => Ok(Reply {
            status: code,
            body: r.into_json().unwrap_or(Value::Null),
        }),
        Err(e) => Err(e.to_string()),
    }
}

/// Credentials of worker `id` (a certificate issued by the test CA into `dir`).
pub fn worker_credentials(id: &str, dir: &Path) -> squadron_client::Credentials {
    squadron_client::Credentials::identity(pki().issue_worker(id, dir))
}

/// A WebSocket over TLS (`wss://`) with the test CA and the cluster's admin token.
pub fn websocket(
    url: &str,
) -> (
    tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
    tungstenite::handshake::client::Response,
) {
    use tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().expect("ws request");
    let https = url.replacen("wss://", "https://", 1);
    if let Some(t) = pki().token_for(&https) {
        request.headers_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("header"),
        );
    }
    let uri = request.uri().clone();
    let host = uri.host().expect("host");
    let port = uri.port_u16().unwrap_or(443);
    let tcp = std::net::TcpStream::connect((host, port)).expect("connect");
    tungstenite::client_tls_with_config(
        request,
        tcp,
        None,
        Some(tungstenite::Connector::Rustls(pki().operator.clone())),
    )
    .expect("websocket")
}

/// Sets up a project with a sandbox on a registered worker and `profiles` profiles; returns
/// the profile ids.
pub fn setup_project(url: &str, project: &str, profiles: usize, max_active: u32) -> Vec<u64> {
    let r = worker_post(
        "w1",
        &format!("{url}/api/v1/workers"),
        json!({
            "worker": "w1", "address": "127.0.0.1:1", "runtimes": ["process"], "capacity": 8,
            "heartbeat_interval_ms": 600000
        }),
    )
    .expect("register");
    assert!(r.ok(), "{r:?}");
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({
            "tenant": "acme", "project": project, "max_profiles": profiles, "max_active": max_active
        }),
    )
    .expect("project");
    assert!(r.ok(), "{r:?}");
    let r = post(
        &format!("{url}/api/v1/projects/acme/{project}/sandbox"),
        json!({
            "worker": "w1", "runtime": "process", "sandbox_ref": format!("sb-{project}")
        }),
    )
    .expect("sandbox");
    assert!(r.ok(), "{r:?}");
    (0..profiles)
        .map(|i| {
            let r = post(
                &format!("{url}/api/v1/projects/acme/{project}/profiles"),
                json!({
                    "key": format!("agent-{i}"), "providers": ["codex", "claude"]
                }),
            )
            .expect("profile");
            assert!(r.ok(), "{r:?}");
            r.body["profile_created"]["profile"]
                .as_u64()
                .expect("profile id")
        })
        .collect()
}

pub fn acquire_body(expected_generation: u64) -> Value {
    json!({
        "expected_generation": expected_generation,
        "provider": "codex",
        "holder": {"worker": "w1", "process": "test", "cgroup": null},
        "ttl_ms": 60000
    })
}

/// A `squadron worker` process of a test cluster.
#[derive(Debug)]
pub struct WorkerProc {
    pub id: String,
    pub data_dir: PathBuf,
    pub listen: String,
    pub log: PathBuf,
    pub control: Vec<String>,
    pub runtimes: String,
    /// Further `squadron worker` flags.
    pub extra_args: Vec<String>,
    /// Further environment variables of the worker process.
    pub extra_env: Vec<(String, String)>,
    pub child: Option<Child>,
}

impl WorkerProc {
    /// Starts a worker with a 1 s heartbeat and no retry delays, and waits until the control
    /// plane lists it alive.
    pub fn start(dir: &Path, id: &str, control: Vec<String>, runtimes: &str) -> Self {
        Self::start_with(dir, id, control, runtimes, Vec::new())
    }

    /// `start` with further `squadron worker` flags.
    pub fn start_with(
        dir: &Path,
        id: &str,
        control: Vec<String>,
        runtimes: &str,
        extra_args: Vec<String>,
    ) -> Self {
        Self::start_with_env(dir, id, control, runtimes, extra_args, Vec::new())
    }

    /// `start_with` and further environment variables.
    pub fn start_with_env(
        dir: &Path,
        id: &str,
        control: Vec<String>,
        runtimes: &str,
        extra_args: Vec<String>,
        extra_env: Vec<(String, String)>,
    ) -> Self {
        let base = dir.join(format!("worker-{id}"));
        std::fs::create_dir_all(&base).expect("worker dir");
        pki().issue_worker(id, &base.join("pki"));
        let mut w = WorkerProc {
            id: id.to_string(),
            data_dir: base.join("data"),
            listen: format!("127.0.0.1:{}", free_port()),
            log: base.join("worker.log"),
            control,
            runtimes: runtimes.to_string(),
            extra_args,
            extra_env,
            child: None,
        };
        w.spawn();
        w
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        let child = Command::new(BIN)
            .args(["worker", "--id", &self.id, "--data-dir"])
            .arg(&self.data_dir)
            .args(["--listen", &self.listen, "--runtimes", &self.runtimes])
            // A test that gives its own heartbeat interval states it itself.
            .args(
                (!self
                    .extra_args
                    .iter()
                    .any(|a| a == "--heartbeat-interval-ms"))
                .then_some(["--heartbeat-interval-ms", "1000"])
                .into_iter()
                .flatten(),
            )
            .args(["--backoff-override-ms", "50"])
            .args(["--control", &self.control.join(",")])
            .arg("--cert-dir")
            .arg(self.data_dir.parent().expect("worker base").join("pki"))
            .args(&self.extra_args)
            // The tests' repositories are local ones they make; a test that gives its own
            // --policy states everything itself.
            .args(
                (!self.extra_args.iter().any(|a| a == "--policy"))
                    .then_some("--allow-local-repositories"),
            )
            .env("RUST_LOG", "info,squadron_worker=debug")
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            // Not on the allowlist: a sandbox must never see it.
            .env("SQUADRON_TEST_SECRET", "leaked")
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn squadron worker");
        self.child = Some(child);
        let url = format!("{}/api/v1/workers/{}", self.control[0], self.id);
        let listen = self.listen.clone();
        wait_until(Duration::from_secs(30), || {
            node_agent()
                .get(&format!("https://{listen}/healthz"))
                .call()
                .is_ok()
                && http_get(&url).is_ok_and(|w| w["status"] == "alive")
        })
        .unwrap_or_else(|_| {
            panic!(
                "worker {} did not start; log:\n{}",
                self.id,
                tail(&self.log)
            )
        });
    }

    /// SIGTERM, as a service manager stops it; waits up to 30 s for the exit.
    pub fn terminate(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(sent.success(), "kill -TERM worker {}: {sent}", self.id);
        let exited = wait_until(Duration::from_secs(30), || {
            matches!(child.try_wait(), Ok(Some(_)))
        });
        if exited.is_err() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("worker {} did not stop within 30 s of SIGTERM", self.id);
        }
    }

    /// SIGKILL: sandboxes keep running, as after a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn task_dir(&self, task: u64) -> PathBuf {
        self.data_dir.join("tasks").join(task.to_string())
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        // A failing test's message says what it waited for; the worker's last lines say why
        // it never came (CI keeps nothing but the test's output).
        if std::thread::panicking() {
            eprintln!("worker {} log, last lines:\n{}", self.id, tail(&self.log));
            print_guest_consoles(&self.data_dir);
        }
        self.kill();
        self.remove_leftovers();
    }
}

impl WorkerProc {
    /// Removes what a preserved failure keeps on purpose (containers, empty cgroup leaves),
    /// so test runs leave nothing behind.
    pub fn remove_leftovers(&self) {
        remove_worker_leftovers(&self.id, &self.data_dir);
    }
}

/// The KVM runtime's files of this data directory (they hold a link to the worker binary).
fn remove_kvm_files_of(data_dir: &Path) {
    for dir in kvm_dirs_of(data_dir) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The KVM runtime's directories whose owner file names this data directory.
pub fn kvm_dirs_of(data_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/var/lib/squadron/vm/workers") else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|dir| {
            std::fs::read(dir.join("data-dir")).unwrap_or_default()
                == data_dir.as_os_str().as_encoded_bytes()
        })
        .collect()
}

/// The QEMU processes of this data directory's KVM runtime's guests (each one's command line
/// names its console log, under the runtime's directory).
pub fn qemu_pids_of(data_dir: &Path) -> Vec<u32> {
    let dirs: Vec<String> = kvm_dirs_of(data_dir)
        .iter()
        .map(|d| format!("{}/", d.display()))
        .collect();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        let qemu = cmdline
            .split('\0')
            .next()
            .is_some_and(|program| program.contains("qemu-system"));
        if qemu && dirs.iter().any(|d| cmdline.contains(d)) {
            pids.push(pid);
        }
    }
    pids
}

/// The last lines of each guest console of this data directory's KVM runtime.
fn print_guest_consoles(data_dir: &Path) {
    for dir in kvm_dirs_of(data_dir) {
        for domain in std::fs::read_dir(dir.join("domains"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let console = domain.path().join("vm-console.log");
            eprintln!(
                "guest console {}, last lines:\n{}",
                console.display(),
                tail(&console)
            );
        }
    }
}

/// Powers off and undefines the KVM runtime's domains whose task directory is under `tasks`.
fn remove_domains_under(tasks: &Path) {
    let virsh = |args: &[&str]| {
        Command::new("virsh")
            .args(["-c", "qemu:///system"])
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    for name in virsh(&["list", "--all", "--name"]).lines() {
        if !name.starts_with("squadron-task-") {
            continue;
        }
        let meta = virsh(&["metadata", name, "https://squadron.dev/xmlns/attempt/1"]);
        let tasks = tasks.to_string_lossy();
        if meta.contains(&format!("dir=\"{tasks}/")) {
            virsh(&["destroy", name]);
            virsh(&["undefine", "--nvram", name]);
        }
    }
}

/// Removes what worker `id` with its data in `data_dir` left behind: its containers, its
/// cgroup subtree (killed first) and its sandboxes' networks.
pub fn remove_worker_leftovers(id: &str, data_dir: &Path) {
    let tasks = data_dir.join("tasks");
    // Domains first: their virtiofs daemons hold the task volumes.
    remove_domains_under(&tasks);
    remove_kvm_files_of(data_dir);
    unmount_beneath(&tasks);
    if let Ok(out) = Command::new("docker")
        .args(["ps", "-a", "--filter", "label=squadron.managed=true"])
        .args(["--format", "{{.ID}} {{.Label \"squadron.task-dir\"}}"])
        .output()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((container, dir)) = line.split_once(' ') {
                if Path::new(dir).starts_with(&tasks) {
                    let _ = Command::new("docker")
                        .args(["rm", "-f", container])
                        .output();
                }
            }
        }
    }
    // Warm containers carry the worker's label, not a task directory's.
    if let Ok(out) = Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            &format!("label=squadron.worker={id}"),
        ])
        .args([
            "--filter",
            "label=squadron.pool-slot",
            "--format",
            "{{.ID}}",
        ])
        .output()
    {
        for container in String::from_utf8_lossy(&out.stdout).lines() {
            let _ = Command::new("docker")
                .args(["rm", "-f", container])
                .output();
        }
    }
    for root in [
        "/sys/fs/cgroup/unified/squadron",
        "/sys/fs/cgroup/squadron",
        "/sys/fs/cgroup/memory/squadron",
        "/sys/fs/cgroup/pids/squadron",
        "/sys/fs/cgroup/cpu/squadron",
    ] {
        let dir = Path::new(root).join(id);
        // A test that failed midway leaves providers running: kill the worker's whole
        // subtree (cgroup v2) and let it empty before removing it.
        if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
            let _ = wait_until(Duration::from_secs(5), || {
                std::fs::read_to_string(dir.join("cgroup.events"))
                    .map_or(true, |e| e.contains("populated 0"))
            });
        }
        remove_empty_dirs(&dir);
    }
    unmount_beneath(data_dir);
    // With the subtree gone no process is in the worker's namespaces: the sweep takes all.
    let network = squadron_isolation::NetworkConfig::new(id);
    let _ = squadron_isolation::SandboxNetwork::sweep(&network);
    // The KVM runtime's guest networks carry a tag of their own; its domains are gone.
    let guests = squadron_isolation::NetworkConfig::new(&format!("{id}/kvm"));
    let _ = squadron_isolation::SandboxNetwork::sweep(&guests);
    // The Docker runtime's managed network and its filter live as long as the worker's id.
    let _ = Command::new("docker")
        .args(["network", "rm", &format!("squadron-{}", network.owner)])
        .output();
    let _ = squadron_isolation::EgressFilter::remove(
        &network.nft,
        &format!("sq_{}_docker", network.owner),
    );
}

/// Detaches whatever is still mounted beneath `dir`: the disk-quota volumes of `tasks/` (a
/// preserved failure keeps its volume; a killed worker leaves its running tasks') and the
/// agent generations' credential tmpfs a killed worker left, so no mount outlives a test.
fn unmount_beneath(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    // Mount points are listed by their real paths.
    let dir = &std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    for line in mounts.lines() {
        let Some(point) = line.split(' ').nth(4) else {
            continue;
        };
        if Path::new(point).starts_with(dir) {
            let _ = Command::new("umount").args(["-l", point]).output();
        }
    }
}

/// Removes a cgroup directory tree from the leaves up (cgroups are removed with rmdir).
fn remove_empty_dirs(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_dirs(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// A worker id unique to this test process, so leftovers of another run never match.
/// A one-node cluster, a git repository to clone, and a process worker that runs `provider` as
/// both "codex" and "claude" (`script_provider_args`).
pub fn script_agent_world(
    worker_prefix: &str,
    provider: &str,
    lease_ttl_ms: u64,
    stop_grace_ms: u64,
) -> (Cluster, PathBuf, WorkerProc) {
    script_agent_world_with(worker_prefix, provider, lease_ttl_ms, stop_grace_ms, &[])
}

/// [`script_agent_world`] with further worker flags.
pub fn script_agent_world_with(
    worker_prefix: &str,
    provider: &str,
    lease_ttl_ms: u64,
    stop_grace_ms: u64,
    extra: &[&str],
) -> (Cluster, PathBuf, WorkerProc) {
    let mut args = Vec::new();
    let cluster = Cluster::start(1);
    cluster.wait_for_leader(Duration::from_secs(30));
    let dir = cluster.dir.path().to_path_buf();
    let repo = git_repo(&dir);
    let script = dir.join("provider.sh");
    std::fs::write(&script, provider).expect("provider script");
    args.extend(script_provider_args(&script, lease_ttl_ms, stop_grace_ms));
    args.extend(extra.iter().map(|a| a.to_string()));
    let worker = WorkerProc::start_with(
        &dir,
        &unique_worker_id(worker_prefix),
        cluster.urls(),
        "process",
        args,
    );
    (cluster, repo, worker)
}

/// Worker flags that run `script` as both "codex" and "claude", with the agents' lease TTL and
/// stop grace.
pub fn script_provider_args(script: &Path, lease_ttl_ms: u64, stop_grace_ms: u64) -> Vec<String> {
    vec![
        "--provider-script".into(),
        format!("codex={}", script.display()),
        "--provider-script".into(),
        format!("claude={}", script.display()),
        "--agent-lease-ttl-ms".into(),
        lease_ttl_ms.to_string(),
        "--agent-stop-grace-ms".into(),
        stop_grace_ms.to_string(),
    ]
}

/// A worker offering `kvm` under software emulation, `capacity` guests at once: as many as
/// there are cores (CI has 2) — four starved the cluster's own heartbeats into elections —,
/// and heartbeats 5 s apart (lost after 15 s): at 1 s, a loaded CI machine's gap of 3 s had
/// the worker declared lost and its tasks requeued while their guests still ran.
pub fn kvm_worker(cluster: &Cluster, prefix: &str, capacity: u32) -> WorkerProc {
    WorkerProc::start_with(
        cluster.dir.path(),
        &unique_worker_id(prefix),
        cluster.urls(),
        "kvm",
        kvm_worker_args(capacity),
    )
}

/// The flags of `kvm_worker`.
pub fn kvm_worker_args(capacity: u32) -> Vec<String> {
    vec![
        "--vm-domain-type".into(),
        "qemu".into(),
        "--capacity".into(),
        capacity.to_string(),
        "--heartbeat-interval-ms".into(),
        "5000".into(),
    ]
}

pub fn unique_worker_id(prefix: &str) -> String {
    format!("{prefix}-{}", std::process::id())
}

/// Runs git in `dir`, asserting success; returns trimmed stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A git repository with a few committed files, one of them binary, made by the test.
pub fn git_repo(dir: &Path) -> PathBuf {
    let repo = dir.join("repo");
    std::fs::create_dir_all(repo.join("src")).expect("repo dir");
    std::fs::write(repo.join("README.md"), "# demo\n").expect("write");
    std::fs::write(repo.join("src/lib.txt"), "one\ntwo\n").expect("write");
    std::fs::write(repo.join("logo.bin"), [0u8, 1, 2, 255, 0, 7]).expect("write");
    std::fs::write(repo.join(".gitignore"), "ignored/\n").expect("write");
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["config", "user.email", "test@example.invalid"],
        &["config", "user.name", "Test"],
        &["add", "-A"],
        &["commit", "-q", "-m", "initial"],
    ] {
        git(&repo, args);
    }
    repo
}

/// An operator token made by the cluster's admin: `role`, limited to `scope` (`[]`: none);
/// its secret.
pub fn operator_token(url: &str, name: &str, role: &str, scope: Value) -> String {
    let r = post(
        &format!("{url}/api/v1/tokens"),
        json!({"name": name, "role": role, "scope": scope}),
    )
    .expect("create token");
    assert!(r.ok(), "{r:?}");
    r.body["token"].as_str().expect("secret").to_string()
}

/// Submits a YAML manifest.
/// A task manifest that needs nothing to exist (its repository is never cloned unless a
/// worker picks it up): for tests about submission, waiting and access, not running.
pub fn inert_manifest(name: &str, runtime: &str) -> String {
    format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: {name}\nrepository:\n  url: /tmp/no-repo\n  \
         branch: main\nagent:\n  prompt: probe\n  provider: script\n  script: |\n    true\nvm:\n  \
         runtime: {runtime}\n"
    )
}

pub fn submit_yaml(url: &str, yaml: &str) -> Reply {
    let res = request("POST", &format!("{url}/api/v1/tasks"))
        .set("Content-Type", "application/yaml")
        .send_string(yaml);
    match res {
        Ok(r) => Reply {
            status: r.status(),
            body: r.into_json().unwrap_or(Value::Null),
        },
        Err(ureq::Error::Status(code, r)) => Reply {
            status: code,
            body: r.into_json().unwrap_or(Value::Null),
        },
        Err(e) => panic!("submit: {e}"),
    }
}

/// Waits until the task is in one of `states`; returns it.
pub fn wait_task_state(url: &str, id: u64, states: &[&str], timeout: Duration) -> Value {
    let mut last = Value::Null;
    let found = wait_until(timeout, || {
        if let Ok(t) = http_get(&format!("{url}/api/v1/tasks/{id}")) {
            let hit = states.iter().any(|s| t["state"] == *s);
            last = t;
            return hit;
        }
        false
    });
    assert!(
        found.is_ok(),
        "task {id} never reached {states:?}; last seen: {last:#}"
    );
    last
}

/// Plain-text GET (logs, artifacts).
pub fn http_text(url: &str) -> Result<(u16, String), String> {
    match request("GET", url).call() {
        Ok(r) => {
            let status = r.status();
            Ok((status, r.into_string().unwrap_or_default()))
        }
        Err(ureq::Error::Status(code, r)) => Ok((code, r.into_string().unwrap_or_default())),
        Err(e) => Err(e.to_string()),
    }
}

/// The process behind `log` wrote its log as JSON lines (`--log-format auto` for servers and
/// workers): no line in the text format, and one object whose message is `message` — waited
/// for up to 10 s, since a process may log an event a moment after the API shows it (a worker
/// logs "worker registered" once the call that registered it returned).
pub fn assert_json_log(log: &Path, message: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !json_log_says(log, message) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = std::fs::read_to_string(log).expect("log");
    let mut found = false;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Value>(line) {
            Ok(v) => {
                assert!(
                    v["level"].is_string() && v["timestamp"].is_string(),
                    "{line}"
                );
                found |= v["fields"]["message"] == message;
            }
            Err(_) => assert!(
                !(line.contains(" INFO ") || line.contains(" WARN ") || line.contains(" ERROR ")),
                "a text log line in {}: {line}",
                log.display()
            ),
        }
    }
    assert!(
        found,
        "no JSON line saying {message:?} in {}:\n{text}",
        log.display()
    );
}

/// Whether `log` holds a JSON line whose message is `message` yet.
fn json_log_says(log: &Path, message: &str) -> bool {
    std::fs::read_to_string(log).is_ok_and(|text| {
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .any(|v| v["fields"]["message"] == message)
    })
}

/// `squadron credential put ID --from-file -` as the cluster's admin, the value on stdin.
pub fn put_credential(url: &str, id: &str, value: &str) {
    use std::io::Write as _;
    let mut child = cli(url)
        .args([
            "--endpoint",
            url,
            "credential",
            "put",
            id,
            "--from-file",
            "-",
        ])
        .args(["--description", "CI key"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("squadron credential put");
    // With a trailing newline, as `echo` writes it: the CLI drops it.
    writeln!(child.stdin.take().expect("stdin"), "{value}").expect("write value");
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "credential put: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every file below `dir`, read whole, holds no `needle`; directories named `skip` are not
/// entered. Something must have been scanned.
pub fn assert_no_bytes_below(dir: &Path, needle: &[u8], what: &str, skip: &str) {
    let mut stack = vec![dir.to_path_buf()];
    let mut files = 0;
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() && e.file_name() != skip {
                stack.push(path);
            } else if meta.is_file() {
                assert!(
                    !file_holds(&path, needle),
                    "{what}: {} holds the secret",
                    path.display()
                );
                files += 1;
            }
        }
    }
    assert!(files > 0, "{what}: nothing scanned under {}", dir.display());
}

/// Whether `needle` is in the file, read piece by piece through its data only: a sparse disk
/// image (a project's volume is 20 GiB) is read by its written extents, never whole.
pub fn file_holds(path: &Path, needle: &[u8]) -> bool {
    use rustix::fs::{seek, SeekFrom};
    use std::io::{Read, Seek};
    const PIECE_BYTES: usize = 8 << 20;
    // A file that cannot be read is a scan that did not happen: that fails, never "clean".
    // One removed since it was listed (a node compacting its store) holds nothing.
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return false,
        Err(e) => panic!("cannot scan {}: {e}", path.display()),
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let finder = memchr::memmem::Finder::new(needle);
    let mut piece = vec![0u8; PIECE_BYTES + needle.len()];
    let mut offset = 0u64;
    while offset < len {
        // No data past `offset` (ENXIO): the rest is a hole.
        let start = match seek(&file, SeekFrom::Data(offset)) {
            Ok(start) => start,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => panic!("cannot scan {}: {e}", path.display()),
        };
        let end = seek(&file, SeekFrom::Hole(start)).unwrap_or(len).min(len);
        file.seek(std::io::SeekFrom::Start(start)).expect("seek");
        // Pieces overlap by the needle's length less one, so none is split unseen.
        let mut kept = 0usize;
        let mut at = start;
        while at < end {
            let want = usize::try_from(end - at).map_or(PIECE_BYTES, |n| n.min(PIECE_BYTES));
            let read = match file.read(&mut piece[kept..kept + want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => panic!("cannot scan {}: {e}", path.display()),
            };
            if finder.find(&piece[..kept + read]).is_some() {
                return true;
            }
            at += read as u64;
            let tail = (kept + read).min(needle.len().saturating_sub(1));
            piece.copy_within(kept + read - tail..kept + read, 0);
            kept = tail;
        }
        offset = end;
    }
    false
}

/// No process's command line holds `needle`; returns how many were read.
pub fn assert_no_cmdline_holds(needle: &[u8]) -> usize {
    let mut seen = 0;
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) {
            seen += 1;
            assert!(
                !cmdline.windows(needle.len()).any(|w| w == needle),
                "/proc/{}/cmdline holds the secret: {}",
                e.file_name().to_string_lossy(),
                String::from_utf8_lossy(&cmdline)
            );
        }
    }
    seen
}

/// A multi-threaded tokio runtime for a test's client calls.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A worker's metrics (OpenMetrics), relayed by the node at `url`.
pub fn worker_metrics(url: &str, worker: &str) -> String {
    let (status, text) =
        http_text(&format!("{url}/api/v1/workers/{worker}/metrics")).expect("worker metrics");
    assert_eq!(status, 200, "{text}");
    text
}

/// The value of the sample whose line starts with `prefix` (name and labels).
pub fn metric_sample(metrics: &str, prefix: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {prefix} in:\n{metrics}"))
}

/// The Docker warm pool's claims of `result` (hit, miss, ineligible) in a worker's metrics.
pub fn docker_pool_claims(metrics: &str, result: &str) -> u64 {
    metric_sample(
        metrics,
        &format!(
            "squadron_worker_sandbox_pool_claims_total{{runtime=\"docker\",result=\"{result}\"}}"
        ),
    )
}
