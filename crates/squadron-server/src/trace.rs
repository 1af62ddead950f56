//! Trace ids on this node: each request on the REST and gRPC listeners gets one (the caller's
//! `traceparent`, else a new one), answered in the response's `traceparent`, and held in a
//! task-local for the request's handler. The write path reads it there: a forwarded write
//! carries it to the leader (`ProposeRequest::trace_id`), and the proposal batcher names it in
//! the "command applied" line with the entry's log index. Nothing replicated holds it: the log
//! index links the leader's line to every node's apply.

use std::future::Future;
use std::time::Instant;

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use squadron_api::{TraceId, TRACEPARENT_HEADER};
use tracing::Instrument;

tokio::task_local! {
    static CURRENT: TraceId;
}

/// The trace id of the request this task serves, if it serves one.
pub fn current() -> Option<TraceId> {
    CURRENT.try_with(|t| *t).ok()
}

/// Runs `work` under `trace` (a forwarded write's, on the leader).
pub async fn within<F: Future>(trace: Option<TraceId>, work: F) -> F::Output {
    match trace {
        Some(t) => CURRENT.scope(t, work).await,
        None => work.await,
    }
}

/// The REST and gRPC listeners' layer. Every line logged while the handler runs is in the
/// `request` span that holds the id; the request's own line (method, path, status, time) is at
/// debug, as a line per request would flood a busy node's log at info.
pub async fn layer(request: Request, next: Next) -> Response {
    let trace = request
        .headers()
        .get(TRACEPARENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(TraceId::from_traceparent)
        .unwrap_or_else(TraceId::random);
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let started = Instant::now();
    let span = tracing::info_span!("request", trace_id = %trace);
    let mut response = CURRENT
        .scope(trace, next.run(request))
        .instrument(span)
        .await;
    if let Ok(value) = HeaderValue::from_str(&trace.traceparent()) {
        response.headers_mut().insert(TRACEPARENT_HEADER, value);
    }
    let status = response.status().as_u16();
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    tracing::debug!(trace_id = %trace, %method, path, status, elapsed_ms, "request");
    response
}
