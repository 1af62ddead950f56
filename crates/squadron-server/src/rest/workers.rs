//! Workers: register, heartbeat, list, decommission.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{get, post, put};
use axum::Json;
use squadron_core::command as cmd;
use squadron_core::ids::WorkerId;
use squadron_core::worker::Worker;
use squadron_core::worker_policy::WorkerPolicy;
use squadron_core::{Command, Outcome};

use super::{
    body, json, parse_id, query, read, write, AppState, ConsistencyQuery, Input, JsonBody,
    QueryParams, RouteBook,
};
use crate::authz::Caller;
use crate::error::ApiError;
use squadron_api::workers::HEARTBEAT_INTERVAL_MS_DEFAULT;
use squadron_api::{Access, Decommission, RegisterWorker, Scope};

pub fn routes(book: RouteBook) -> RouteBook {
    book.add(
        "POST",
        "/api/v1/workers",
        "Register (or re-register) a worker",
        body::<squadron_api::RegisterWorker>(),
        json::<Outcome>(),
        Access::worker_only(Scope::Body),
        post(register),
    )
    .add(
        "GET",
        "/api/v1/workers",
        "List workers",
        query::<ConsistencyQuery>(),
        json::<Vec<Worker>>(),
        Access::viewer(Scope::Unbound),
        get(list),
    )
    .add(
        "GET",
        "/api/v1/workers/:id",
        "Get a worker",
        query::<ConsistencyQuery>(),
        json::<Worker>(),
        Access::viewer(Scope::Unbound).and_workers(),
        get(get_worker),
    )
    .add(
        "GET",
        "/api/v1/workers/:id/metrics",
        "What only the worker counts, relayed from it (OpenMetrics text): its warm pool's \
         claims and idle sandboxes",
        Input::NONE,
        super::Answer::text(crate::metrics::OPENMETRICS_CONTENT_TYPE),
        Access::viewer(Scope::Unbound),
        get(worker_metrics),
    )
    .add(
        "POST",
        "/api/v1/workers/:id/heartbeat",
        "Worker heartbeat",
        Input::NONE,
        json::<Outcome>(),
        Access::worker_only(Scope::Worker),
        post(heartbeat),
    )
    .add(
        "PUT",
        "/api/v1/workers/:id/policy",
        "A worker states what it agrees to run: network modes, full_control, repository sources, ceilings",
        body::<squadron_core::worker_policy::WorkerPolicy>(),
        json::<Outcome>(),
        Access::worker_only(Scope::Worker),
        put(set_policy),
    )
    .add(
        "GET",
        "/api/v1/workers/:id/policy",
        "A worker's policy (404 for one that sent none: it is held to nothing)",
        query::<ConsistencyQuery>(),
        json::<WorkerPolicy>(),
        Access::viewer(Scope::Unbound).and_workers(),
        get(get_policy),
    )
    .add(
        "POST",
        "/api/v1/workers/:id/decommission",
        "Operator's audited decision that a worker and its processes are gone: reaps its leases",
        body::<squadron_api::Decommission>(),
        json::<Outcome>(),
        Access::admin(),
        post(decommission),
    )
}

async fn register(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(b): JsonBody<RegisterWorker>,
) -> Result<Json<Outcome>, ApiError> {
    write(&node, &caller, &headers, registration_command(b)).await
}

/// A registration naming a policy sets both in one entry.
fn registration_command(b: RegisterWorker) -> Command {
    let registration = cmd::RegisterWorker {
        worker: b.worker,
        address: b.address,
        runtimes: b.runtimes,
        capacity: b.capacity,
        labels: b.labels,
        heartbeat_interval_ms: b
            .heartbeat_interval_ms
            .unwrap_or(HEARTBEAT_INTERVAL_MS_DEFAULT),
    };
    match b.policy {
        Some(policy) => Command::RegisterWorkerWithPolicy(cmd::RegisterWorkerWithPolicy {
            registration,
            policy,
        }),
        None => Command::RegisterWorker(registration),
    }
}

async fn list(
    State(node): State<AppState>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<Vec<Worker>>, ApiError> {
    read(&node, q.consistency, |s| {
        Ok(Json(s.workers().cloned().collect()))
    })
    .await
}

async fn get_worker(
    State(node): State<AppState>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<Worker>, ApiError> {
    let id: WorkerId = parse_id("worker", &id)?;
    read(&node, q.consistency, |s| {
        s.worker(&id)
            .cloned()
            .map(Json)
            .ok_or_else(|| ApiError::not_found(format!("worker {id} not found")))
    })
    .await
}

async fn worker_metrics(
    State(node): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::response::Response, ApiError> {
    let id: WorkerId = parse_id("worker", &id)?;
    let address = read(&node, crate::node::Consistency::Linearizable, |s| {
        s.worker(&id)
            .map(|w| w.address.clone())
            .ok_or_else(|| ApiError::not_found(format!("worker {id} not found")))
    })
    .await?;
    let worker = super::task_output::WorkerRelay::new(&node, &id, &address)?;
    super::task_output::relay(&worker, "/worker/v1/metrics".to_string(), false).await
}

async fn heartbeat(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Outcome>, ApiError> {
    let worker: WorkerId = parse_id("worker", &id)?;
    write(
        &node,
        &caller,
        &headers,
        Command::WorkerHeartbeat(cmd::WorkerHeartbeat { worker }),
    )
    .await
}

async fn set_policy(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(policy): JsonBody<WorkerPolicy>,
) -> Result<Json<Outcome>, ApiError> {
    let worker: WorkerId = parse_id("worker", &id)?;
    let command = Command::SetWorkerPolicy(cmd::SetWorkerPolicy { worker, policy });
    write(&node, &caller, &headers, command).await
}

async fn get_policy(
    State(node): State<AppState>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<WorkerPolicy>, ApiError> {
    let id: WorkerId = parse_id("worker", &id)?;
    read(&node, q.consistency, |s| {
        s.worker_policy(&id)
            .cloned()
            .map(Json)
            .ok_or_else(|| ApiError::not_found(format!("worker {id} has no policy")))
    })
    .await
}

async fn decommission(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<Decommission>,
) -> Result<Json<Outcome>, ApiError> {
    let worker: WorkerId = parse_id("worker", &id)?;
    write(
        &node,
        &caller,
        &headers,
        Command::DecommissionWorker(cmd::DecommissionWorker {
            worker,
            operator: b.operator,
            reason: b.reason,
        }),
    )
    .await
}
