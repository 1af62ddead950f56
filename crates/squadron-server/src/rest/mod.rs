//! The REST API (`/api/v1`), served by every node. Routes are registered through a
//! [`RouteBook`] that also records them, so the OpenAPI document is generated from the same
//! table that builds the router and cannot drift from it.

mod agents;
mod audit;
mod browser_guard;
mod cluster;
mod extract;
mod leases;
mod projects;
mod task_output;
mod tasks;
mod tokens;
mod workers;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse};
use axum::routing::{get, MethodRouter};
use axum::{Json, Router};
use serde::Serialize;
use squadron_core::access::Subject;
use squadron_core::ids::IdempotencyKey;
use squadron_core::{Command, Outcome, Response};

use crate::error::ApiError;
use crate::node::{Consistency, ControlNode, IDEMPOTENCY_HEADER};

pub use browser_guard::BrowserGuard;
pub use extract::{parse_id, ConsistencyQuery, JsonBody, QueryParams};

pub type AppState = Arc<ControlNode>;

/// One documented route.
#[derive(Debug, Clone, Serialize)]
pub struct RouteDoc {
    pub method: &'static str,
    /// The axum path (`/api/v1/tasks/:id`).
    pub path: &'static str,
    pub summary: &'static str,
    /// Name of the request body, if any.
    pub body: Option<&'static str>,
}

/// Builds the router and its documentation together.
#[derive(Debug)]
pub struct RouteBook {
    router: Router<AppState>,
    pub docs: Vec<RouteDoc>,
}

impl RouteBook {
    fn new() -> Self {
        Self {
            router: Router::new(),
            docs: Vec::new(),
        }
    }

    fn add(
        mut self,
        method: &'static str,
        path: &'static str,
        summary: &'static str,
        body: Option<&'static str>,
        handler: MethodRouter<AppState>,
    ) -> Self {
        self.docs.push(RouteDoc {
            method,
            path,
            summary,
            body,
        });
        self.router = self.router.route(path, handler);
        self
    }
}

/// Every public route of the API, in one table.
pub fn route_book() -> RouteBook {
    let book = RouteBook::new();
    let book = cluster::routes(book);
    let book = projects::routes(book);
    let book = leases::routes(book);
    let book = tasks::routes(book);
    let book = task_output::routes(book);
    let book = agents::routes(book);
    let book = audit::routes(book);
    let book = tokens::routes(book);
    workers::routes(book)
}

pub fn router(node: AppState) -> Router {
    let book = route_book();
    let openapi = crate::openapi::document(&book.docs);
    let body_limit = node.config.server.body_bytes_max;
    // Routes sharing a path with different methods merge inside axum; the book documents each.
    book.router
        .route(
            "/api/v1/openapi.json",
            get(move || {
                let doc = openapi.clone();
                async move { Json(doc) }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(crate::metrics::render))
        .route("/", get(|| async { Html(crate::dashboard::PAGE) }))
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(axum::middleware::from_fn_with_state(
            BrowserGuard::for_node(&node.config),
            browser_guard::guard,
        ))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(node)
}

async fn readyz(State(node): State<AppState>) -> impl IntoResponse {
    match node.leader() {
        Some((leader, _)) => (StatusCode::OK, format!("ready; leader {leader}")),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no leader known".to_string(),
        ),
    }
}

/// The idempotency key a client sent, if any.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    match headers.get(IDEMPOTENCY_HEADER) {
        None => Ok(None),
        Some(v) => {
            let s = v
                .to_str()
                .map_err(|_| ApiError::invalid("Idempotency-Key", "must be ASCII"))?;
            Ok(Some(IdempotencyKey::new(s)?))
        }
    }
}

/// Who the caller of a request is. Until callers authenticate (the trust boundary's
/// listeners), commands are applied exactly as before subjects existed.
fn caller(_headers: &HeaderMap) -> Subject {
    Subject::Legacy
}

/// Proposes a command and turns the replicated answer into HTTP: an outcome is 200 with its
/// JSON, a rejection is the status of its error code with `{code, message, rejection}`.
pub async fn write(
    node: &ControlNode,
    headers: &HeaderMap,
    command: Command,
) -> Result<Json<Outcome>, ApiError> {
    let key = idempotency_key(headers)?;
    match node.write(caller(headers), command, key).await? {
        Response::Ok(outcome) => Ok(Json(outcome)),
        Response::Rejected(r) => Err(r.into()),
    }
}

/// The first `limit` of `items` (fetched as `limit + 1` to know whether more follow) and the
/// `after` value that continues the listing, if more do.
pub fn page<T>(mut items: Vec<T>, limit: usize, key: impl Fn(&T) -> u64) -> (Vec<T>, Option<u64>) {
    if items.len() <= limit {
        return (items, None);
    }
    items.truncate(limit);
    let next = items.last().map(key);
    (items, next)
}

/// Runs a read against local state after the barrier the caller's consistency asks for.
pub async fn read<T, F>(node: &ControlNode, consistency: Consistency, f: F) -> Result<T, ApiError>
where
    F: FnOnce(&squadron_core::State) -> Result<T, ApiError>,
{
    node.read_barrier(consistency).await?;
    node.state.with_state(f)
}
