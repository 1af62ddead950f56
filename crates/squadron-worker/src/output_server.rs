//! The worker's output server: a task's logs (range, tail, follow), its artifacts (list and
//! streamed download) and a live NDJSON stream. Control nodes relay these to REST and
//! WebSocket clients (`/api/v1/tasks/{id}/logs`, `/ws/tasks/{id}/stream`); output never
//! passes through Raft.

use std::collections::BTreeSet;
use std::io::SeekFrom;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use squadron_client::ErrorBody;
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::TaskId;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;

use crate::task::task_dir::TaskDir;

/// Largest chunk one read of a log returns; a caller pages on with `offset`.
pub(crate) const LOG_READ_BYTES_MAX: u64 = 8 * 1024 * 1024;
/// Most lines `tail` returns.
pub(crate) const TAIL_LINES_MAX: u64 = 10_000;
/// Bytes scanned from the end of a file to find the tail's lines.
pub(crate) const TAIL_SCAN_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// How often a follower looks for appended output.
pub(crate) const FOLLOW_POLL_MS: u64 = 200;
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
}

pub(crate) fn router(data_dir: PathBuf, active: ActiveTasks) -> Router {
    Router::new()
        .route("/worker/v1/tasks/:id/logs", get(logs))
        .route("/worker/v1/tasks/:id/artifacts", get(list_artifacts))
        .route("/worker/v1/tasks/:id/artifacts/*name", get(artifact))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(ServerState { data_dir, active })
}

/// An error answer, in the control plane's error body (`{code, message, field?}`).
fn error(status: StatusCode, code: ErrorCode, field: Option<&'static str>, m: String) -> Response {
    let body = ErrorBody {
        code,
        message: m,
        field: field.map(str::to_owned),
        rejection: None,
    };
    (status, Json(body)).into_response()
}

fn invalid(field: &'static str, m: impl Into<String>) -> Response {
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

// The error is the handler's own response, returned at once: boxing it would buy nothing.
#[allow(clippy::result_large_err)]
fn task_dir(state: &ServerState, raw: &str) -> Result<TaskDir, Response> {
    let id = raw
        .parse::<u64>()
        .ok()
        .and_then(|n| TaskId::new(n).ok())
        .ok_or_else(|| invalid("task_id", format!("{raw:?} is not a task id")))?;
    let dir = TaskDir::new(&state.data_dir, id);
    if !dir.root().is_dir() {
        return Err(not_found(format!("task {id} has no files on this worker")));
    }
    Ok(dir)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum StreamName {
    Stdout,
    Stderr,
    Events,
    All,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogQuery {
    #[serde(default = "default_stream")]
    stream: StreamName,
    offset: Option<u64>,
    tail: Option<u64>,
    #[serde(default)]
    follow: bool,
}

fn default_stream() -> StreamName {
    StreamName::Stdout
}

fn file_of(dir: &TaskDir, s: StreamName) -> PathBuf {
    match s {
        StreamName::Stdout | StreamName::All => dir.stdout_log(),
        StreamName::Stderr => dir.stderr_log(),
        StreamName::Events => dir.events(),
    }
}

async fn logs(
    State(state): State<ServerState>,
    UrlPath(id): UrlPath<String>,
    q: Result<Query<LogQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(q) = match q {
        Ok(q) => q,
        Err(e) => return invalid("query", e.body_text()),
    };
    let dir = match task_dir(&state, &id) {
        Ok(d) => d,
        Err(r) => return r,
    };
    if q.offset.is_some() && q.tail.is_some() {
        return invalid("tail", "give offset or tail, not both");
    }
    if q.tail.is_some_and(|t| t > TAIL_LINES_MAX) {
        return invalid("tail", format!("at most {TAIL_LINES_MAX} lines"));
    }
    if q.stream == StreamName::All {
        if !q.follow {
            return invalid("stream", "stream=all is only served with follow=true");
        }
        return ndjson_follow(state.active.clone(), dir);
    }
    let path = file_of(&dir, q.stream);
    let len = tokio::fs::metadata(&path)
        .await
        .map(|m| m.len())
        .unwrap_or(0);
    let start = match (q.offset, q.tail) {
        (Some(o), _) => o.min(len),
        (None, Some(n)) => tail_start(&path, len, n).await,
        (None, None) => 0,
    };
    if q.follow {
        return raw_follow(state.active.clone(), dir.task(), path, start);
    }
    let end = len.min(start + LOG_READ_BYTES_MAX);
    let bytes = read_range(&path, start, end).await;
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

async fn read_range(path: &Path, start: u64, end: u64) -> Vec<u8> {
    let Ok(mut f) = tokio::fs::File::open(path).await else {
        return Vec::new();
    };
    if end <= start || f.seek(SeekFrom::Start(start)).await.is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    let _ = (&mut f).take(end - start).read_to_end(&mut buf).await;
    buf
}

/// The offset where the last `n` lines of the file begin.
async fn tail_start(path: &Path, len: u64, n: u64) -> u64 {
    if n == 0 {
        return len;
    }
    let from = len.saturating_sub(TAIL_SCAN_BYTES_MAX);
    let buf = read_range(path, from, len).await;
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
fn raw_follow(active: ActiveTasks, task: TaskId, path: PathBuf, start: u64) -> Response {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(FOLLOW_DURATION_MS_MAX);
    let stream = futures_util::stream::unfold((start, false), move |(offset, done)| {
        let (active, path) = (active.clone(), path.clone());
        async move {
            if done {
                return None;
            }
            loop {
                let was_active = active.contains(task);
                let len = tokio::fs::metadata(&path)
                    .await
                    .map(|m| m.len())
                    .unwrap_or(0);
                if len > offset {
                    let end = len.min(offset + FRAME_DATA_BYTES_MAX as u64);
                    let bytes = read_range(&path, offset, end).await;
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

/// Interleaves stdout and stderr as NDJSON frames until the task's run has ended and both
/// files are drained.
fn ndjson_follow(active: ActiveTasks, dir: TaskDir) -> Response {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(FOLLOW_DURATION_MS_MAX);
    let task = dir.task();
    let files = [("stdout", dir.stdout_log()), ("stderr", dir.stderr_log())];
    let stream = futures_util::stream::unfold([0u64, 0u64], move |mut offsets| {
        let (active, files) = (active.clone(), files.clone());
        async move {
            loop {
                let was_active = active.contains(task);
                let mut out = Vec::new();
                for (i, (name, path)) in files.iter().enumerate() {
                    let len = tokio::fs::metadata(path)
                        .await
                        .map(|m| m.len())
                        .unwrap_or(0);
                    if len <= offsets[i] {
                        continue;
                    }
                    let end = len.min(offsets[i] + FRAME_DATA_BYTES_MAX as u64);
                    let bytes = read_range(path, offsets[i], end).await;
                    // Cut at a UTF-8 boundary so a character is never split across frames.
                    let valid = match std::str::from_utf8(&bytes) {
                        Ok(_) => bytes.len(),
                        Err(e) if e.valid_up_to() > 0 => e.valid_up_to(),
                        Err(_) => bytes.len(),
                    };
                    let data = String::from_utf8_lossy(&bytes[..valid]);
                    let frame = Frame {
                        kind: "output",
                        stream: name,
                        offset: offsets[i],
                        data: &data,
                    };
                    if let Ok(mut line) = serde_json::to_vec(&frame) {
                        line.push(b'\n');
                        out.extend_from_slice(&line);
                    }
                    offsets[i] += valid as u64;
                }
                if !out.is_empty() {
                    return Some((Ok::<_, std::io::Error>(out), offsets));
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

#[derive(Debug, Serialize)]
struct ArtifactEntry {
    name: String,
    size: u64,
}

async fn list_artifacts(
    State(state): State<ServerState>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    let dir = match task_dir(&state, &id) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let root = dir.artifacts();
    let entries = tokio::task::spawn_blocking(move || walk_artifacts(&root))
        .await
        .unwrap_or_default();
    Json(entries).into_response()
}

/// Regular files under `root`, relative names, sorted; symlinks are not followed.
fn walk_artifacts(root: &Path) -> Vec<ArtifactEntry> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            let p = e.path();
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                if out.len() >= ARTIFACT_LIST_MAX {
                    break;
                }
                let size = e.metadata().map(|m| m.len()).unwrap_or(0);
                if let Ok(rel) = p.strip_prefix(root) {
                    out.push(ArtifactEntry {
                        name: rel.to_string_lossy().into_owned(),
                        size,
                    });
                }
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Resolves an artifact name to a regular file inside the artifacts directory, refusing
/// anything that could leave it: absolute paths, `..`, symlinks anywhere on the way.
pub(crate) fn resolve_artifact(root: &Path, name: &str) -> Result<PathBuf, String> {
    if name.is_empty() || name.starts_with('/') || name.contains('\\') || name.contains('\0') {
        return Err("artifact name must be a relative path".into());
    }
    let mut path = root.to_path_buf();
    for part in name.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err("artifact name must not contain empty, '.' or '..' components".into());
        }
        path.push(part);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err("artifact name passes through a symbolic link".into())
            }
            Ok(_) => {}
            Err(_) => return Err(format!("no artifact named {name:?}")),
        }
    }
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_file() => Ok(path),
        _ => Err(format!("no artifact named {name:?}")),
    }
}

async fn artifact(
    State(state): State<ServerState>,
    UrlPath((id, name)): UrlPath<(String, String)>,
) -> Response {
    let dir = match task_dir(&state, &id) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let path = match resolve_artifact(&dir.artifacts(), &name) {
        Ok(p) => p,
        Err(m) if m.starts_with("no artifact") => return not_found(m),
        Err(m) => return invalid("name", m),
    };
    let file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) => return not_found(format!("artifact {name:?}: {e}")),
    };
    let len = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    let body = Body::from_stream(ReaderStream::with_capacity(file, FRAME_DATA_BYTES_MAX));
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
    fn artifact_names_cannot_leave_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("artifacts");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.txt"), b"a").unwrap();
        std::fs::write(tmp.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("dirlink")).unwrap();
        assert_eq!(
            resolve_artifact(&root, "sub/a.txt").unwrap(),
            root.join("sub/a.txt")
        );
        for bad in [
            "../secret",
            "/etc/passwd",
            "sub/../../secret",
            "link",
            "dirlink/secret",
            "",
            "sub//a.txt",
            "./sub/a.txt",
        ] {
            assert!(
                resolve_artifact(&root, bad).is_err(),
                "{bad:?} must be refused"
            );
        }
        assert!(
            resolve_artifact(&root, "sub").is_err(),
            "a directory is not an artifact"
        );
    }

    #[tokio::test]
    async fn tail_finds_the_last_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("log");
        std::fs::write(&p, b"a\nb\nc\nd\n").unwrap();
        let len = 8;
        assert_eq!(tail_start(&p, len, 2).await, 4);
        assert_eq!(
            read_range(&p, tail_start(&p, len, 2).await, len).await,
            b"c\nd\n"
        );
        assert_eq!(tail_start(&p, len, 10).await, 0);
        assert_eq!(tail_start(&p, len, 0).await, len);
    }
}
