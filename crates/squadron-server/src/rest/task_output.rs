//! A task's output and artifacts, on any node. Output never passes through Raft: the node
//! looks up which worker runs the task and relays the worker's own HTTP answer, streamed.
//!
//! Worker side: `squadron-worker`'s output server (`/worker/v1/tasks/{id}/…`).

use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::get;
use futures_util::StreamExt;
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{TaskId, WorkerId};

use super::{json, parse_id, query, read, Answer, AppState, Input, QueryParams, RouteBook};
use crate::error::ApiError;
use crate::node::Consistency;
use squadron_api::{Access, Scope, StreamQuery};

/// How long a relayed non-streaming request to a worker may take.
pub const WORKER_REQUEST_TIMEOUT_MS: u64 = 30_000;
/// Longest query string relayed to a worker.
pub const RELAY_QUERY_BYTES_MAX: usize = 1_024;
/// Longest artifact name accepted in a path.
pub const ARTIFACT_NAME_BYTES_MAX: usize = 1_024;
/// Longest line of the worker's stream relayed as one WebSocket message.
pub const STREAM_FRAME_BYTES_MAX: usize = 256 * 1024;
/// The subprotocol the stream answers with. A browser sends its token as a second offered
/// subprotocol (`bearer.<token>`, read by the access guard); answering with this one instead
/// keeps the secret out of the response, and a browser that offered protocols fails a
/// handshake that selects none.
pub const STREAM_PROTOCOL: &str = "squadron.v1";

pub fn routes(book: RouteBook) -> RouteBook {
    book.add(
        "GET",
        "/api/v1/tasks/:id/logs",
        "A task's output: ?stream=stdout|stderr|events&offset=N&tail=N&follow=true",
        query::<squadron_api::LogQuery>(),
        Answer::text("text/plain"),
        Access::viewer(Scope::Task).and_agents(),
        get(logs),
    )
    .add(
        "GET",
        "/api/v1/tasks/:id/usage",
        "What the task's sandbox uses now (CPU time, memory, disk), measured by its worker: \
         process-runtime tasks; a Docker or KVM task's agent reports its own \
         (/api/v1/tasks/{id}/agent)",
        Input::NONE,
        json::<squadron_api::TaskUsage>(),
        Access::viewer(Scope::Task),
        get(usage),
    )
    .add(
        "GET",
        "/api/v1/tasks/:id/artifacts",
        "List a task's artifacts (name, size)",
        Input::NONE,
        json::<Vec<squadron_api::ArtifactEntry>>(),
        Access::viewer(Scope::Task).and_agents(),
        get(artifacts),
    )
    .add(
        "GET",
        "/api/v1/tasks/:id/artifacts/*name",
        "Download one artifact (streamed)",
        Input::NONE,
        Answer::text("application/octet-stream"),
        Access::viewer(Scope::Task).and_agents(),
        get(artifact),
    )
    .add(
        "GET",
        "/ws/tasks/:id/stream",
        "WebSocket: live output frames of a task, then its final state. The token goes in \
         Authorization or, from a browser, as the subprotocol bearer.<token> offered beside \
         squadron.v1 (never in the URL); ?stdout_offset=N&stderr_offset=N start each file \
         where a logs read ended",
        query::<StreamQuery>(),
        Answer::websocket(),
        Access::viewer(Scope::Task).and_agents(),
        get(stream),
    )
}

/// The output server of the worker that runs (or ran) the task.
async fn worker_base(node: &AppState, id: TaskId) -> Result<WorkerRelay, ApiError> {
    let (worker, address) = read(node, Consistency::Linearizable, |s| {
        let task = s
            .task(id)
            .ok_or_else(|| super::tasks::task_not_found(s, id))?;
        let worker = task.worker.as_ref().ok_or_else(|| {
            ApiError::new(
                ErrorCode::FailedPrecondition,
                format!(
                    "task {id} has not been assigned to a worker yet (state {}): no output exists",
                    task.state
                ),
            )
        })?;
        let w = s
            .worker(worker)
            .ok_or_else(|| ApiError::not_found(format!("worker {worker} not found")))?;
        Ok((worker.clone(), w.address.clone()))
    })
    .await?;
    WorkerRelay::new(node, &worker, &address)
}

fn relay_query(raw: Option<String>) -> Result<String, ApiError> {
    match raw {
        None => Ok(String::new()),
        Some(q) if q.len() > RELAY_QUERY_BYTES_MAX => Err(ApiError::invalid(
            "query",
            format!("longer than {RELAY_QUERY_BYTES_MAX} bytes"),
        )),
        Some(q) => Ok(format!("?{q}")),
    }
}

/// Where a relay goes: the worker's output server over mTLS, with the client that accepts
/// only that worker's certificate.
#[derive(Debug, Clone)]
pub(crate) struct WorkerRelay {
    pub(crate) client: reqwest::Client,
    /// `https://host:port`, whatever scheme the worker registered with: nothing is relayed
    /// in plaintext.
    pub(crate) base: String,
}

impl WorkerRelay {
    pub(crate) fn new(node: &AppState, worker: &WorkerId, address: &str) -> Result<Self, ApiError> {
        let client = node
            .tls
            .worker_client(worker)
            .map_err(|e| ApiError::internal(format!("the relay client: {e}")))?;
        let authority = address
            .split_once("://")
            .map_or(address, |(_, rest)| rest)
            .trim_end_matches('/');
        Ok(WorkerRelay {
            client,
            base: format!("https://{authority}"),
        })
    }

    fn get(&self, path: &str, streaming: bool) -> reqwest::RequestBuilder {
        let get = self.client.get(format!("{}{path}", self.base));
        if streaming {
            get
        } else {
            get.timeout(Duration::from_millis(WORKER_REQUEST_TIMEOUT_MS))
        }
    }
}

/// The worker's headers an answer keeps: its type and file name, and where a log read ended
/// and how long the file is (a client pages on, or streams on, from there).
const RELAYED_HEADERS: [&str; 5] = [
    "content-type",
    "content-disposition",
    "x-squadron-next-offset",
    "x-squadron-size",
    "x-squadron-generation",
];

/// Sends GET `path` to the worker and turns its answer into ours, body streamed through.
pub(crate) async fn relay(
    worker: &WorkerRelay,
    path: String,
    streaming: bool,
) -> Result<Response, ApiError> {
    let answer = worker
        .get(&path, streaming)
        .send()
        .await
        .map_err(|e| ApiError::unavailable(format!("the task's worker did not answer: {e}")))?;
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let kept: Vec<(HeaderName, HeaderValue)> = RELAYED_HEADERS
        .iter()
        .filter_map(|name| {
            let value = answer.headers().get(*name)?;
            let value = HeaderValue::from_bytes(value.as_bytes()).ok()?;
            Some((HeaderName::from_static(name), value))
        })
        .collect();
    let mut response = Response::new(Body::from_stream(answer.bytes_stream()));
    *response.status_mut() = status;
    response.headers_mut().extend(kept);
    Ok(response)
}

async fn logs(
    State(node): State<AppState>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let id: TaskId = parse_id("task_id", &id)?;
    let worker = worker_base(&node, id).await?;
    relay_logs(&worker, format!("/worker/v1/tasks/{id}/logs"), q).await
}

/// A logs read relayed to the worker's `path` with the caller's query as it came (the worker
/// decodes it); a follow streams for as long as the worker's answer does.
pub(crate) async fn relay_logs(
    worker: &WorkerRelay,
    path: String,
    raw_query: Option<String>,
) -> Result<Response, ApiError> {
    let query = relay_query(raw_query)?;
    let follow = query.contains("follow=true");
    relay(worker, format!("{path}{query}"), follow).await
}

async fn usage(State(node): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let id: TaskId = parse_id("task_id", &id)?;
    let worker = worker_base(&node, id).await?;
    relay(&worker, format!("/worker/v1/tasks/{id}/usage"), false).await
}

async fn artifacts(
    State(node): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: TaskId = parse_id("task_id", &id)?;
    let worker = worker_base(&node, id).await?;
    relay(&worker, format!("/worker/v1/tasks/{id}/artifacts"), false).await
}

/// Refuses names that could leave the artifacts directory before anything is sent on.
pub fn check_artifact_name(name: &str) -> Result<(), ApiError> {
    let bad = |why: &str| Err(ApiError::invalid("name", format!("artifact name {why}")));
    if name.is_empty() {
        return bad("is empty");
    }
    if name.len() > ARTIFACT_NAME_BYTES_MAX {
        return bad("is too long");
    }
    if name.starts_with('/') || name.contains('\\') || name.contains('\0') {
        return bad("must be a relative path");
    }
    if name
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return bad("must not contain empty, '.' or '..' components");
    }
    Ok(())
}

async fn artifact(
    State(node): State<AppState>,
    Path((id, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let id: TaskId = parse_id("task_id", &id)?;
    check_artifact_name(&name)?;
    let worker = worker_base(&node, id).await?;
    let encoded: Vec<String> = name.split('/').map(percent_encode_segment).collect();
    relay(
        &worker,
        format!("/worker/v1/tasks/{id}/artifacts/{}", encoded.join("/")),
        true,
    )
    .await
}

fn percent_encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

async fn stream(
    State(node): State<AppState>,
    Path(id): Path<String>,
    QueryParams(from): QueryParams<StreamQuery>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let id: TaskId = parse_id("task_id", &id)?;
    if from.generation.is_some() {
        return Err(ApiError::invalid(
            "generation",
            "a task's stream has no generation (an agent's stream takes one)",
        ));
    }
    check_offered_protocols(&headers)?;
    let worker = worker_base(&node, id).await?;
    let path = format!("/worker/v1/tasks/{id}/logs{}", follow_all(&from));
    Ok(relay_upgrade(ws, worker, path, move || {
        let task = node.state.with_state(|s| s.task(id));
        serde_json::json!({"type": "task", "task": task})
    }))
}

/// A client that sends its token as a subprotocol must offer [`STREAM_PROTOCOL`] too: the
/// answer has to select one it offered, and it may never be the one holding the secret.
pub(crate) fn check_offered_protocols(headers: &HeaderMap) -> Result<(), ApiError> {
    let offered: Vec<&str> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|list| list.split(',').map(str::trim))
        .collect();
    let bearer = offered
        .iter()
        .any(|p| p.starts_with(crate::authz::WS_BEARER_PROTOCOL_PREFIX));
    if bearer && !offered.contains(&STREAM_PROTOCOL) {
        return Err(ApiError::invalid(
            "Sec-WebSocket-Protocol",
            format!("offer {STREAM_PROTOCOL} beside the bearer subprotocol"),
        ));
    }
    Ok(())
}

/// Relays the worker's NDJSON frames (`{"stream":"stdout","offset":…,"data":"…"}`) as text
/// messages, then sends the task's final record as `{"type":"task","task":…}` and closes.
/// Answers the upgrade with [`STREAM_PROTOCOL`] and relays the worker's frames at `path`;
/// once they end, `last()` is the final message (read then, not at the upgrade) and the
/// socket closes.
pub(crate) fn relay_upgrade(
    ws: WebSocketUpgrade,
    worker: WorkerRelay,
    path: String,
    last: impl FnOnce() -> serde_json::Value + Send + 'static,
) -> Response {
    ws.protocols([STREAM_PROTOCOL])
        .on_upgrade(move |mut socket| async move {
            if relay_frames(&worker, &path, &mut socket).await {
                let _ = socket.send(Message::Text(last().to_string())).await;
                let _ = socket.send(Message::Close(None)).await;
            }
        })
}

/// The worker's query for both files interleaved, followed, from where `from` says.
pub(crate) fn follow_all(from: &StreamQuery) -> String {
    let pinned = from
        .generation
        .map(|g| format!("&generation={g}"))
        .unwrap_or_default();
    format!(
        "?stream=all&follow=true&stdout_offset={}&stderr_offset={}{pinned}",
        from.stdout_offset.unwrap_or(0),
        from.stderr_offset.unwrap_or(0)
    )
}

/// Relays the worker's NDJSON frames at `path` as text messages until its answer ends:
/// `true` then, `false` when the worker refused (an error frame was sent) or the client left.
async fn relay_frames(worker: &WorkerRelay, path: &str, socket: &mut WebSocket) -> bool {
    let answer = match worker.get(path, true).send().await {
        Ok(a) if a.status().is_success() => a,
        Ok(a) => {
            let msg = format!(
                r#"{{"type":"error","message":"worker answered {}"}}"#,
                a.status()
            );
            let _ = socket.send(Message::Text(msg)).await;
            return false;
        }
        Err(e) => {
            let msg =
                serde_json::json!({"type": "error", "message": format!("worker unreachable: {e}")});
            let _ = socket.send(Message::Text(msg.to_string())).await;
            return false;
        }
    };
    let mut body = answer.bytes_stream();
    let mut pending: Vec<u8> = Vec::new();
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { break };
        pending.extend_from_slice(&chunk);
        while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=pos).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            if text.is_empty() {
                continue;
            }
            if socket.send(Message::Text(text)).await.is_err() {
                return false;
            }
        }
        if pending.len() > STREAM_FRAME_BYTES_MAX {
            // A frame this long is not one the worker writes: drop it rather than grow.
            pending.clear();
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offering(lists: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for l in lists {
            h.append(
                header::SEC_WEBSOCKET_PROTOCOL,
                HeaderValue::from_str(l).unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_bearer_subprotocol_comes_with_the_stream_s_own() {
        for ok in [
            &[][..],
            &["squadron.v1"],
            &["squadron.v1, bearer.sqd_op_x_y"],
            &["bearer.sqd_op_x_y", "squadron.v1"],
        ] {
            assert!(check_offered_protocols(&offering(ok)).is_ok(), "{ok:?}");
        }
        let e = check_offered_protocols(&offering(&["bearer.sqd_op_x_secret"])).unwrap_err();
        assert_eq!(e.body.field.as_deref(), Some("Sec-WebSocket-Protocol"));
        assert!(!e.body.message.contains("secret"), "{e:?}");
    }
}
