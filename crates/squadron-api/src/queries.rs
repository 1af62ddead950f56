//! The query strings of the read routes (and of a task's cancel and logs). Unknown parameters
//! are refused, as unknown body fields are.

use schemars::JsonSchema;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use squadron_core::task::TaskState;

/// Read consistency a caller asks for (`?consistency=linearizable|stale`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// ReadIndex through the leader: the read sees every write acknowledged before it began.
    #[default]
    Linearizable,
    /// The answering node's applied state, possibly behind; answers without a leader.
    Stale,
}

/// `?consistency=…`, the query of most reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsistencyQuery {
    #[serde(default)]
    pub consistency: Consistency,
}

/// `GET /api/v1/cluster/status?consistency=…&digest=true|false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterStatusQuery {
    #[serde(default)]
    pub consistency: Consistency,
    /// Whether to compute the state digest (default true). It costs about as much as a
    /// snapshot; a poller that wants only roles and indexes says `false`.
    #[serde(default = "digest_default")]
    pub digest: bool,
}

fn digest_default() -> bool {
    true
}

impl Default for ClusterStatusQuery {
    fn default() -> Self {
        Self {
            consistency: Consistency::default(),
            digest: true,
        }
    }
}

/// Tasks one list call returns unless it asks for fewer.
pub const TASK_LIST_LIMIT_DEFAULT: usize = 100;
/// Most tasks one list call returns.
pub const TASK_LIST_LIMIT_MAX: usize = 1_000;
/// Audit records per page unless `limit` says otherwise, and the most one page holds.
pub const AUDIT_PAGE_RECORDS_DEFAULT: usize = 100;
pub const AUDIT_PAGE_RECORDS_MAX: usize = 1_000;
/// Most lines a log read's `tail` returns.
pub const LOG_TAIL_LINES_MAX: u64 = 10_000;

/// The order of a task list, by id (submission order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskOrder {
    #[default]
    Oldest,
    Newest,
}

/// `GET /api/v1/tasks`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskListQuery {
    /// Kept as text so a bad state is refused naming `state` and listing the states.
    #[serde(default)]
    #[schemars(with = "Option<TaskState>")]
    pub state: Option<String>,
    /// Tasks with ids above this one (oldest first: the previous page's `next_after`).
    #[serde(default)]
    pub after: Option<u64>,
    /// Tasks with ids below this one (newest first: the previous page's `next_before`).
    #[serde(default)]
    pub before: Option<u64>,
    /// `oldest` first (the default) or `newest` first.
    #[serde(default)]
    pub order: TaskOrder,
    /// At most this many tasks (default 100).
    #[serde(default, deserialize_with = "page_limit::<TASK_LIST_LIMIT_MAX, _>")]
    #[schemars(range(min = 1, max = TASK_LIST_LIMIT_MAX))]
    pub limit: Option<usize>,
    /// Only the tasks this task's agent submitted (its children), in id order. Kept as text
    /// like `state`, so a bad id is refused naming `parent`.
    #[serde(default)]
    #[schemars(with = "Option<squadron_core::ids::TaskId>")]
    pub parent: Option<String>,
    #[serde(default)]
    pub consistency: Consistency,
}

/// `GET /api/v1/audit`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Records with sequence numbers above this one.
    #[serde(default)]
    pub after: u64,
    /// At most this many records (default 100).
    #[serde(default, deserialize_with = "page_limit::<AUDIT_PAGE_RECORDS_MAX, _>")]
    #[schemars(range(min = 1, max = AUDIT_PAGE_RECORDS_MAX))]
    pub limit: Option<usize>,
    #[serde(default)]
    pub consistency: Consistency,
}

/// `DELETE /api/v1/tasks/{id}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelQuery {
    /// Why, for the task's record and the worker.
    #[serde(default)]
    pub reason: Option<String>,
}

/// Which of a task's output files a log read returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    #[default]
    Stdout,
    Stderr,
    Events,
    /// All three, interleaved as NDJSON frames; only with `follow=true`.
    All,
}

/// `GET /api/v1/tasks/{id}/logs` (relayed as is to the worker's output server).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    #[serde(default)]
    pub stream: LogStream,
    /// Start at this byte.
    #[serde(default)]
    pub offset: Option<u64>,
    /// Only the last this many lines.
    #[serde(default, deserialize_with = "tail_lines")]
    #[schemars(range(max = LOG_TAIL_LINES_MAX))]
    pub tail: Option<u64>,
    /// Keep the answer open and stream what is appended.
    #[serde(default)]
    pub follow: bool,
    /// With `stream=all`: the byte of stdout its frames start at.
    #[serde(default)]
    pub stdout_offset: Option<u64>,
    /// With `stream=all`: the byte of stderr its frames start at.
    #[serde(default)]
    pub stderr_offset: Option<u64>,
}

/// `GET /ws/tasks/{id}/stream`: where the live frames start in each file. A client that read
/// the scrollback through the logs API (whose `x-squadron-next-offset` says where it ended)
/// goes on from there instead of receiving the whole output again; without them the stream
/// starts at the beginning of both files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamQuery {
    /// The byte of stdout the first stdout frame starts at.
    #[serde(default)]
    pub stdout_offset: Option<u64>,
    /// The byte of stderr the first stderr frame starts at.
    #[serde(default)]
    pub stderr_offset: Option<u64>,
    /// An agent's stream only: the generation the offsets were read from (the logs answer's
    /// `x-squadron-generation`); the stream is refused once another generation is current.
    #[serde(default)]
    pub generation: Option<u64>,
}

/// A page size in `1..=MAX`: the decoder refuses what the schema does, so a bad `limit` is
/// a 400 naming it before any handler runs.
fn page_limit<'de, const MAX: usize, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<usize>, D::Error> {
    match Option::<usize>::deserialize(d)? {
        Some(n) if n == 0 || n > MAX => Err(D::Error::custom(format!(
            "must be between 1 and {MAX}, got {n}"
        ))),
        limit => Ok(limit),
    }
}

fn tail_lines<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<u64>::deserialize(d)? {
        Some(n) if n > LOG_TAIL_LINES_MAX => Err(D::Error::custom(format!(
            "at most {LOG_TAIL_LINES_MAX} lines, got {n}"
        ))),
        tail => Ok(tail),
    }
}

/// Why a query string was refused: the parameter to blame (`query` when none is) and what is
/// wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryRefusal {
    pub field: String,
    pub message: String,
}

/// Decodes a query string as `T`: the one decoder of the control plane's routes and the
/// worker's output server, so both refuse alike and name the parameter (`limit`, `tail`).
pub fn decode_query<T: DeserializeOwned>(raw: &str) -> Result<T, QueryRefusal> {
    let decoder = serde_urlencoded::Deserializer::new(form_urlencoded::parse(raw.as_bytes()));
    serde_path_to_error::deserialize(decoder).map_err(|e| {
        let path = e.path().to_string();
        QueryRefusal {
            field: if path == "." { "query".into() } else { path },
            message: e.inner().to_string(),
        }
    })
}
