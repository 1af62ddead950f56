//! The REST API (`/api/v1`), served by every node. Routes are registered through a
//! [`RouteBook`] that also records them with their access rule, so the OpenAPI document is
//! generated from the same table that builds and guards the router and cannot drift from it.

mod agents;
mod audit;
mod browser_guard;
mod cluster;
pub(crate) mod credentials;
pub(crate) mod enrollment;
mod extract;
pub(crate) mod leases;
pub(crate) mod projects;
mod task_output;
pub(crate) mod tasks;
mod tokens;
mod workers;

use std::sync::{Arc, OnceLock};

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse};
use axum::routing::{get, MethodRouter};
use axum::{Json, Router};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use squadron_api::{Access, Scope};
use squadron_core::ids::IdempotencyKey;
use squadron_core::{Command, Outcome, Response};

use crate::authz::{Caller, RouteGuard};
use crate::error::ApiError;
use crate::node::{Consistency, ControlNode, IDEMPOTENCY_HEADER};

pub use browser_guard::BrowserGuard;
pub use extract::{parse_id, JsonBody, QueryParams};
pub use squadron_api::ConsistencyQuery;

pub type AppState = Arc<ControlNode>;

/// One documented route.
#[derive(Debug, Clone)]
pub struct RouteDoc {
    pub method: &'static str,
    /// The axum path (`/api/v1/tasks/:id`).
    pub path: &'static str,
    pub summary: &'static str,
    /// The request body and query string, if any.
    pub input: Input,
    /// What a success answers.
    pub answer: Answer,
    /// Who may call it.
    pub access: Access,
}

/// A route's inputs besides its path, for the OpenAPI document: the JSON Schemas of its body
/// and of its query string, from the same types the handler decodes.
#[derive(Debug, Clone, Copy)]
pub struct Input {
    /// Adds the body type's schema to the generator's definitions and returns a reference.
    pub body: Option<fn(&mut SchemaGenerator) -> Schema>,
    /// The query type's own (object) schema, whose properties are the query parameters.
    pub query: Option<fn(&mut SchemaGenerator) -> Schema>,
    /// The body may be YAML too (the same document).
    pub yaml: bool,
    /// The body may be left out (empty: every field its default).
    pub optional: bool,
}

impl Input {
    /// No body, no query string.
    pub const NONE: Input = Input {
        body: None,
        query: None,
        yaml: false,
        optional: false,
    };

    /// The body is accepted as YAML as well as JSON.
    pub fn or_yaml(self) -> Self {
        Self { yaml: true, ..self }
    }

    /// The body may be left out.
    pub fn optional(self) -> Self {
        Self {
            optional: true,
            ..self
        }
    }
}

/// A JSON body of type `T`, for [`RouteBook::add`].
pub fn body<T: JsonSchema>() -> Input {
    Input {
        body: Some(|generator| generator.subschema_for::<T>()),
        query: None,
        yaml: false,
        optional: false,
    }
}

/// A query string decoded as `T`, for [`RouteBook::add`].
pub fn query<T: JsonSchema>() -> Input {
    Input {
        body: None,
        query: Some(T::json_schema),
        yaml: false,
        optional: false,
    }
}

/// What a route answers on success, for the OpenAPI document: JSON of a type (its schema from
/// the handler's own answer type), or another media type.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub media_type: &'static str,
    /// The JSON answer's schema; `None` for other media types.
    pub schema: Option<fn(&mut SchemaGenerator) -> Schema>,
    /// `true` for a WebSocket upgrade (101) instead of a 200.
    pub upgrade: bool,
    /// The success status: "200", or "201" for a route that makes something.
    pub status: &'static str,
}

impl Answer {
    pub fn text(media_type: &'static str) -> Self {
        Self {
            media_type,
            schema: None,
            upgrade: false,
            status: "200",
        }
    }

    /// Answered with 201 Created.
    pub fn created(self) -> Self {
        Self {
            status: "201",
            ..self
        }
    }

    pub fn websocket() -> Self {
        Self {
            upgrade: true,
            ..Self::text("application/json")
        }
    }
}

/// The [`Answer`] of a handler that answers `Json<T>`.
pub fn json<T: JsonSchema>() -> Answer {
    Answer {
        media_type: "application/json",
        schema: Some(|generator| generator.subschema_for::<T>()),
        upgrade: false,
        status: "200",
    }
}

/// Builds the router, its documentation and its access rules together: a route cannot be
/// served without a rule, and the document lists exactly what is served.
#[derive(Debug)]
pub struct RouteBook {
    node: AppState,
    router: Router<AppState>,
    pub docs: Vec<RouteDoc>,
}

impl RouteBook {
    fn new(node: AppState) -> Self {
        Self {
            node,
            router: Router::new(),
            docs: Vec::new(),
        }
    }

    fn add(
        mut self,
        method: &'static str,
        path: &'static str,
        summary: &'static str,
        input: Input,
        answer: Answer,
        access: Access,
        handler: MethodRouter<AppState>,
    ) -> Self {
        self.docs.push(RouteDoc {
            method,
            path,
            summary,
            input,
            answer,
            access,
        });
        let guard = RouteGuard {
            node: self.node.clone(),
            access,
        };
        let guarded = handler.route_layer(axum::middleware::from_fn_with_state(
            guard,
            crate::authz::rest_guard,
        ));
        self.router = self.router.route(path, guarded);
        self
    }
}

/// Every route of the API, in one table.
pub fn route_book(node: AppState) -> RouteBook {
    let book = RouteBook::new(node);
    let book = cluster::routes(book);
    let book = projects::routes(book);
    let book = leases::routes(book);
    let book = tasks::routes(book);
    let book = task_output::routes(book);
    let book = agents::routes(book);
    let book = audit::routes(book);
    let book = tokens::routes(book);
    let book = credentials::routes(book);
    let book = enrollment::routes(book);
    let book = workers::routes(book);
    plain_routes(book)
}

/// Health, readiness, metrics, the dashboard's page.
fn plain_routes(book: RouteBook) -> RouteBook {
    book.add(
        "GET",
        "/healthz",
        "Liveness: the process serves requests",
        Input::NONE,
        Answer::text("text/plain"),
        Access::PUBLIC,
        get(|| async { "ok" }),
    )
    .add(
        "GET",
        "/readyz",
        "Readiness: a leader is known",
        Input::NONE,
        Answer::text("text/plain"),
        Access::PUBLIC,
        get(readyz),
    )
    .add(
        "GET",
        "/metrics",
        "Prometheus metrics (OpenMetrics text)",
        Input::NONE,
        Answer::text("application/openmetrics-text"),
        Access::viewer(Scope::Unbound),
        get(crate::metrics::render),
    )
    .add(
        "GET",
        "/",
        "The dashboard's page (its data comes from the API, under the caller's token)",
        Input::NONE,
        Answer::text("text/html"),
        Access::PUBLIC,
        get(|| async { Html(crate::dashboard::PAGE) }),
    )
    .add(
        "GET",
        "/assets/:name",
        "The dashboard's front-end files (xterm.js and its stylesheet, their licences), built \
         into the binary",
        Input::NONE,
        Answer::text("text/javascript"),
        Access::PUBLIC,
        get(crate::dashboard::asset),
    )
}

pub fn router(node: AppState) -> Router {
    // The document describes the book that serves it, so it is filled in once the book is done.
    let document: Arc<OnceLock<serde_json::Value>> = Arc::default();
    let served = document.clone();
    let book = route_book(node.clone()).add(
        "GET",
        "/api/v1/openapi.json",
        "This document: every route with its access rule (x-squadron-access)",
        Input::NONE,
        json::<serde_json::Value>(),
        Access::PUBLIC,
        get(move || {
            let doc = served.get().cloned().unwrap_or_default();
            async move { Json(doc) }
        }),
    );
    let _ = document.set(crate::openapi::document(&book.docs));
    let body_limit = node.config.server.body_bytes_max;
    // Routes sharing a path with different methods merge inside axum; the book documents each.
    book.router
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(axum::middleware::from_fn_with_state(
            BrowserGuard::for_node(&node.config),
            browser_guard::guard,
        ))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(
            node.clone(),
            crate::request_latency::layer,
        ))
        .layer(axum::middleware::from_fn(crate::trace::layer))
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
    #[cfg(feature = "jepsen-faults")]
    if crate::jepsen_fault::forget_idempotency_keys() {
        return Ok(None);
    }
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

/// Proposes a command and turns the replicated answer into HTTP: an outcome is 200 with its
/// JSON, a rejection is the status of its error code with `{code, message, rejection}`.
pub async fn write(
    node: &ControlNode,
    caller: &Caller,
    headers: &HeaderMap,
    command: Command,
) -> Result<Json<Outcome>, ApiError> {
    write_as(node, caller.subject()?, headers, command).await
}

/// [`write`] under an explicit subject (enrollment: the node itself, for a caller whose only
/// credential is the token the command checks).
pub async fn write_as(
    node: &ControlNode,
    subject: squadron_core::access::Subject,
    headers: &HeaderMap,
    command: Command,
) -> Result<Json<Outcome>, ApiError> {
    let key = idempotency_key(headers)?;
    write_keyed(node, subject, key, command).await.map(Json)
}

/// [`write_as`] with the idempotency key already read (gRPC carries it in metadata).
pub async fn write_keyed(
    node: &ControlNode,
    subject: squadron_core::access::Subject,
    key: Option<IdempotencyKey>,
    command: Command,
) -> Result<Outcome, ApiError> {
    match node.write(subject, command, key).await? {
        Response::Ok(outcome) => Ok(outcome),
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
