//! A scripted stand-in for a model provider's API, for running the real Claude Code and Codex
//! CLIs offline: it speaks enough of the Anthropic Messages API (`POST /v1/messages`, streamed
//! as server-sent events or answered whole) and of the OpenAI Responses API (`POST
//! /v1/responses`, streamed; `responses.rs`) to drive each CLI through a script of tool calls
//! and a final answer, and records every request so a test can assert what the CLI sent.
//!
//! It listens inside a network namespace the test made (`TestNet`), which a sandbox reaches
//! through its `outbound` egress like any address on the internet; the host's own addresses
//! and loopback are closed to sandboxes.
//!
//! Which step answers a request: the number of assistant turns already in the request's
//! `messages`; a tool's input may name `{cwd}`, the directory the CLI said it works in. A
//! request without tools (the CLI's side calls: titles, summaries) gets a short
//! text answer and does not move the script.

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// The port the model server listens on inside its namespace.
pub const MODEL_PORT: u16 = 8080;
/// Largest request body recorded.
const REQUEST_BYTES_MAX: usize = 16 * 1024 * 1024;

/// One step of a script: what the model answers at that turn. Inputs may name `{cwd}`, the
/// working directory the CLI told the model in its system prompt.
#[derive(Debug, Clone)]
pub enum Step {
    Tool {
        name: &'static str,
        input: Value,
    },
    Text(&'static str),
    /// No answer for [`HOLD_FOR`]: the CLI waits on the model (and so keeps running) until it
    /// is stopped. Only a conversation's first request at this turn waits; a later one of the
    /// same conversation (resumed by the next generation) is answered with the next step.
    /// Each conversation holds on its own, so several CLIs can share one server.
    Hold,
}

/// How long a [`Step::Hold`] keeps its request waiting.
pub const HOLD_FOR: Duration = Duration::from_secs(600);

/// One request as the CLI sent it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The system prompt's text, whether given as a string or as blocks.
    pub fn system_text(&self) -> String {
        text_of(&self.body["system"])
    }

    /// The system prompt and every text block of the messages.
    pub fn all_text(&self) -> String {
        let messages = self.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        format!("{}\n{}", self.system_text(), contents_text(&messages))
    }

    pub fn tool_names(&self) -> Vec<String> {
        self.body["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The whole request body as JSON text (either API: a resumed conversation's history is
    /// in `messages` or `input`).
    pub fn raw(&self) -> String {
        self.body.to_string()
    }

    /// What names the conversation: the text of its opening messages, before the model's
    /// first turn (Messages API: `messages`; Responses API: `input`). A resumed conversation
    /// opens the same; another CLI's, or another prompt's, does not.
    pub fn conversation(&self) -> String {
        let items = self.body["messages"]
            .as_array()
            .or_else(|| self.body["input"].as_array())
            .cloned()
            .unwrap_or_default();
        let opening: Vec<Value> = items
            .into_iter()
            .take_while(|i| matches!(i["role"].as_str(), Some("user" | "developer" | "system")))
            .collect();
        contents_text(&opening)
    }

    pub fn is_main_loop(&self) -> bool {
        self.body["tools"].as_array().is_some_and(|t| !t.is_empty())
    }
}

mod responses;

#[derive(Clone)]
struct Shared {
    script: Arc<Vec<Step>>,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    /// The (conversation, turn) pairs whose [`Step::Hold`] has held once already: each
    /// conversation holds once at that turn, however many CLIs share the server.
    held: Arc<Mutex<std::collections::BTreeSet<(String, usize)>>>,
}

impl Shared {
    /// The step that answers `request` at `turn` (the model turns already in it), after the
    /// wait of a hold: a hold waits once per conversation; a later request of that
    /// conversation at the same turn (the next generation resuming it) gets the step after it.
    async fn step(&self, request: &Recorded, turn: usize) -> Step {
        let step = |t: usize| {
            self.script
                .get(t)
                .cloned()
                .unwrap_or(Step::Text("The script is over."))
        };
        let here = step(turn);
        if !matches!(here, Step::Hold) {
            return here;
        }
        let first = self
            .held
            .lock()
            .expect("held")
            .insert((request.conversation(), turn));
        if first {
            tokio::time::sleep(HOLD_FOR).await;
            return Step::Hold;
        }
        step(turn + 1)
    }
}

/// A running model server; stopped on drop.
pub struct ModelServer {
    pub url: String,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl ModelServer {
    /// Serves `script` on `listener` (already bound, in whichever namespace).
    pub fn start(listener: std::net::TcpListener, script: Vec<Step>) -> Self {
        Self::serve(listener, script, None)
    }

    /// Serves `script` over TLS, with a certificate for the listener's address from `ca`
    /// (what an upstream behind egress injection looks like: https only).
    pub fn start_tls(
        listener: std::net::TcpListener,
        script: Vec<Step>,
        ca: &squadron_pki::ClusterCa,
    ) -> Self {
        use squadron_pki::{
            server_config, CertUse, ClientAuth, ClusterTrust, ReloadableCert, SpiffeId, SubjectName,
        };
        let addr = listener.local_addr().expect("local addr");
        let trust = ClusterTrust::from_ca_pem(ca.cert_pem()).expect("trust");
        let leaf = ca
            .issue(
                &SpiffeId::Node(1),
                &[SubjectName::Ip(addr.ip())],
                Duration::from_secs(3600),
                CertUse::ServerAndClient,
            )
            .expect("model server certificate");
        let cert = ReloadableCert::new(&trust, &leaf).expect("certificate");
        let config = server_config(&trust, &cert, ClientAuth::Optional).expect("TLS config");
        Self::serve(listener, script, Some(config))
    }

    /// The server itself, plain or (with `tls`) over TLS.
    fn serve(
        listener: std::net::TcpListener,
        script: Vec<Step>,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Self {
        let addr = listener.local_addr().expect("local addr");
        listener.set_nonblocking(true).expect("nonblocking");
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let shared = Shared {
            script: Arc::new(script),
            recorded: recorded.clone(),
            held: Arc::default(),
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let scheme = if tls.is_some() { "https" } else { "http" };
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let app = axum::Router::new()
                .fallback(answer)
                .layer(axum::extract::DefaultBodyLimit::max(REQUEST_BYTES_MAX))
                .with_state(shared);
            match tls {
                Some(config) => {
                    squadron_pki::serve_tls(
                        listener,
                        config,
                        app,
                        std::future::pending(),
                        Default::default(),
                    )
                    .await
                }
                None => axum::serve(listener, app).await.expect("serve"),
            }
        });
        ModelServer {
            url: format!("{scheme}://{addr}"),
            recorded,
            runtime: Some(runtime),
        }
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.recorded.lock().expect("recorded").clone()
    }

    /// The requests of the CLI's agent loop (those that offered tools).
    pub fn main_loop(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(Recorded::is_main_loop)
            .collect()
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

async fn answer(
    State(shared): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let recorded = Recorded {
        method: method.to_string(),
        path: uri.path().to_string(),
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
        body,
    };
    shared
        .recorded
        .lock()
        .expect("recorded")
        .push(recorded.clone());
    if method == Method::POST && recorded.path.ends_with("/responses") {
        let step = shared.step(&recorded, responses::turn_of(&recorded)).await;
        return responses::answer(&step, &recorded);
    }
    if method != Method::POST || !recorded.path.ends_with("/v1/messages") {
        // Anything else the CLI may ask (token counts, a probe): an empty success.
        return (StatusCode::OK, axum::Json(json!({"input_tokens": 1}))).into_response();
    }
    let step = if recorded.is_main_loop() {
        let turn = recorded.body["messages"]
            .as_array()
            .map(|m| m.iter().filter(|m| m["role"] == "assistant").count())
            .unwrap_or(0);
        shared.step(&recorded, turn).await
    } else {
        Step::Text("ok")
    };
    let cwd = working_directory(&recorded.all_text());
    let message = message_of(&recorded.body, &step, &cwd);
    if recorded.body["stream"] == true {
        sse(&message).into_response()
    } else {
        axum::Json(message).into_response()
    }
}

/// A content's text: a string, or the `text` of each of its blocks, a line each.
pub(crate) fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The text of every item's `content` (messages, or a Responses request's input), a line each.
pub(crate) fn contents_text(items: &[Value]) -> String {
    items
        .iter()
        .map(|i| text_of(&i["content"]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The directory the CLI said it works in (Claude Code: a line such as `Primary working
/// directory: /path` in its environment note; Codex: `<cwd>/path</cwd>`), or "" if none.
pub fn working_directory(text: &str) -> String {
    const LABEL: &str = "working directory:";
    // Codex says it as `<environment_context><cwd>/path</cwd>…`.
    if let Some((_, rest)) = text.split_once("<cwd>") {
        if let Some((cwd, _)) = rest.split_once("</cwd>") {
            return cwd.trim().to_string();
        }
    }
    text.lines()
        .find_map(|l| {
            let at = l.to_ascii_lowercase().find(LABEL)?;
            Some(l[at + LABEL.len()..].trim().to_string())
        })
        .unwrap_or_default()
}

pub(crate) fn with_cwd(value: &Value, cwd: &str) -> Value {
    match value {
        Value::String(s) => Value::String(s.replace("{cwd}", cwd)),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), with_cwd(v, cwd)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|v| with_cwd(v, cwd)).collect()),
        other => other.clone(),
    }
}

/// The whole assistant message of `step`, as the non-streaming API answers it.
fn message_of(request: &Value, step: &Step, cwd: &str) -> Value {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (content, stop) = match step {
        Step::Tool { name, input } => (
            json!([{"type": "tool_use", "id": format!("toolu_{n:04}"), "name": name,
                    "input": with_cwd(input, cwd)}]),
            "tool_use",
        ),
        Step::Text(text) => (json!([{"type": "text", "text": text}]), "end_turn"),
        Step::Hold => (json!([{"type": "text", "text": "held"}]), "end_turn"),
    };
    json!({
        "id": format!("msg_{n:04}"),
        "type": "message",
        "role": "assistant",
        "model": request["model"].as_str().unwrap_or("scripted"),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": {"input_tokens": 100, "output_tokens": 20},
    })
}

/// The same message as the streaming API sends it: `message_start`, one content block with
/// its delta, `message_delta` with the stop reason, `message_stop`.
fn sse(message: &Value) -> Response {
    let mut start = message.clone();
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    let block = &message["content"][0];
    let (opening, delta) = if block["type"] == "tool_use" {
        (
            json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
            json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
        )
    } else {
        (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": block["text"]}),
        )
    };
    let events = [
        (
            "message_start",
            json!({"type": "message_start", "message": start}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": opening}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": message["stop_reason"], "stop_sequence": null},
                   "usage": {"output_tokens": 20}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    event_stream(&events)
}

/// Server-sent events, each named, with its JSON data, in one answer.
pub(crate) fn event_stream(events: &[(&str, Value)]) -> Response {
    let text: String = events
        .iter()
        .map(|(event, data)| format!("event: {event}\ndata: {data}\n\n"))
        .collect();
    (
        [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
        ],
        text,
    )
        .into_response()
}

/// A network namespace standing in for the internet: a veth pair to the host, addressed
/// 100.100.K.0/30 (outside every private range), removed on drop. A sandbox with `outbound`
/// egress reaches `address`; the host reaches it too.
pub struct TestNet {
    pub netns: String,
    host_if: String,
    pub address: Ipv4Addr,
}

impl TestNet {
    pub fn new(tag: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let _nets = lock_test_nets();
        // 100.100.200-249: apart from the worker's own unit tests' namespaces (0-199).
        let k = free_test_subnet(200..250, pid + n * 17);
        let netns = format!("sqm-{tag}-{pid}-{n}");
        let host_if = format!("sqm{:05x}{n}", pid % 0x100000);
        let (host, address) = (Ipv4Addr::new(100, 100, k, 1), Ipv4Addr::new(100, 100, k, 2));
        let _ = run_ip(&["netns", "del", &netns], true);
        let _ = run_ip(&["link", "del", &host_if], true);
        // Made before the set-up, so a step that fails still removes what the others made.
        let net = TestNet {
            netns: netns.clone(),
            host_if: host_if.clone(),
            address,
        };
        let host_cidr = format!("{host}/30");
        let addr_cidr = format!("{address}/30");
        let host_s = host.to_string();
        for args in [
            vec!["netns", "add", &netns],
            vec![
                "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &netns,
            ],
            vec!["addr", "add", &host_cidr, "dev", &host_if],
            vec!["link", "set", &host_if, "up"],
            vec!["-n", &netns, "link", "set", "lo", "up"],
            vec!["-n", &netns, "addr", "add", &addr_cidr, "dev", "eth0"],
            vec!["-n", &netns, "link", "set", "eth0", "up"],
            vec!["-n", &netns, "route", "add", "default", "via", &host_s],
        ] {
            assert!(run_ip(&args, false), "ip {args:?}");
        }
        net
    }

    /// The host's end of the pair (the namespace's default route).
    pub fn host(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.address) - 1)
    }

    /// A listener on `address:port` inside the namespace: bound by a thread that entered the
    /// namespace; the socket stays there whichever thread serves it.
    pub fn listen(&self, port: u16) -> std::net::TcpListener {
        let path = format!("/run/netns/{}", self.netns);
        let addr = SocketAddr::from((self.address, port));
        let listener = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("namespace file");
            // This thread only; it ends right after binding.
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("setns into the test namespace");
            std::net::TcpListener::bind(addr).expect("bind in the namespace")
        })
        .join()
        .expect("binding thread");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_err() {
            assert!(
                Instant::now() < deadline,
                "{addr} unreachable from the host"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        listener
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        let _ = run_ip(&["link", "del", &self.host_if], true);
        let _ = run_ip(&["netns", "del", &self.netns], true);
    }
}

fn run_ip(args: &[&str], quiet: bool) -> bool {
    let mut c = Command::new("ip");
    c.args(args);
    if quiet {
        c.stderr(Stdio::null());
    }
    c.status().is_ok_and(|s| s.success())
}

/// Test binaries run side by side (`scripts/run-tests.py`), and the worker's unit tests and
/// the integration tests' model servers both make 100.100.K.0/30 networks on the host: a
/// subnet is chosen, and its address added, under this lock, and only one no interface holds.
/// The same lock and choice as the worker's `runtime/test_internet.rs`: the test code of two crates cannot share a
/// module (the worker's is `cfg(test)`).
const TEST_NETS_LOCK: &str = "/tmp/squadron-test-nets.lock";

/// Holds [`TEST_NETS_LOCK`] until dropped.
fn lock_test_nets() -> std::fs::File {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(TEST_NETS_LOCK)
        .expect("the test networks' lock file");
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .expect("lock the test networks");
    file
}

/// The first K of `range`, from `start` on, whose 100.100.K.1 no interface of the host holds.
fn free_test_subnet(range: std::ops::Range<u32>, start: u32) -> u8 {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .expect("ip addr show");
    let used = String::from_utf8_lossy(&out.stdout);
    let span = range.end - range.start;
    (0..span)
        .map(|i| range.start + (start.wrapping_add(i)) % span)
        .find(|k| !used.contains(&format!(" 100.100.{k}.1/")))
        .and_then(|k| u8::try_from(k).ok())
        .expect("a free test subnet")
}
