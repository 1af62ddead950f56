//! An operation: an invocation paired with its completion.

use serde_json::Value;

use crate::event::{EventType, Process};

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Completion {
    Ok,
    Fail,
    /// Unknown outcome (an `info` completion, or none before the history ended).
    Info,
}

/// An invocation and its completion, as the checkers see them.
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    /// Index of the invoke event in the history.
    pub invoke_index: u64,
    /// Index of the completion event, when there is one.
    pub complete_index: Option<u64>,
    pub process: Process,
    pub f: String,
    pub key: Option<String>,
    pub invoke_ms: f64,
    /// When the completion was recorded; `None` when the history ended first.
    pub complete_ms: Option<f64>,
    pub completion: Completion,
    pub input: Value,
    pub output: Value,
}

impl Operation {
    /// When the operation certainly had finished taking effect, if it did: its completion for
    /// `ok` and `fail`, never for an unknown outcome.
    pub fn known_end_ms(&self) -> Option<f64> {
        match self.completion {
            Completion::Ok | Completion::Fail => self.complete_ms,
            Completion::Info => None,
        }
    }

    pub fn is_ok(&self) -> bool {
        self.completion == Completion::Ok
    }

    /// The `error` field of a failed operation's output (`stale_generation`, `busy`, …).
    pub fn error(&self) -> Option<&str> {
        self.output.get("error").and_then(Value::as_str)
    }

    pub(crate) fn completion_of(kind: EventType) -> Completion {
        match kind {
            EventType::Ok => Completion::Ok,
            EventType::Fail => Completion::Fail,
            EventType::Invoke | EventType::Info => Completion::Info,
        }
    }
}
