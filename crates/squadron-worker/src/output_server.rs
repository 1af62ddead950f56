//! The worker's output server: a task's logs (range, tail, follow), its artifacts (list and
//! streamed download) and a live NDJSON stream. Control nodes relay these to REST and
//! WebSocket clients (`/api/v1/tasks/{id}/logs`, `/ws/tasks/{id}/stream`); output never
//! passes through Raft.

use std::collections::BTreeSet;
use std::io::SeekFrom;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use squadron_api::queries::{decode_query, QueryRefusal};
use squadron_api::{LogQuery, LogStream};
use squadron_client::{ArtifactEntry, ErrorBody};
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::TaskId;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;

use crate::agent::supervisor::AgentSupervisor;
use crate::runtime::probe::RuntimeSet;
use crate::task::credential_session::{LiveRedactions, Redactor, REDACTED_FILE_BYTES_MAX};
use crate::task::outbox_reader::{self, OutboxError};
use crate::task::task_dir::{TaskDir, EVENTS_LOG, STDERR_LOG, STDOUT_LOG};
use crate::task::task_usage::{self, UsageUnavailable};
use crate::task::task_volume::TaskVolume;

/// Largest chunk one read of a log returns; a caller pages on with `offset`.
pub(crate) const LOG_READ_BYTES_MAX: u64 = 8 * 1024 * 1024;
/// Bytes scanned from the end of a file to find the tail's lines.
pub(crate) const TAIL_SCAN_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// How often a follower looks for appended output.
pub(crate) const FOLLOW_POLL_MS: u64 = 200;
/// How long a read waits for a task's files to move out of its volume (the moment between
/// the unmount and the move), in polls of this many ms.
const RETIREMENT_WAIT_POLL_MS: u64 = 10;
const RETIREMENT_WAIT_POLLS_MAX: u32 = 200;
/// Largest piece of output one stream frame carries.
pub(crate) const FRAME_DATA_BYTES_MAX: usize = 64 * 1024;
/// A follow ends after this long even if the task still runs; the caller reconnects with
/// the offset it reached.
pub(crate) const FOLLOW_DURATION_MS_MAX: u64 = 6 * 60 * 60 * 1000;
/// Most artifacts listed.
pub(crate) const ARTIFACT_LIST_MAX: usize = 10_000;

/// Tasks whose provider may still write output; a follow ends once its task leaves the set
/// and the files are drained.
#[derive(Debug, Clone, Default)]
pub(crate) struct ActiveTasks(Arc<Mutex<BTreeSet<TaskId>>>);

impl ActiveTasks {
    pub(crate) fn insert(&self, id: TaskId) {
        if let Ok(mut s) = self.0.lock() {
            s.insert(id);
        }
    }
    pub(crate) fn remove(&self, id: TaskId) {
        if let Ok(mut s) = self.0.lock() {
            s.remove(&id);
        }
    }
    pub(crate) fn contains(&self, id: TaskId) -> bool {
        self.0.lock().map(|s| s.contains(&id)).unwrap_or(false)
    }
}

#[derive(Debug, Clone)]
struct ServerState {
    data_dir: PathBuf,
    active: ActiveTasks,
    redactions: LiveRedactions,
    runtimes: RuntimeSet,
    /// For `placement: project` tasks, whose sandboxes are the agent supervisor's.
    agents: Option<AgentSupervisor>,
}

pub(crate) fn router(
    data_dir: PathBuf,
    active: ActiveTasks,
    redactions: LiveRedactions,
    runtimes: RuntimeSet,
    agents: Option<AgentSupervisor>,
) -> Router {
    Router::new()
        .route("/worker/v1/tasks/:id/logs", get(logs))
        .route("/worker/v1/tasks/:id/usage", get(usage))
        .route("/worker/v1/tasks/:id/artifacts", get(list_artifacts))
        .route("/worker/v1/tasks/:id/artifacts/*name", get(artifact))
        .route("/worker/v1/build", get(build))
        .route("/worker/v1/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(ServerState {
            data_dir,
            active,
            redactions,
            runtimes,
            agents,
        })
}

/// An error answer, in the control plane's error body (`{code, message, field?}`).
fn error(status: StatusCode, code: ErrorCode, field: Option<&str>, m: String) -> Response {
    let body = ErrorBody {
        code,
        message: m,
        field: field.map(str::to_owned),
        rejection: None,
    };
    (status, Json(body)).into_response()
}

/// The logs query through the one query decoder; a parameter the query does not have is
/// refused as `query`, as this server always named it.
pub(crate) fn log_query(raw: &str) -> Result<LogQuery, QueryRefusal> {
    decode_query(raw).map_err(|mut r| {
        if ![
            "stream",
            "offset",
            "tail",
            "follow",
            "stdout_offset",
            "stderr_offset",
        ]
        .contains(&r.field.as_str())
        {
            r.field = "query".into();
        }
        r
    })
}

pub(crate) fn invalid(field: &str, m: impl Into<String>) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidArgument,
        Some(field),
        m.into(),
    )
}

fn not_found(m: impl Into<String>) -> Response {
    error(StatusCode::NOT_FOUND, ErrorCode::NotFound, None, m.into())
}

/// This worker's binary digest, for the release evidence's "one build" claim: every worker
/// of the cluster is asked, not only the sandbox's.
async fn build() -> Response {
    // Hashed once per process (at start, `worker.rs`).
    let sha256 = squadron_pki::own_binary_sha256_or_empty().await;
    Json(squadron_client::WorkerBuild { sha256 }).into_response()
}

async fn metrics(State(state): State<ServerState>) -> Response {
    crate::worker_metrics::render(&state.runtimes)
}

/// The sandbox's usage now (`task_usage`): not output, so a task whose output is withheld
/// still answers it.
async fn usage(State(state): State<ServerState>, UrlPath(raw): UrlPath<String>) -> Response {
    let id = match task_id(&raw) {
        Ok(id) => id,
        Err(refused) => return refused,
    };
    let dir = TaskDir::new(&state.data_dir, id);
    match task_usage::measure(&state.runtimes, state.agents.as_ref(), &dir).await {
        Ok(usage) => Json(usage).into_response(),
        Err(e @ UsageUnavailable::NoAttempt(_)) => not_found(e.to_string()),
        Err(e @ (UsageUnavailable::AgentReports(..) | UsageUnavailable::NotMeasured(_))) => error(
            StatusCode::CONFLICT,
            ErrorCode::FailedPrecondition,
            None,
            e.to_string(),
        ),
        Err(UsageUnavailable::Worker(e)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            None,
            e.to_string(),
        ),
    }
}

// The error is the handler's own response, returned at once: boxing it would buy nothing.
#[allow(clippy::result_large_err)]
fn task_id(raw: &str) -> Result<TaskId, Response> {
    raw.parse::<u64>()
        .ok()
        .and_then(|n| TaskId::new(n).ok())
        .ok_or_else(|| invalid("task_id", format!("{raw:?} is not a task id")))
}

#[allow(clippy::result_large_err)]
async fn task_dir(state: &ServerState, raw: &str) -> Result<TaskDir, Response> {
    let id = task_id(raw)?;
    let dir = TaskDir::new(&state.data_dir, id);
    // A task's files move out of its disk-quota volume once it ended; a read waits the
    // moment that takes rather than find the outbox missing.
    let volume = TaskVolume::of(&state.data_dir, &dir);
    for _ in 0..RETIREMENT_WAIT_POLLS_MAX {
        if !volume.retiring() || dir.outbox().exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(RETIREMENT_WAIT_POLL_MS)).await;
    }
    if !dir.root().is_dir() {
        return Err(not_found(format!("task {id} has no files on this worker")));
    }
    if let Some(why) = crate::task::output_retention::removed_message(&dir) {
        return Err(not_found(why));
    }
    if let Ok(files) = std::fs::read_to_string(dir.unredacted_marker()) {
        return Err(error(
            StatusCode::FORBIDDEN,
            ErrorCode::PermissionDenied,
            None,
            format!(
                "task {id}'s output could not be redacted ({}); it is not served",
                files.lines().collect::<Vec<_>>().join("; ")
            ),
        ));
    }
    Ok(dir)
}

fn file_of(s: LogStream) -> &'static str {
    match s {
        LogStream::Stdout | LogStream::All => STDOUT_LOG,
        LogStream::Stderr => STDERR_LOG,
        LogStream::Events => EVENTS_LOG,
    }
}

/// The answer for an outbox file the worker will not serve, or could not read.
fn outbox_error(e: OutboxError) -> Response {
    match e {
        OutboxError::Missing(m) => not_found(m),
        OutboxError::BadName(m) => invalid("name", m),
        OutboxError::Refused(m) => {
            error(StatusCode::FORBIDDEN, ErrorCode::PermissionDenied, None, m)
        }
        OutboxError::Io(m) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            None,
            m,
        ),
    }
}

/// What a read of a log sees: the file itself, or — while the task holds credentials — its
/// redacted view (`Redactor::view`), whose offsets are the ones the rewritten file will have.
pub(crate) enum LogSource {
    File(Option<tokio::fs::File>),
    View(Vec<u8>),
}

impl LogSource {
    async fn read(&mut self, start: u64, end: u64) -> Vec<u8> {
        match self {
            LogSource::File(file) => read_range(file.as_mut(), start, end).await,
            LogSource::View(bytes) => {
                let len = bytes.len() as u64;
                let (start, end) = (start.min(len), end.min(len));
                bytes[start as usize..end.max(start) as usize].to_vec()
            }
        }
    }
}

/// A progress file and its length (0 while it does not exist), through the task's redactor
/// when it has one.
async fn open_log(
    dir: &TaskDir,
    name: &'static str,
    redactions: &LiveRedactions,
) -> Result<(LogSource, u64), OutboxError> {
    let file = outbox_reader::open_progress(dir, name)?;
    source_of(file, redactions.get(dir.task()), name).await
}

/// A log file (`None` while it does not exist) and its length, as `redactor` shows it when
/// there is one.
pub(crate) async fn source_of(
    file: Option<tokio::fs::File>,
    redactor: Option<Arc<Redactor>>,
    name: &str,
) -> Result<(LogSource, u64), OutboxError> {
    let len = match &file {
        Some(f) => f.metadata().await.map(|m| m.len()).unwrap_or(0),
        None => 0,
    };
    let Some(redactor) = redactor else {
        return Ok((LogSource::File(file), len));
    };
    if len > REDACTED_FILE_BYTES_MAX {
        return Err(OutboxError::Io(format!(
            "{name} is over {REDACTED_FILE_BYTES_MAX} bytes while its writer's output is \
             redacted; read it once the attempt has ended"
        )));
    }
    let mut file = file;
    let raw = read_range(file.as_mut(), 0, len).await;
    // Up to 64 MiB scanned: off the runtime's threads.
    let view = tokio::task::spawn_blocking(move || redactor.view(&raw))
        .await
        .map_err(|e| OutboxError::Io(format!("redacting {name}: {e}")))?;
    let len = view.len() as u64;
    Ok((LogSource::View(view), len))
}

async fn logs(
    State(state): State<ServerState>,
    UrlPath(id): UrlPath<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let q: LogQuery = match log_query(raw.as_deref().unwrap_or("")) {
        Ok(q) => q,
        Err(r) => return invalid(&r.field, r.message),
    };
    match task_dir(&state, &id).await {
        Ok(dir) => serve_logs(TaskFiles { state, dir }, q).await,
        Err(r) => r,
    }
}

/// The files one log read serves, beneath a root their writer (a sandbox) can change: a task
/// attempt's progress files, or a profile generation's logs (`agent::agent_logs`).
pub(crate) trait LogFiles: Clone + Send + Sync + 'static {
    /// The file of `stream` and its length (0 while it does not exist), redacted while its
    /// writer holds credentials.
    fn open(
        &self,
        stream: LogStream,
    ) -> impl std::future::Future<Output = Result<(LogSource, u64), OutboxError>> + Send;
    /// Whether its writer may still append.
    fn writing(&self) -> bool;
}

/// A task attempt's progress files.
#[derive(Clone)]
struct TaskFiles {
    state: ServerState,
    dir: TaskDir,
}

impl LogFiles for TaskFiles {
    async fn open(&self, stream: LogStream) -> Result<(LogSource, u64), OutboxError> {
        open_log(&self.dir, file_of(stream), &self.state.redactions).await
    }

    fn writing(&self) -> bool {
        self.state.active.contains(self.dir.task())
    }
}

/// One log read of `files`: a range, a tail, a follow of one file, or both files
/// interleaved as NDJSON frames (`stream=all`).
pub(crate) async fn serve_logs<F: LogFiles>(files: F, q: LogQuery) -> Response {
    if q.offset.is_some() && q.tail.is_some() {
        return invalid("tail", "give offset or tail, not both");
    }
    if q.stream == LogStream::All {
        if !q.follow {
            return invalid("stream", "stream=all is only served with follow=true");
        }
        if q.offset.is_some() || q.tail.is_some() {
            let field = if q.offset.is_some() { "offset" } else { "tail" };
            return invalid(
                field,
                "stream=all starts where stdout_offset and stderr_offset say",
            );
        }
        let start = [q.stdout_offset.unwrap_or(0), q.stderr_offset.unwrap_or(0)];
        return ndjson_follow(files, start);
    }
    if let Some(field) = per_stream_offset(&q) {
        return invalid(field, "only stream=all takes a start per file; use offset");
    }
    let (mut source, len) = match files.open(q.stream).await {
        Ok(opened) => opened,
        Err(e) => return outbox_error(e),
    };
    let start = match (q.offset, q.tail) {
        (Some(o), _) => o.min(len),
        (None, Some(n)) => tail_start(&mut source, len, n).await,
        (None, None) => 0,
    };
    if q.follow {
        return raw_follow(files, q.stream, start);
    }
    let end = len.min(start + LOG_READ_BYTES_MAX);
    let bytes = source.read(start, end).await;
    let mut r = Response::new(Body::from(bytes));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert("x-squadron-next-offset", HeaderValue::from(end));
    h.insert("x-squadron-size", HeaderValue::from(len));
    r
}

async fn read_range(file: Option<&mut tokio::fs::File>, start: u64, end: u64) -> Vec<u8> {
    let Some(f) = file else {
        return Vec::new();
    };
    if end <= start || f.seek(SeekFrom::Start(start)).await.is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    let _ = f.take(end - start).read_to_end(&mut buf).await;
    buf
}

/// The offset where the last `n` lines of the file begin.
async fn tail_start(source: &mut LogSource, len: u64, n: u64) -> u64 {
    if n == 0 {
        return len;
    }
    let from = len.saturating_sub(TAIL_SCAN_BYTES_MAX);
    let buf = source.read(from, len).await;
    // A final newline ends the last line rather than starting an empty one.
    let body = if buf.last() == Some(&b'\n') {
        &buf[..buf.len() - 1]
    } else {
        &buf[..]
    };
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return from + i as u64 + 1;
            }
        }
    }
    from
}

/// Streams the file from `start` as it grows, until the task is no longer active and
/// everything written was sent.
fn raw_follow<F: LogFiles>(files: F, name: LogStream, start: u64) -> Response {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(FOLLOW_DURATION_MS_MAX);
    let stream = futures_util::stream::unfold((start, false), move |(offset, done)| {
        let files = files.clone();
        async move {
            if done {
                return None;
            }
            loop {
                let was_active = files.writing();
                // Opened afresh each look (the file may appear late); a link ends the follow.
                let (mut source, len) = files.open(name).await.ok()?;
                if len > offset {
                    let end = len.min(offset + FRAME_DATA_BYTES_MAX as u64);
                    let bytes = source.read(offset, end).await;
                    let next = offset + bytes.len() as u64;
                    return Some((Ok::<_, std::io::Error>(bytes), (next, false)));
                }
                if !was_active || tokio::time::Instant::now() >= deadline {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(FOLLOW_POLL_MS)).await;
            }
        }
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// One frame of the live stream.
#[derive(Debug, Serialize)]
struct Frame<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    stream: &'static str,
    offset: u64,
    data: &'a str,
}

/// The per-file start a query gave that only `stream=all` takes.
fn per_stream_offset(q: &LogQuery) -> Option<&'static str> {
    if q.stdout_offset.is_some() {
        Some("stdout_offset")
    } else if q.stderr_offset.is_some() {
        Some("stderr_offset")
    } else {
        None
    }
}

/// Interleaves stdout and stderr as NDJSON frames, from `start` in each (a start past a
/// file's end is taken as its end), until the writer has stopped and both files are drained.
/// A file that cannot be read ends the stream with an `error` frame saying why.
fn ndjson_follow<F: LogFiles>(files: F, start: [u64; 2]) -> Response {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(FOLLOW_DURATION_MS_MAX);
    let streams = [("stdout", LogStream::Stdout), ("stderr", LogStream::Stderr)];
    let first = Follow {
        offsets: start,
        clamped: [false; 2],
        over: false,
    };
    let stream = futures_util::stream::unfold(first, move |mut at| {
        let files = files.clone();
        async move {
            if at.over {
                return None;
            }
            loop {
                let was_active = files.writing();
                let mut out = Vec::new();
                for (i, (name, which)) in streams.iter().enumerate() {
                    let (mut source, len) = match files.open(*which).await {
                        Ok(opened) => opened,
                        Err(e) => {
                            at.over = true;
                            let error =
                                serde_json::json!({"type": "error", "message": e.to_string()});
                            out.extend_from_slice(format!("{error}\n").as_bytes());
                            return Some((Ok::<_, std::io::Error>(out), at));
                        }
                    };
                    if !at.clamped[i] {
                        at.offsets[i] = at.offsets[i].min(len);
                        at.clamped[i] = true;
                    }
                    if len <= at.offsets[i] {
                        continue;
                    }
                    let end = len.min(at.offsets[i] + FRAME_DATA_BYTES_MAX as u64);
                    let bytes = source.read(at.offsets[i], end).await;
                    let valid = sendable(&bytes, was_active);
                    if valid == 0 {
                        continue;
                    }
                    let data = String::from_utf8_lossy(&bytes[..valid]);
                    let frame = Frame {
                        kind: "output",
                        stream: name,
                        offset: at.offsets[i],
                        data: &data,
                    };
                    if let Ok(mut line) = serde_json::to_vec(&frame) {
                        line.push(b'\n');
                        out.extend_from_slice(&line);
                    }
                    at.offsets[i] += valid as u64;
                }
                if !out.is_empty() {
                    return Some((Ok::<_, std::io::Error>(out), at));
                }
                if !was_active || tokio::time::Instant::now() >= deadline {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(FOLLOW_POLL_MS)).await;
            }
        }
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    r
}

/// Where a follow of both files is.
struct Follow {
    offsets: [u64; 2],
    /// Whether each start was held to its file's length yet.
    clamped: [bool; 2],
    /// An error frame was sent: nothing follows it.
    over: bool,
}

/// How much of `bytes` goes out now: up to the last whole character, so none is split across
/// frames. An incomplete one at the end waits for its rest while the writer may still add it;
/// bytes that are no UTF-8 at all go out (replaced) rather than stop the stream.
fn sendable(bytes: &[u8], writer_may_add: bool) -> usize {
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) if e.valid_up_to() > 0 => e.valid_up_to(),
        Err(e) if e.error_len().is_none() && writer_may_add => 0,
        Err(_) => bytes.len(),
    }
}

async fn list_artifacts(
    State(state): State<ServerState>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    let dir = match task_dir(&state, &id).await {
        Ok(d) => d,
        Err(r) => return r,
    };
    let listed =
        tokio::task::spawn_blocking(move || outbox_reader::list_artifacts(&dir, ARTIFACT_LIST_MAX))
            .await;
    match listed {
        Ok(Ok(listed)) => {
            let entries: Vec<ArtifactEntry> = listed
                .into_iter()
                .map(|a| ArtifactEntry {
                    name: a.name,
                    size: a.size,
                })
                .collect();
            Json(entries).into_response()
        }
        Ok(Err(e)) => outbox_error(e),
        Err(e) => outbox_error(OutboxError::Io(format!("listing artifacts: {e}"))),
    }
}

async fn artifact(
    State(state): State<ServerState>,
    UrlPath((id, name)): UrlPath<(String, String)>,
) -> Response {
    let dir = match task_dir(&state, &id).await {
        Ok(d) => d,
        Err(r) => return r,
    };
    let mut file = match outbox_reader::open_artifact(&dir, &name) {
        Ok(f) => tokio::fs::File::from_std(f),
        Err(e) => return outbox_error(e),
    };
    let mut len = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    // Collected but not yet rewritten: served through the task's redactor.
    let body = match state.redactions.get(dir.task()) {
        Some(_) if len > REDACTED_FILE_BYTES_MAX => {
            return outbox_error(OutboxError::Io(format!(
                "{name} is over {REDACTED_FILE_BYTES_MAX} bytes while the task's output is \
                 redacted; download it once the task has ended"
            )))
        }
        Some(redactor) => {
            let raw = read_range(Some(&mut file), 0, len).await;
            let redacted =
                match tokio::task::spawn_blocking(move || redactor.redact(&raw).unwrap_or(raw))
                    .await
                {
                    Ok(redacted) => redacted,
                    Err(e) => {
                        return outbox_error(OutboxError::Io(format!("redacting {name}: {e}")))
                    }
                };
            len = redacted.len() as u64;
            Body::from(redacted)
        }
        None => Body::from_stream(ReaderStream::with_capacity(file, FRAME_DATA_BYTES_MAX)),
    };
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    let base = name
        .rsplit('/')
        .next()
        .unwrap_or("artifact")
        .replace('"', "");
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{base}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_log_query_names_its_parameter() {
        let q = log_query("stream=stderr&tail=20").unwrap();
        assert_eq!(
            (q.stream, q.tail, q.follow),
            (LogStream::Stderr, Some(20), false)
        );
        assert_eq!(log_query("").unwrap(), LogQuery::default());
        let limit = squadron_api::queries::LOG_TAIL_LINES_MAX;
        assert_eq!(
            log_query(&format!("tail={limit}")).unwrap().tail,
            Some(limit)
        );
        let refusal = log_query(&format!("tail={}", limit + 1)).unwrap_err();
        assert_eq!(refusal.field, "tail");
        assert!(refusal.message.contains("at most 10000"), "{refusal:?}");
        assert_eq!(log_query("stream=nope").unwrap_err().field, "stream");
        assert_eq!(log_query("offset=-1").unwrap_err().field, "offset");
        assert_eq!(log_query("surprise=1").unwrap_err().field, "query");
    }

    async fn answer(state: &ServerState, query: &str) -> (StatusCode, String) {
        use http_body_util::BodyExt;
        let r = logs(
            State(state.clone()),
            UrlPath("7".into()),
            RawQuery(Some(query.into())),
        )
        .await;
        let status = r.status();
        let body = r.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// The stream a terminal opens after reading its scrollback starts each file where that
    /// read ended: nothing sent twice, nothing skipped; a per-file start outside stream=all,
    /// or offset and tail inside it, is refused by name.
    #[tokio::test]
    async fn the_live_stream_starts_each_file_where_it_is_told() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = TaskDir::new(tmp.path(), TaskId::new(7).unwrap());
        std::fs::create_dir_all(dir.progress()).unwrap();
        std::fs::write(dir.stdout_log(), "one\ntwo\n").unwrap();
        std::fs::write(dir.stderr_log(), "oops\nagain\n").unwrap();
        let state = ServerState {
            data_dir: tmp.path().to_path_buf(),
            active: ActiveTasks::default(),
            redactions: LiveRedactions::default(),
            runtimes: RuntimeSet::default(),
            agents: None,
        };
        let (status, body) = answer(
            &state,
            "stream=all&follow=true&stdout_offset=4&stderr_offset=5",
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let frames: Vec<serde_json::Value> = body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let seen: Vec<(&str, u64, &str)> = frames
            .iter()
            .map(|f| {
                let text = |k: &str| f[k].as_str().unwrap();
                (text("stream"), f["offset"].as_u64().unwrap(), text("data"))
            })
            .collect();
        assert_eq!(seen, [("stdout", 4, "two\n"), ("stderr", 5, "again\n")]);
        std::fs::write(
            dir.unredacted_marker(),
            "progress/stdout.log: larger than 64 MiB",
        )
        .unwrap();
        let (status, body) = answer(&state, "stream=stdout").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(body.contains("could not be redacted"), "{body}");
        std::fs::remove_file(dir.unredacted_marker()).unwrap();
        let (_, past) = answer(&state, "stream=all&follow=true&stdout_offset=999").await;
        assert!(!past.contains("stdout"), "a start past the end: {past}");
        assert!(past.contains("oops"), "{past}");
        let (_, whole) = answer(&state, "stream=all&follow=true").await;
        assert!(
            whole.contains("one\\ntwo") && whole.contains("oops"),
            "{whole}"
        );
        for (query, field) in [
            ("stream=stdout&stdout_offset=4", "stdout_offset"),
            ("stream=stderr&stderr_offset=1", "stderr_offset"),
            ("stream=all&follow=true&offset=4", "offset"),
            ("stream=all&follow=true&tail=4", "tail"),
        ] {
            let (status, body) = answer(&state, query).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
            let body: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(body["field"], field, "{query}: {body}");
        }
    }

    #[test]
    fn a_character_is_never_split_across_frames() {
        let euro = "€".as_bytes();
        assert_eq!(sendable(b"abc", true), 3);
        assert_eq!(sendable(&[b"ab", &euro[..2]].concat(), true), 2);
        // Only the start of a character yet: it waits while the writer may add the rest...
        assert_eq!(sendable(&euro[..2], true), 0);
        // ...and goes out (replaced) once nothing more can come.
        assert_eq!(sendable(&euro[..2], false), 2);
        // Bytes that are no UTF-8 never block the stream.
        assert_eq!(sendable(&[0xff, b'a'], true), 2);
    }

    #[tokio::test]
    async fn tail_finds_the_last_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("log");
        std::fs::write(&p, b"a\nb\nc\nd\n").unwrap();
        let len = 8;
        let f = tokio::fs::File::open(&p).await.unwrap();
        let mut source = LogSource::File(Some(f));
        assert_eq!(tail_start(&mut source, len, 2).await, 4);
        let from = tail_start(&mut source, len, 2).await;
        assert_eq!(source.read(from, len).await, b"c\nd\n");
        assert_eq!(tail_start(&mut source, len, 10).await, 0);
        assert_eq!(tail_start(&mut source, len, 0).await, len);
        assert_eq!(tail_start(&mut LogSource::File(None), 0, 3).await, 0);
        let mut view = LogSource::View(b"a\nb\nc\nd\n".to_vec());
        assert_eq!(tail_start(&mut view, len, 2).await, 4);
        assert_eq!(view.read(4, 100).await, b"c\nd\n");
    }
}
