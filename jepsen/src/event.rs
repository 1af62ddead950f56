//! One line of `history.jsonl`: an operation's invocation or completion, or a nemesis action.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who produced an event: a client process (a fresh id after each unknown outcome, as in
/// Jepsen, because a client that lost track of its write cannot be trusted to be sequential),
/// or the nemesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Process {
    Client(u64),
    Nemesis(NemesisTag),
}

/// The literal `"nemesis"` in the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NemesisTag {
    Nemesis,
}

impl Process {
    pub const NEMESIS: Process = Process::Nemesis(NemesisTag::Nemesis);
}

/// What an event says about its operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    /// The client is about to send the request.
    Invoke,
    /// The operation took effect (or, for a read, observed the returned value).
    Ok,
    /// The operation certainly did not take effect (a business refusal, or nothing was sent).
    Fail,
    /// The outcome is unknown: it may take effect at any time after its invocation, or never.
    Info,
}

/// One history line. `value` is the operation's input on `invoke` and its output on
/// completion; its shape depends on `f` (see `jepsen/README.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub index: u64,
    /// Milliseconds since the start of the run (monotonic clock).
    pub time_ms: f64,
    pub process: Process,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub f: String,
    /// The independent key the operation touches (`lease/3`, `cas/7`, `capsule/9`); the
    /// checker decomposes the history by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default)]
    pub value: Value,
}
