//! The worker's agent endpoints, which control nodes relay the operator facade to:
//!
//! - `POST /worker/v1/agents/{profile}/launch` ([`LaunchAgent`])
//! - `POST /worker/v1/agents/{profile}/takeover` ([`TakeoverAgent`])
//! - `POST /worker/v1/agents/{profile}/stop` ([`StopAgent`])
//! - `POST /worker/v1/agents/{profile}/reap`
//! - `GET  /worker/v1/agents/{profile}` and `GET /worker/v1/agents`
//! - `GET  /worker/v1/agents/{profile}/logs` (the current generation's output, queried as a
//!   task's logs are: `stream`, `offset`, `tail`, `follow`, `stream=all` with per-file starts;
//!   `generation=N` answers 409 unless N is still the current one; the answer names the
//!   generation in `x-squadron-generation`)
//! - `GET  /worker/v1/evidence/{tenant}/{project}`
//!
//! Bodies are parsed strictly (unknown fields refused) and errors have the control plane's
//! shape, so an operator reads the same error whether a node or the worker refused. The
//! supervisor's own state becomes the wire's `AgentView` here, and nowhere else.

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use squadron_client::{ErrorBody, HeldSandbox, LaunchAgent, StopAgent, TakeoverAgent};
use squadron_core::ids::{Generation, ProfileId, ProjectId, TenantId};

use crate::agent::agent_logs::AgentLogs;
use crate::agent::error::AgentError;
use crate::agent::supervisor::AgentSupervisor;
use crate::output_server::{invalid, log_query, serve_logs};
use crate::runtime::probe::RuntimeSet;
use crate::runtime::task_of_sandbox;

/// Largest request body accepted (a prompt included).
pub(crate) const AGENT_REQUEST_BYTES_MAX: usize = 2 << 20;

/// What the evidence route reads: the supervisor's project, and every task runtime.
#[derive(Clone)]
struct EvidenceSources {
    supervisor: AgentSupervisor,
    runtimes: RuntimeSet,
}

pub(crate) fn router(supervisor: AgentSupervisor, runtimes: RuntimeSet) -> Router {
    let evidence_route = Router::new()
        .route("/worker/v1/evidence/:tenant/:project", get(evidence))
        .with_state(EvidenceSources {
            supervisor: supervisor.clone(),
            runtimes,
        });
    Router::new()
        .route("/worker/v1/agents", get(list))
        .route("/worker/v1/agents/:profile", get(view))
        .route("/worker/v1/agents/:profile/logs", get(logs))
        .route("/worker/v1/agents/:profile/launch", post(launch))
        .route("/worker/v1/agents/:profile/takeover", post(takeover))
        .route("/worker/v1/agents/:profile/stop", post(stop))
        .route("/worker/v1/agents/:profile/reap", post(reap))
        .layer(axum::extract::DefaultBodyLimit::max(
            AGENT_REQUEST_BYTES_MAX,
        ))
        .with_state(supervisor)
        .merge(evidence_route)
}

struct Failure(AgentError);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(ErrorBody::from(self.0))).into_response()
    }
}

impl From<AgentError> for Failure {
    fn from(e: AgentError) -> Self {
        Failure(e)
    }
}

fn profile_id(raw: &str) -> Result<ProfileId, Failure> {
    raw.parse::<u64>()
        .ok()
        .and_then(|n| ProfileId::new(n).ok())
        .ok_or_else(|| {
            Failure(AgentError::invalid(
                "profile",
                format!("{raw:?} is not a profile id (a positive integer)"),
            ))
        })
}

fn body<T: DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, Failure> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse(bytes)
}

fn parse<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, Failure> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "body".to_owned() } else { path };
        Failure(AgentError::invalid(&field, e.inner().to_string()))
    })
}

async fn list(State(s): State<AgentSupervisor>) -> Response {
    let views: Vec<_> = s
        .states()
        .iter()
        .map(|a| a.view(s.worker(), None))
        .collect();
    Json(views).into_response()
}

async fn view(
    State(s): State<AgentSupervisor>,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    let agent = s.state(profile_id(&id)?)?;
    let mut view = agent.view(s.worker(), None);
    view.usage = s.usage_of(&agent).await;
    Ok(Json(view).into_response())
}

async fn logs(
    State(s): State<AgentSupervisor>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, Failure> {
    let (raw, pinned) = split_generation(raw.as_deref().unwrap_or(""))?;
    let q = match log_query(&raw) {
        Ok(q) => q,
        Err(r) => return Ok(invalid(&r.field, r.message)),
    };
    if q.stream == squadron_api::LogStream::Events {
        return Ok(invalid(
            "stream",
            "a provider has no events log: stream=stdout, stderr or all",
        ));
    }
    let files = AgentLogs::current(&s, profile_id(&id)?, pinned)?;
    let generation = files.generation();
    let mut answer = serve_logs(files, q).await;
    answer.headers_mut().insert(
        "x-squadron-generation",
        axum::http::HeaderValue::from(generation.get()),
    );
    Ok(answer)
}

/// The logs query without its `generation=N` pair (the one parameter only an agent's logs
/// take), and that generation.
fn split_generation(raw: &str) -> Result<(String, Option<Generation>), Failure> {
    let mut pinned = None;
    let mut rest = Vec::new();
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        match pair.strip_prefix("generation=") {
            Some(n) => {
                let n = n.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    Failure(AgentError::invalid(
                        "generation",
                        format!("{n:?} is not a generation (a positive integer)"),
                    ))
                })?;
                pinned = Some(Generation::new(n));
            }
            None => rest.push(pair),
        }
    }
    Ok((rest.join("&"), pinned))
}

async fn launch(
    State(s): State<AgentSupervisor>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Result<Response, Failure> {
    let id = profile_id(&id)?;
    let req: LaunchAgent = body(&bytes)?;
    let agent = s.launch(id, req).await?;
    Ok((StatusCode::CREATED, Json(agent.view(s.worker(), None))).into_response())
}

async fn takeover(
    State(s): State<AgentSupervisor>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Result<Response, Failure> {
    let id = profile_id(&id)?;
    let req: TakeoverAgent = parse(&bytes)?;
    let t = s.takeover(id, req).await?;
    Ok(Json(t.agent.view(s.worker(), t.replaced.as_ref())).into_response())
}

async fn stop(
    State(s): State<AgentSupervisor>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Result<Response, Failure> {
    let id = profile_id(&id)?;
    let req: StopAgent = body(&bytes)?;
    let agent = s.stop(id, req).await?;
    Ok(Json(agent.view(s.worker(), None)).into_response())
}

async fn reap(
    State(s): State<AgentSupervisor>,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    let id = profile_id(&id)?;
    Ok(Json(s.reap(id).await?.replaced()).into_response())
}

async fn evidence(
    State(sources): State<EvidenceSources>,
    Path((tenant, project)): Path<(String, String)>,
) -> Result<Response, Failure> {
    let s = sources.supervisor;
    let tenant =
        TenantId::new(tenant).map_err(|e| Failure(AgentError::invalid("tenant", e.to_string())))?;
    let project = ProjectId::new(project)
        .map_err(|e| Failure(AgentError::invalid("project", e.to_string())))?;
    // It hashes the binary (once) and scans the host: off the runtime.
    let mut ev = tokio::task::spawn_blocking(move || s.evidence(&tenant, &project))
        .await
        .map_err(|e| {
            Failure(AgentError::new(
                squadron_core::error_code::ErrorCode::Internal,
                e.to_string(),
            ))
        })?;
    (ev.task_sandboxes, ev.task_sandbox_errors) = task_sandboxes(&sources.runtimes).await;
    Ok(Json(ev).into_response())
}

/// Every runtime's sandboxes with the task each was made for, and the runtimes that could not
/// list theirs, so a sample that could not look is not read as empty.
async fn task_sandboxes(runtimes: &RuntimeSet) -> (Vec<HeldSandbox>, Vec<String>) {
    let (mut all, mut errors) = (Vec::new(), Vec::new());
    for kind in runtimes.kinds() {
        let Some(runtime) = runtimes.get(kind) else {
            continue;
        };
        match runtime.sandboxes().await {
            Ok(names) => all.extend(names.into_iter().map(|name| HeldSandbox {
                runtime: kind,
                task: task_of_sandbox(&name),
                name,
            })),
            Err(e) => errors.push(format!("{kind}: {e}")),
        }
    }
    (all, errors)
}
