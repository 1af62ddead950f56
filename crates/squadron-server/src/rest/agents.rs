//! The operator facade of the identity runtime, on any node: launch, observe, take over,
//! stop and reap a profile's provider process, and a project's release evidence.
//!
//! A node decides nothing here. It finds the worker that holds the project's sandbox
//! (INV-1) in the replicated state and relays the request to that worker's
//! `/worker/v1/agents/…`; the worker acquires, renews, fences and takes over leases through
//! the control plane like any other client, so every decision is a replicated command. Before
//! relaying, the node records who asked (`RequestAgentOperation`), so the audit names the
//! operator and not only the worker that acted.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, Path, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Json;
use squadron_api::agents::{
    BuildDigest, HeldSandbox, ProjectEvidence, WorkerBuild, WorkerEvidence,
};
use squadron_core::command::{AgentOperation, RequestAgentOperation};
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{ProfileId, ProjectId, TenantId, WorkerId};
use squadron_core::Command;

use super::task_output::{
    check_offered_protocols, follow_all, relay_logs, relay_upgrade, WorkerRelay,
};
use super::{
    body, json, parse_id, query, read, write, Answer, AppState, Input, QueryParams, RouteBook,
};
use crate::authz::Caller;
use crate::error::ApiError;
use crate::node::{Consistency, ControlNode};
use squadron_api::{Access, LogQuery, Scope, StreamQuery};

/// A relayed agent operation may wait for a lease to expire (crash takeover) and for a
/// provider's grace period.
pub const AGENT_RELAY_TIMEOUT_MS: u64 = 300_000;
/// Waiting for the worker's evidence.
pub const EVIDENCE_RELAY_TIMEOUT_MS: u64 = 10_000;
/// Most workers whose binary digest one evidence read asks for.
pub const EVIDENCE_WORKERS_ASKED_MAX: usize = 256;
/// Waiting for one worker's digest: a hash read once, so a worker slower than this is hung.
pub const EVIDENCE_BUILD_TIMEOUT_MS: u64 = 3_000;
/// Largest request body relayed (a prompt included).
pub const AGENT_BODY_BYTES_MAX: usize = 2 << 20;
/// Largest answer read from a worker.
pub const WORKER_ANSWER_BYTES_MAX: usize = 4 << 20;

pub fn routes(book: RouteBook) -> RouteBook {
    book.add(
        "GET",
        "/api/v1/profiles/:id/agent",
        "The profile's provider attempt as its sandbox's worker sees it",
        Input::NONE,
        json::<squadron_api::agents::AgentView>(),
        Access::viewer(Scope::Profile).and_workers(),
        get(view),
    )
    .add(
        "GET",
        "/api/v1/profiles/:id/agent/logs",
        "The output of the profile's current generation: \
         ?stream=stdout|stderr|all&offset=N&tail=N&follow=true, as a task's logs",
        query::<LogQuery>(),
        Answer::text("text/plain"),
        Access::viewer(Scope::Profile),
        get(logs),
    )
    .add(
        "GET",
        "/ws/profiles/:id/agent/stream",
        "WebSocket: live output frames of the profile's current generation, then \
         {\"type\":\"end\"}; the token as for a task's stream; ?stdout_offset=N&stderr_offset=N \
         start each file where a logs read ended",
        query::<StreamQuery>(),
        Answer::websocket(),
        Access::viewer(Scope::Profile),
        get(stream),
    )
    .add(
        "POST",
        "/api/v1/profiles/:id/agent/launch",
        "Launch the profile's provider under a new lease in the project's sandbox",
        body::<squadron_api::agents::LaunchAgent>().optional(),
        json::<squadron_api::agents::AgentView>().created(),
        Access::operator(Scope::Profile),
        post(launch),
    )
    .add(
        "POST",
        "/api/v1/profiles/:id/agent/takeover",
        "Graceful or crash takeover: the next generation, started",
        body::<squadron_api::agents::TakeoverAgent>().optional(),
        json::<squadron_api::agents::AgentView>(),
        Access::operator(Scope::Profile),
        post(takeover),
    )
    .add(
        "POST",
        "/api/v1/profiles/:id/agent/stop",
        "Stop the provider (SIGTERM, grace, SIGKILL), reap it, end its lease",
        body::<squadron_api::agents::StopAgent>().optional(),
        json::<squadron_api::agents::AgentView>(),
        Access::operator(Scope::Profile),
        post(stop),
    )
    .add(
        "POST",
        "/api/v1/profiles/:id/agent/reap",
        "Reap a dead or fenced generation and record the evidence",
        Input::NONE,
        json::<Option<squadron_api::agents::ReplacedGeneration>>(),
        Access::operator(Scope::Profile),
        post(reap),
    )
    .add(
        "GET",
        "/api/v1/projects/:tenant/:project/evidence",
        "Release evidence of a project: replicated counters, this node's MCP denials, the \
         sandbox worker's observations",
        Input::NONE,
        json::<ProjectEvidence>(),
        Access::viewer(Scope::Project),
        get(evidence),
    )
}

/// The output server of the worker holding the profile's project sandbox; for a launch
/// into a project without one, the worker the body names.
async fn sandbox_worker(
    node: &AppState,
    id: ProfileId,
    named: Option<WorkerId>,
) -> Result<(WorkerId, WorkerRelay), ApiError> {
    let (worker, address) = read(node, Consistency::Linearizable, |s| {
        let p = s
            .profile(id)
            .ok_or_else(|| ApiError::not_found(format!("profile {id} not found")))?;
        let project = s
            .project(&p.tenant, &p.project)
            .ok_or_else(|| ApiError::not_found(format!("project {}/{}", p.tenant, p.project)))?;
        let worker = match (&project.sandbox, named) {
            (Some(sb), _) => sb.worker.clone(),
            (None, Some(w)) => w,
            (None, None) => {
                return Err(ApiError::invalid(
                    "worker",
                    format!(
                        "project {}/{} has no sandbox yet: name the worker that makes it \
                         (and repository.url)",
                        p.tenant, p.project
                    ),
                ))
            }
        };
        let w = s
            .worker(&worker)
            .ok_or_else(|| ApiError::not_found(format!("worker {worker} not found")))?;
        Ok((worker.clone(), w.address.clone()))
    })
    .await?;
    let relay = WorkerRelay::new(node, &worker, &address)?;
    Ok((worker, relay))
}

/// Records who asked for `operation` before the request is relayed: the worker's commands
/// that follow are its own, so this record is how the audit names the operator.
async fn record_request(
    node: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    profile: ProfileId,
    operation: AgentOperation,
    worker: &WorkerId,
) -> Result<(), ApiError> {
    let command = Command::RequestAgentOperation(RequestAgentOperation {
        profile,
        operation,
        worker: worker.clone(),
    });
    write(node, caller, headers, command).await.map(|_| ())
}

async fn relay(
    worker: &WorkerRelay,
    method: reqwest::Method,
    path: String,
    body: Option<Bytes>,
    timeout_ms: u64,
) -> Result<Response, ApiError> {
    let mut req = worker
        .client
        .request(method, format!("{}{path}", worker.base))
        .timeout(Duration::from_millis(timeout_ms));
    if let Some(b) = body {
        req = req
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(b);
    }
    let answer = req
        .send()
        .await
        .map_err(|e| ApiError::unavailable(format!("the sandbox's worker did not answer: {e}")))?;
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let bytes = answer
        .bytes()
        .await
        .map_err(|e| ApiError::unavailable(format!("the worker's answer broke off: {e}")))?;
    if bytes.len() > WORKER_ANSWER_BYTES_MAX {
        return Err(ApiError::internal(format!(
            "the worker answered {} bytes, more than {WORKER_ANSWER_BYTES_MAX}",
            bytes.len()
        )));
    }
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

fn check_body(bytes: &Bytes) -> Result<(), ApiError> {
    if bytes.len() > AGENT_BODY_BYTES_MAX {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the body is {} bytes, at most {AGENT_BODY_BYTES_MAX}",
                bytes.len()
            ),
        ));
    }
    Ok(())
}

async fn view(State(node): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let id: ProfileId = parse_id("profile_id", &id)?;
    let (_, worker) = sandbox_worker(&node, id, None).await?;
    relay(
        &worker,
        reqwest::Method::GET,
        format!("/worker/v1/agents/{id}"),
        None,
        EVIDENCE_RELAY_TIMEOUT_MS,
    )
    .await
}

async fn logs(
    State(node): State<AppState>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let id: ProfileId = parse_id("profile_id", &id)?;
    let (_, worker) = sandbox_worker(&node, id, None).await?;
    relay_logs(&worker, format!("/worker/v1/agents/{id}/logs"), q).await
}

async fn stream(
    State(node): State<AppState>,
    Path(id): Path<String>,
    QueryParams(from): QueryParams<StreamQuery>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let id: ProfileId = parse_id("profile_id", &id)?;
    check_offered_protocols(&headers)?;
    let (_, worker) = sandbox_worker(&node, id, None).await?;
    let path = format!("/worker/v1/agents/{id}/logs{}", follow_all(&from));
    Ok(relay_upgrade(
        ws,
        worker,
        path,
        || serde_json::json!({"type": "end"}),
    ))
}

async fn launch(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Result<Response, ApiError> {
    let id: ProfileId = parse_id("profile_id", &id)?;
    check_body(&bytes)?;
    // Only the worker field matters here; the worker parses the whole body strictly.
    let named = if bytes.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::invalid("body", format!("not JSON: {e}")))?;
        match v.get("worker") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(w)) => Some(
                WorkerId::new(w.clone()).map_err(|e| ApiError::invalid("worker", e.to_string()))?,
            ),
            Some(_) => return Err(ApiError::invalid("worker", "must be a worker id string")),
        }
    };
    let (worker, relay_to) = sandbox_worker(&node, id, named).await?;
    record_request(
        &node,
        &caller,
        &headers,
        id,
        AgentOperation::Launch,
        &worker,
    )
    .await?;
    relay(
        &relay_to,
        reqwest::Method::POST,
        format!("/worker/v1/agents/{id}/launch"),
        Some(bytes),
        AGENT_RELAY_TIMEOUT_MS,
    )
    .await
}

/// One relayed operation on the profile's provider, by whoever the guard admitted.
struct Asked {
    node: AppState,
    caller: Caller,
    headers: HeaderMap,
    id: String,
}

#[axum::async_trait]
impl FromRequestParts<AppState> for Asked {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, node: &AppState) -> Result<Self, ApiError> {
        let caller = Caller::from_request_parts(parts, node).await?;
        let Path(id) = Path::<String>::from_request_parts(parts, node)
            .await
            .map_err(|e| ApiError::invalid("profile_id", e.body_text()))?;
        Ok(Asked {
            node: node.clone(),
            caller,
            headers: parts.headers.clone(),
            id,
        })
    }
}

async fn forward(
    asked: Asked,
    op: AgentOperation,
    bytes: Option<Bytes>,
) -> Result<Response, ApiError> {
    let Asked {
        node,
        caller,
        headers,
        id,
    } = asked;
    let id: ProfileId = parse_id("profile_id", &id)?;
    if let Some(b) = &bytes {
        check_body(b)?;
    }
    let (worker, relay_to) = sandbox_worker(&node, id, None).await?;
    record_request(&node, &caller, &headers, id, op, &worker).await?;
    relay(
        &relay_to,
        reqwest::Method::POST,
        format!("/worker/v1/agents/{id}/{}", op.as_str()),
        bytes,
        AGENT_RELAY_TIMEOUT_MS,
    )
    .await
}

async fn takeover(asked: Asked, bytes: Bytes) -> Result<Response, ApiError> {
    forward(asked, AgentOperation::Takeover, Some(bytes)).await
}

async fn stop(asked: Asked, bytes: Bytes) -> Result<Response, ApiError> {
    forward(asked, AgentOperation::Stop, Some(bytes)).await
}

async fn reap(asked: Asked) -> Result<Response, ApiError> {
    forward(asked, AgentOperation::Reap, None).await
}

async fn evidence(
    State(node): State<AppState>,
    caller: Caller,
    Path((tenant, project)): Path<(String, String)>,
) -> Result<Json<ProjectEvidence>, ApiError> {
    let tenant = TenantId::new(tenant).map_err(|e| ApiError::invalid("tenant", e.to_string()))?;
    let project =
        ProjectId::new(project).map_err(|e| ApiError::invalid("project", e.to_string()))?;
    let (mut ev, address) = read(&node, Consistency::Linearizable, |s| {
        let p = s
            .project(&tenant, &project)
            .ok_or_else(|| ApiError::not_found(format!("project {tenant}/{project} not found")))?;
        let leases_not_terminal = s
            .leases()
            .filter(|l| l.tenant == tenant && l.project == project && l.state.holds_slot())
            .map(|l| l.id)
            .collect();
        let sandbox_worker = p.sandbox.as_ref().map(|sb| sb.worker.clone());
        let address = sandbox_worker
            .as_ref()
            .and_then(|w| s.worker(w).map(|found| (w.clone(), found.address.clone())));
        Ok((
            ProjectEvidence {
                tenant: tenant.clone(),
                project: project.clone(),
                profiles: u32::try_from(p.profiles.len()).unwrap_or(u32::MAX),
                max_active: p.max_active,
                peak_slots_held: p.stats.peak_slots_held,
                slots_held_now: p.slots_held,
                leases_granted: p.stats.leases_granted,
                takeovers_graceful: p.stats.takeovers_graceful,
                takeovers_crash: p.stats.takeovers_crash,
                roster_deltas_posted: p.stats.roster_deliveries,
                leases_not_terminal,
                unauthorized_mcp_denied: node.counters.mcp_denials.of(&tenant, &project),
                sandbox_worker,
                worker: None,
                worker_error: None,
                build_digests: Vec::new(),
            },
            address,
        ))
    })
    .await?;
    // Hashed once per process, started at the node's start (`lib.rs`).
    let sha256 = squadron_pki::own_binary_sha256_or_empty().await;
    ev.build_digests.push(BuildDigest {
        member: format!("node {}", node.id),
        sha256,
    });
    // The workers' digests are asked while the sandbox's worker gathers its evidence: one
    // read waits for the slower, not for both in turn.
    let sandbox_evidence = async {
        let (worker, address) = address?;
        let got = async {
            let relay = WorkerRelay::new(&node, &worker, &address).map_err(|e| e.body.message)?;
            let url = format!("{}/worker/v1/evidence/{tenant}/{project}", relay.base);
            let answer = relay
                .client
                .get(&url)
                .timeout(Duration::from_millis(EVIDENCE_RELAY_TIMEOUT_MS))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !answer.status().is_success() {
                return Err(format!("the worker answered {}", answer.status()));
            }
            answer
                .json::<WorkerEvidence>()
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        Some(got)
    };
    let (builds, got) = tokio::join!(worker_builds(&node), sandbox_evidence);
    ev.build_digests.extend(builds);
    match got {
        Some(Ok(mut v)) => {
            hide_unseen(&node, &caller, &mut v.task_sandboxes);
            ev.worker = Some(v);
        }
        Some(Err(e)) => ev.worker_error = Some(format!("the sandbox's worker: {e}")),
        None => {}
    }
    Ok(Json(ev))
}

/// Every live worker's binary digest (empty for one that did not answer, which fails the
/// claim naming it): a mismatched build on any worker, not only the sandbox's, is a failed
/// release gate.
async fn worker_builds(node: &AppState) -> Vec<BuildDigest> {
    let now = node.clock.now_ms();
    let (workers, live): (Vec<(WorkerId, String)>, usize) = node.state.with_state(|s| {
        let live: Vec<_> = s.workers().filter(|w| w.is_live(now)).collect();
        let asked = live
            .iter()
            .take(EVIDENCE_WORKERS_ASKED_MAX)
            .map(|w| (w.id.clone(), w.address.clone()))
            .collect();
        (asked, live.len())
    });
    let asked = workers.into_iter().map(|(worker, address)| async move {
        let sha256 = async {
            let relay = WorkerRelay::new(node, &worker, &address).ok()?;
            let answer = relay
                .client
                .get(format!("{}/worker/v1/build", relay.base))
                .timeout(Duration::from_millis(EVIDENCE_BUILD_TIMEOUT_MS))
                .send()
                .await
                .ok()?
                .error_for_status()
                .ok()?;
            answer.json::<WorkerBuild>().await.ok().map(|b| b.sha256)
        }
        .await;
        BuildDigest {
            member: format!("worker {worker}"),
            sha256: sha256.unwrap_or_default(),
        }
    });
    let mut digests = futures_util::future::join_all(asked).await;
    if live > EVIDENCE_WORKERS_ASKED_MAX {
        // Not asked, so not proven: the claim fails naming them.
        digests.push(BuildDigest {
            member: format!(
                "worker beyond the first {EVIDENCE_WORKERS_ASKED_MAX} ({} not asked)",
                live - EVIDENCE_WORKERS_ASKED_MAX
            ),
            sha256: String::new(),
        });
    }
    digests
}

/// The worker lists every task sandbox it holds; a caller scoped to projects learns only the
/// names of its own tasks' (the others count, as [`HeldSandbox::HIDDEN`]).
fn hide_unseen(node: &ControlNode, caller: &Caller, held: &mut [HeldSandbox]) {
    if caller.sees(None) {
        return;
    }
    node.state.with_state(|s| {
        for h in held.iter_mut() {
            let seen = h.task.and_then(|t| s.task(t)).is_some_and(|t| {
                let project = t.spec.placement.project();
                caller.sees(project.as_ref().map(|(t, p)| (t, p)))
            });
            if !seen {
                h.name = HeldSandbox::HIDDEN.to_string();
                h.task = None;
            }
        }
    });
}
