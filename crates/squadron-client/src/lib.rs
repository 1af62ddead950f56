//! A typed async client for Squadron's REST API (`/api/v1`).
//!
//! [`SquadronClient`] holds an ordered list of control-node endpoints (`http://host:port`).
//! Every call tries them in order, starting at the one that answered last, under one rule that
//! keeps retries safe:
//!
//! - a read, and a write that carries an idempotency key, moves on to the next endpoint after
//!   any transport failure (and after a `503 unavailable` answer);
//! - a write **without** a key moves on only when it provably never left this process (the
//!   connection was refused or could not be set up). If it may have reached a server — a
//!   timeout or a dropped connection after sending — the call fails with
//!   [`ClientError::OutcomeUnknown`] instead of sending it a second time.
//!
//! Writes take `Option<&IdempotencyKey>` (sent as the `Idempotency-Key` header; the server
//! answers a repeated key with the first answer); [`new_idempotency_key`] makes a fresh one.
//! Reads take a [`Consistency`]: linearizable (ReadIndex through the leader, the default) or
//! stale (the answering node's applied state).

pub mod agent_types;
mod error;
pub mod grpc_leader;
pub mod types;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use reqwest::header::{HeaderValue, CONTENT_TYPE};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use squadron_core::capsule::ContinuityCapsule;
use squadron_core::ids::{
    IdempotencyKey, LeaseId, McpServerId, ProfileId, ProjectId, TaskId, TenantId, WorkerId,
};
use squadron_core::lease::RuntimeLease;
use squadron_core::mailbox::Mailbox;
use squadron_core::profile::AgentProfile;
use squadron_core::project::Project;
use squadron_core::response::LeaseGrant;
use squadron_core::roster::RosterSnapshot;
use squadron_core::task::Task;
use squadron_core::worker::Worker;
use squadron_core::Outcome;

pub use agent_types::*;
pub use error::{ClientError, EndpointFailure, ErrorBody};
pub use grpc_leader::GrpcLeader;
pub use types::*;

/// The header that carries an idempotency key.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
/// How long one request may take, connection included, unless configured otherwise. Longer
/// than the server's own forward and read-index timeout (5 s by default), so a slow cluster
/// answers with its own error before this client gives up.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(15);
/// How long setting up a connection may take before the next endpoint is tried.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);
/// The endpoint used when none is given.
pub const ENDPOINT_DEFAULT: &str = "http://127.0.0.1:8120";

/// Read consistency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Consistency {
    /// ReadIndex through the leader: sees every write acknowledged before the read began.
    #[default]
    Linearizable,
    /// The answering node's applied state, possibly behind; answers without a leader.
    Stale,
}

/// A fresh idempotency key: `sq-` and 32 random hex digits, plus a process-wide counter so two
/// keys of one process never collide even with a broken random source.
pub fn new_idempotency_key() -> IdempotencyKey {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let random: u128 = rand::thread_rng().gen();
    let key = format!("sq-{random:032x}-{n}");
    // Printable ASCII, no spaces, well under the length bound: always valid.
    IdempotencyKey::new(key).expect("generated idempotency keys are valid")
}

/// Milliseconds since the Unix epoch, for fields like `observed_at_ms`.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Turns `host:port`, `http://host:port` or `http://host:port/` into `http://host:port`.
pub fn normalize_endpoint(endpoint: &str) -> String {
    let trimmed = endpoint.trim().trim_end_matches('/');
    if trimmed.contains("://") {
        trimmed.to_string()
    } else {
        format!("http://{trimmed}")
    }
}

/// Percent-encodes one path segment (everything but RFC 3986 unreserved characters).
fn segment(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An error and its sources, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

enum Body {
    Empty,
    Json(Vec<u8>),
    Text(&'static str, String),
}

#[derive(Clone, Copy)]
enum Call<'a> {
    Read(Consistency),
    Write(Option<&'a IdempotencyKey>),
}

impl Call<'_> {
    /// Whether the request may be sent to another endpoint after it may have reached one.
    fn resend_safe(self) -> bool {
        match self {
            Call::Read(_) => true,
            Call::Write(key) => key.is_some(),
        }
    }
}

/// A client of one Squadron cluster. Cheap to clone; clones share the connection pool and the
/// preferred endpoint.
#[derive(Debug, Clone)]
pub struct SquadronClient {
    endpoints: Arc<Vec<String>>,
    http: reqwest::Client,
    preferred: Arc<AtomicUsize>,
}

impl SquadronClient {
    /// A client of the given endpoints (`http://127.0.0.1:8120`; a bare `host:port` gets
    /// `http://`), with the default timeouts.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self::with_timeouts(endpoints, REQUEST_TIMEOUT_DEFAULT, CONNECT_TIMEOUT_DEFAULT)
    }

    /// A client with explicit timeouts: `request` bounds a whole call to one endpoint,
    /// `connect` the connection set-up (after which the next endpoint is tried).
    pub fn with_timeouts(endpoints: Vec<String>, request: Duration, connect: Duration) -> Self {
        let http = reqwest::Client::builder()
            .timeout(request)
            .connect_timeout(connect)
            .tcp_nodelay(true)
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Self {
            endpoints: Arc::new(endpoints.iter().map(|e| normalize_endpoint(e)).collect()),
            http,
            preferred: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A client of other endpoints that shares this one's connection pool and timeouts.
    pub fn with_endpoints(&self, endpoints: Vec<String>) -> Self {
        Self {
            endpoints: Arc::new(endpoints.iter().map(|e| normalize_endpoint(e)).collect()),
            http: self.http.clone(),
            preferred: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The endpoint the next call tries first.
    pub fn preferred_endpoint(&self) -> Option<&str> {
        let n = self.endpoints.len();
        if n == 0 {
            return None;
        }
        self.endpoints
            .get(self.preferred.load(Ordering::Relaxed) % n)
            .map(String::as_str)
    }

    async fn call_bytes(
        &self,
        method: Method,
        path: &str,
        mut query: Vec<(&'static str, String)>,
        body: Body,
        call: Call<'_>,
    ) -> Result<(String, Vec<u8>), ClientError> {
        if let Call::Read(Consistency::Stale) = call {
            query.push(("consistency", "stale".into()));
        }
        let n = self.endpoints.len();
        let start = if n == 0 {
            0
        } else {
            self.preferred.load(Ordering::Relaxed) % n
        };
        let mut attempts = Vec::new();
        let mut unavailable: Option<ClientError> = None;
        for i in 0..n {
            let idx = (start + i) % n;
            let Some(base) = self.endpoints.get(idx) else {
                continue;
            };
            let mut req = self.http.request(method.clone(), format!("{base}{path}"));
            if !query.is_empty() {
                req = req.query(&query);
            }
            req = match &body {
                Body::Empty => req,
                Body::Json(bytes) => req
                    .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                    .body(bytes.clone()),
                Body::Text(content_type, text) => req
                    .header(CONTENT_TYPE, HeaderValue::from_static(content_type))
                    .body(text.clone()),
            };
            if let Call::Write(Some(key)) = call {
                req = req.header(IDEMPOTENCY_HEADER, key.as_str());
            }
            let resp = match req.send().await {
                Ok(resp) => resp,
                Err(e) => {
                    // A refused or failed connection (and a URL that could not even be built)
                    // means nothing was sent: any call may go on to the next endpoint.
                    let not_sent = e.is_connect() || e.is_builder();
                    let message = chain(&e);
                    if !not_sent && !call.resend_safe() {
                        return Err(ClientError::OutcomeUnknown {
                            endpoint: base.clone(),
                            message,
                        });
                    }
                    tracing::debug!(endpoint = %base, %message, "endpoint failed; trying the next");
                    attempts.push(EndpointFailure {
                        endpoint: base.clone(),
                        message,
                    });
                    continue;
                }
            };
            let status = resp.status().as_u16();
            let bytes = match resp.bytes().await {
                Ok(b) => b.to_vec(),
                Err(e) => {
                    let message =
                        format!("status {status}, then reading the answer: {}", chain(&e));
                    if !call.resend_safe() {
                        return Err(ClientError::OutcomeUnknown {
                            endpoint: base.clone(),
                            message,
                        });
                    }
                    attempts.push(EndpointFailure {
                        endpoint: base.clone(),
                        message,
                    });
                    continue;
                }
            };
            if (200..300).contains(&status) {
                self.preferred.store(idx, Ordering::Relaxed);
                return Ok((base.clone(), bytes));
            }
            let body = serde_json::from_slice::<ErrorBody>(&bytes).unwrap_or_else(|_| ErrorBody {
                code: error::code_for_status(status),
                message: {
                    let text = String::from_utf8_lossy(&bytes).trim().to_string();
                    if text.is_empty() {
                        format!("HTTP {status}")
                    } else {
                        format!("HTTP {status}: {text}")
                    }
                },
                field: None,
                rejection: None,
            });
            let err = ClientError::Api {
                endpoint: base.clone(),
                status,
                body,
            };
            // A node without a leader (or that lost its forward) answers 503. Another node may
            // do better — but a write without a key may have been forwarded and applied.
            if status == 503 && call.resend_safe() {
                attempts.push(EndpointFailure {
                    endpoint: base.clone(),
                    message: err.to_string(),
                });
                unavailable = Some(err);
                continue;
            }
            if status != 503 {
                self.preferred.store(idx, Ordering::Relaxed);
            }
            return Err(err);
        }
        Err(unavailable.unwrap_or(ClientError::Unreachable { attempts }))
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: Vec<(&'static str, String)>,
        body: Body,
        call: Call<'_>,
    ) -> Result<T, ClientError> {
        let (endpoint, bytes) = self.call_bytes(method, path, query, body, call).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode {
            endpoint,
            message: e.to_string(),
        })
    }

    async fn get<T: DeserializeOwned>(&self, path: &str, c: Consistency) -> Result<T, ClientError> {
        self.call(Method::GET, path, Vec::new(), Body::Empty, Call::Read(c))
            .await
    }

    async fn write<T: DeserializeOwned, B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        key: Option<&IdempotencyKey>,
    ) -> Result<T, ClientError> {
        let body = match body {
            Some(b) => {
                Body::Json(serde_json::to_vec(b).map_err(|e| ClientError::Invalid(e.to_string()))?)
            }
            None => Body::Empty,
        };
        self.call(method, path, Vec::new(), body, Call::Write(key))
            .await
    }

    async fn post<B: Serialize>(
        &self,
        path: &str,
        body: &B,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.write(Method::POST, path, Some(body), key).await
    }

    async fn send_empty(
        &self,
        method: Method,
        path: &str,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.write::<Outcome, ()>(method, path, None, key).await
    }

    // --- health ------------------------------------------------------------------------------

    /// `GET /readyz` on each endpoint in turn: the first node's text if it knows a leader.
    pub async fn ready(&self) -> Result<String, ClientError> {
        let (_, bytes) = self
            .call_bytes(
                Method::GET,
                "/readyz",
                Vec::new(),
                Body::Empty,
                Call::Read(Consistency::Stale),
            )
            .await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    // --- cluster -----------------------------------------------------------------------------

    /// One node's view of the cluster (the first endpoint that answers).
    pub async fn cluster_status(&self, c: Consistency) -> Result<ClusterStatus, ClientError> {
        self.get("/api/v1/cluster/status", c).await
    }

    pub async fn add_learner(&self, req: &AddLearner) -> Result<MembershipChanged, ClientError> {
        self.write(Method::POST, "/api/v1/cluster/learners", Some(req), None)
            .await
    }

    pub async fn promote_voter(&self, id: u64) -> Result<MembershipChanged, ClientError> {
        self.write(
            Method::POST,
            "/api/v1/cluster/voters",
            Some(&PromoteVoter { id }),
            None,
        )
        .await
    }

    pub async fn remove_member(&self, id: u64) -> Result<MembershipChanged, ClientError> {
        self.write::<MembershipChanged, ()>(
            Method::DELETE,
            &format!("/api/v1/cluster/members/{id}"),
            None,
            None,
        )
        .await
    }

    // --- projects ----------------------------------------------------------------------------

    pub async fn create_project(
        &self,
        req: &CreateProject,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post("/api/v1/projects", req, key).await
    }

    pub async fn list_projects(&self, c: Consistency) -> Result<Vec<ProjectSummary>, ClientError> {
        self.get("/api/v1/projects", c).await
    }

    pub async fn get_project(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        c: Consistency,
    ) -> Result<Project, ClientError> {
        self.get(&format!("/api/v1/projects/{tenant}/{project}"), c)
            .await
    }

    pub async fn attach_sandbox(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        req: &AttachSandbox,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(
            &format!("/api/v1/projects/{tenant}/{project}/sandbox"),
            req,
            key,
        )
        .await
    }

    pub async fn detach_sandbox(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        sandbox_ref: &str,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        let path = format!(
            "/api/v1/projects/{tenant}/{project}/sandbox/{}",
            segment(sandbox_ref)
        );
        self.send_empty(Method::DELETE, &path, key).await
    }

    pub async fn roster(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        c: Consistency,
    ) -> Result<RosterSnapshot, ClientError> {
        self.get(&format!("/api/v1/projects/{tenant}/{project}/roster"), c)
            .await
    }

    // --- profiles ----------------------------------------------------------------------------

    pub async fn create_profile(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        req: &CreateProfile,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(
            &format!("/api/v1/projects/{tenant}/{project}/profiles"),
            req,
            key,
        )
        .await
    }

    pub async fn list_profiles(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        c: Consistency,
    ) -> Result<Vec<AgentProfile>, ClientError> {
        self.get(&format!("/api/v1/projects/{tenant}/{project}/profiles"), c)
            .await
    }

    pub async fn get_profile(
        &self,
        profile: ProfileId,
        c: Consistency,
    ) -> Result<AgentProfile, ClientError> {
        self.get(&format!("/api/v1/profiles/{profile}"), c).await
    }

    pub async fn set_capabilities(
        &self,
        profile: ProfileId,
        req: &SetCapabilities,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.write(
            Method::PUT,
            &format!("/api/v1/profiles/{profile}/capabilities"),
            Some(req),
            key,
        )
        .await
    }

    pub async fn grant_mcp(
        &self,
        profile: ProfileId,
        server: &McpServerId,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.send_empty(
            Method::PUT,
            &format!("/api/v1/profiles/{profile}/mcp/{server}"),
            key,
        )
        .await
    }

    pub async fn revoke_mcp(
        &self,
        profile: ProfileId,
        server: &McpServerId,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.send_empty(
            Method::DELETE,
            &format!("/api/v1/profiles/{profile}/mcp/{server}"),
            key,
        )
        .await
    }

    /// Whether the profile may use the MCP server: `Ok` when it may, a `permission_denied`
    /// error when it may not (INV-14).
    pub async fn check_mcp(
        &self,
        profile: ProfileId,
        server: &McpServerId,
        c: Consistency,
    ) -> Result<McpDecision, ClientError> {
        self.get(&format!("/api/v1/profiles/{profile}/mcp/{server}"), c)
            .await
    }

    // --- the agent facade (relayed to the sandbox's worker) ---------------------------------

    /// Launches the profile's provider in its project's sandbox under a new lease.
    pub async fn agent_launch(
        &self,
        profile: ProfileId,
        req: &LaunchAgent,
    ) -> Result<AgentView, ClientError> {
        self.write(
            Method::POST,
            &format!("/api/v1/profiles/{profile}/agent/launch"),
            Some(req),
            None,
        )
        .await
    }

    /// A graceful or crash takeover of the profile: the next generation, started.
    pub async fn agent_takeover(
        &self,
        profile: ProfileId,
        req: &TakeoverAgent,
    ) -> Result<AgentView, ClientError> {
        self.write(
            Method::POST,
            &format!("/api/v1/profiles/{profile}/agent/takeover"),
            Some(req),
            None,
        )
        .await
    }

    /// Stops the profile's provider (SIGTERM, grace, SIGKILL), reaps it and ends its lease.
    pub async fn agent_stop(
        &self,
        profile: ProfileId,
        req: &StopAgent,
    ) -> Result<AgentView, ClientError> {
        self.write(
            Method::POST,
            &format!("/api/v1/profiles/{profile}/agent/stop"),
            Some(req),
            None,
        )
        .await
    }

    /// Reaps the profile's last generation (kill, `populated 0`) and records the evidence,
    /// freeing the slot of a fenced or expired lease.
    pub async fn agent_reap(&self, profile: ProfileId) -> Result<ReplacedGeneration, ClientError> {
        self.write::<_, ()>(
            Method::POST,
            &format!("/api/v1/profiles/{profile}/agent/reap"),
            None,
            None,
        )
        .await
    }

    /// The profile's provider attempt as its worker sees it.
    pub async fn agent_view(&self, profile: ProfileId) -> Result<AgentView, ClientError> {
        self.get(
            &format!("/api/v1/profiles/{profile}/agent"),
            Consistency::Linearizable,
        )
        .await
    }

    /// The release evidence of a project, from this node and the sandbox's worker.
    pub async fn project_evidence(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
    ) -> Result<ProjectEvidence, ClientError> {
        self.get(
            &format!("/api/v1/projects/{tenant}/{project}/evidence"),
            Consistency::Linearizable,
        )
        .await
    }

    // --- leases ------------------------------------------------------------------------------

    pub async fn acquire_lease(
        &self,
        profile: ProfileId,
        req: &AcquireLease,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/profiles/{profile}/leases"), req, key)
            .await
    }

    pub async fn get_lease(
        &self,
        lease: LeaseId,
        c: Consistency,
    ) -> Result<RuntimeLease, ClientError> {
        self.get(&format!("/api/v1/leases/{lease}"), c).await
    }

    pub async fn list_leases(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        c: Consistency,
    ) -> Result<Vec<RuntimeLease>, ClientError> {
        self.get(&format!("/api/v1/projects/{tenant}/{project}/leases"), c)
            .await
    }

    pub async fn renew_lease(
        &self,
        lease: LeaseId,
        req: &RenewLease,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/leases/{lease}/renew"), req, key)
            .await
    }

    pub async fn release_lease(
        &self,
        lease: LeaseId,
        req: &LeaseFence,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/leases/{lease}/release"), req, key)
            .await
    }

    pub async fn fence_lease(
        &self,
        lease: LeaseId,
        req: &FenceLease,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/leases/{lease}/fence"), req, key)
            .await
    }

    pub async fn record_evidence(
        &self,
        lease: LeaseId,
        req: &RecordEvidence,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/leases/{lease}/evidence"), req, key)
            .await
    }

    /// Renews every listed lease of one worker in one command.
    pub async fn renew_leases(
        &self,
        worker: &WorkerId,
        req: &RenewLeases,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/workers/{worker}/renewals"), req, key)
            .await
    }

    pub async fn takeover_graceful(
        &self,
        profile: ProfileId,
        req: &GracefulTakeover,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(
            &format!("/api/v1/profiles/{profile}/takeover"),
            &Takeover::Graceful(Box::new(req.clone())),
            key,
        )
        .await
    }

    pub async fn takeover_crash(
        &self,
        profile: ProfileId,
        req: &CrashTakeover,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(
            &format!("/api/v1/profiles/{profile}/takeover"),
            &Takeover::Crash(req.clone()),
            key,
        )
        .await
    }

    // --- capsules and mailboxes --------------------------------------------------------------

    pub async fn commit_capsule(
        &self,
        profile: ProfileId,
        req: &CommitCapsule,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/profiles/{profile}/capsules"), req, key)
            .await
    }

    pub async fn list_capsules(
        &self,
        profile: ProfileId,
        c: Consistency,
    ) -> Result<Vec<ContinuityCapsule>, ClientError> {
        self.get(&format!("/api/v1/profiles/{profile}/capsules"), c)
            .await
    }

    pub async fn post_message(
        &self,
        profile: ProfileId,
        req: &PostMessage,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/profiles/{profile}/mailbox"), req, key)
            .await
    }

    pub async fn read_mailbox(
        &self,
        profile: ProfileId,
        c: Consistency,
    ) -> Result<Mailbox, ClientError> {
        self.get(&format!("/api/v1/profiles/{profile}/mailbox"), c)
            .await
    }

    pub async fn ack_messages(
        &self,
        profile: ProfileId,
        req: &AckMessages,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/profiles/{profile}/mailbox/ack"), req, key)
            .await
    }

    // --- tasks -------------------------------------------------------------------------------

    /// Submits a manifest written in YAML.
    pub async fn submit_task_yaml(
        &self,
        manifest: &str,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.call(
            Method::POST,
            "/api/v1/tasks",
            Vec::new(),
            Body::Text("application/yaml", manifest.to_string()),
            Call::Write(key),
        )
        .await
    }

    /// Submits a manifest written in JSON.
    pub async fn submit_task_json(
        &self,
        manifest: &str,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.call(
            Method::POST,
            "/api/v1/tasks",
            Vec::new(),
            Body::Text("application/json", manifest.to_string()),
            Call::Write(key),
        )
        .await
    }

    pub async fn list_tasks(&self, q: &TaskQuery, c: Consistency) -> Result<TaskPage, ClientError> {
        let mut query = Vec::new();
        if let Some(state) = q.state {
            query.push(("state", state.as_str().to_string()));
        }
        if let Some(after) = q.after {
            query.push(("after", after.to_string()));
        }
        if let Some(limit) = q.limit {
            query.push(("limit", limit.to_string()));
        }
        self.call(
            Method::GET,
            "/api/v1/tasks",
            query,
            Body::Empty,
            Call::Read(c),
        )
        .await
    }

    pub async fn get_task(&self, task: TaskId, c: Consistency) -> Result<Task, ClientError> {
        self.get(&format!("/api/v1/tasks/{task}"), c).await
    }

    /// Cancels a task: a queued one ends at once, an assigned one is asked to stop.
    /// A slice of a task's output, relayed from its worker: `stream` is `stdout`, `stderr` or
    /// `events`; `offset` starts at a byte, `tail` at the last lines (give one or neither).
    pub async fn task_logs(
        &self,
        task: TaskId,
        stream: &str,
        offset: Option<u64>,
        tail: Option<u64>,
    ) -> Result<Vec<u8>, ClientError> {
        let mut query = vec![("stream", stream.to_string())];
        if let Some(o) = offset {
            query.push(("offset", o.to_string()));
        }
        if let Some(t) = tail {
            query.push(("tail", t.to_string()));
        }
        let path = format!("/api/v1/tasks/{task}/logs");
        self.call_bytes(
            Method::GET,
            &path,
            query,
            Body::Empty,
            Call::Read(Consistency::Linearizable),
        )
        .await
        .map(|(_, b)| b)
    }

    /// The artifacts a task's worker holds for it.
    pub async fn task_artifacts(&self, task: TaskId) -> Result<Vec<ArtifactEntry>, ClientError> {
        self.get(
            &format!("/api/v1/tasks/{task}/artifacts"),
            Consistency::Linearizable,
        )
        .await
    }

    /// One artifact's bytes.
    pub async fn task_artifact(&self, task: TaskId, name: &str) -> Result<Vec<u8>, ClientError> {
        let encoded: Vec<String> = name.split('/').map(segment).collect();
        let path = format!("/api/v1/tasks/{task}/artifacts/{}", encoded.join("/"));
        self.call_bytes(
            Method::GET,
            &path,
            Vec::new(),
            Body::Empty,
            Call::Read(Consistency::Linearizable),
        )
        .await
        .map(|(_, b)| b)
    }

    pub async fn cancel_task(
        &self,
        task: TaskId,
        reason: Option<&str>,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        let query = reason
            .map(|r| vec![("reason", r.to_string())])
            .unwrap_or_default();
        self.call(
            Method::DELETE,
            &format!("/api/v1/tasks/{task}"),
            query,
            Body::Empty,
            Call::Write(key),
        )
        .await
    }

    /// A worker reports a lifecycle transition.
    pub async fn report_transition(
        &self,
        task: TaskId,
        req: &ReportTransition,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/tasks/{task}/transitions"), req, key)
            .await
    }

    /// A worker reports output counters.
    pub async fn report_progress(
        &self,
        task: TaskId,
        req: &ReportProgress,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/tasks/{task}/progress"), req, key)
            .await
    }

    // --- workers -----------------------------------------------------------------------------

    pub async fn register_worker(
        &self,
        req: &RegisterWorker,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post("/api/v1/workers", req, key).await
    }

    pub async fn worker_heartbeat(
        &self,
        worker: &WorkerId,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.send_empty(
            Method::POST,
            &format!("/api/v1/workers/{worker}/heartbeat"),
            key,
        )
        .await
    }

    pub async fn list_workers(&self, c: Consistency) -> Result<Vec<Worker>, ClientError> {
        self.get("/api/v1/workers", c).await
    }

    pub async fn get_worker(
        &self,
        worker: &WorkerId,
        c: Consistency,
    ) -> Result<Worker, ClientError> {
        self.get(&format!("/api/v1/workers/{worker}"), c).await
    }

    pub async fn decommission_worker(
        &self,
        worker: &WorkerId,
        req: &Decommission,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/workers/{worker}/decommission"), req, key)
            .await
    }
}

/// Typed views of the outcomes callers most often need.
pub trait OutcomeExt {
    /// The grant of an acquisition or a takeover.
    fn lease_grant(&self) -> Option<LeaseGrant>;
    fn profile_id(&self) -> Option<ProfileId>;
    fn task_id(&self) -> Option<TaskId>;
}

impl OutcomeExt for Outcome {
    fn lease_grant(&self) -> Option<LeaseGrant> {
        match self {
            Outcome::LeaseGranted(g) => Some(*g),
            Outcome::TookOver { grant, .. } => Some(*grant),
            _ => None,
        }
    }

    fn profile_id(&self) -> Option<ProfileId> {
        match self {
            Outcome::ProfileCreated { profile } => Some(*profile),
            _ => None,
        }
    }

    fn task_id(&self) -> Option<TaskId> {
        match self {
            Outcome::TaskSubmitted { task } => Some(*task),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
