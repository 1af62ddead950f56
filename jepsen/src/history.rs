//! A whole run's history: loading, saving and pairing events into operations.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::event::{Event, EventType, Process};
use crate::operation::{Completion, Operation};

/// Longest history line read; longer lines are refused rather than buffered.
pub const HISTORY_LINE_BYTES_MAX: usize = 1024 * 1024;
/// Most events a history may hold (a 5-minute run at 100 ops/s has 60 000).
pub const HISTORY_EVENTS_MAX: usize = 10_000_000;

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} line {line}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path} holds more than {HISTORY_EVENTS_MAX} events")]
    TooLarge { path: PathBuf },
    #[error("event {index}: {message}")]
    Malformed { index: u64, message: String },
}

/// A nemesis fault, from its start to its heal.
#[derive(Debug, Clone, PartialEq)]
pub struct NemesisInterval {
    pub start_ms: f64,
    /// `None` when the history ended before the heal.
    pub end_ms: Option<f64>,
    pub fault: String,
}

/// The events of one run, in the order they were recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    pub events: Vec<Event>,
}

impl History {
    pub fn new(events: Vec<Event>) -> Self {
        Self { events }
    }

    /// Reads `history.jsonl`.
    pub fn load(path: &Path) -> Result<Self, HistoryError> {
        let file = std::fs::File::open(path).map_err(|source| HistoryError::Read {
            path: path.into(),
            source,
        })?;
        let mut events = Vec::new();
        for (i, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|source| HistoryError::Read {
                path: path.into(),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            if line.len() > HISTORY_LINE_BYTES_MAX {
                return Err(HistoryError::Parse {
                    path: path.into(),
                    line: i + 1,
                    message: format!("longer than {HISTORY_LINE_BYTES_MAX} bytes"),
                });
            }
            if events.len() >= HISTORY_EVENTS_MAX {
                return Err(HistoryError::TooLarge { path: path.into() });
            }
            let event: Event = serde_json::from_str(&line).map_err(|e| HistoryError::Parse {
                path: path.into(),
                line: i + 1,
                message: e.to_string(),
            })?;
            events.push(event);
        }
        Ok(Self { events })
    }

    /// Writes the history as JSON lines.
    pub fn save(&self, path: &Path) -> Result<(), HistoryError> {
        let write_err = |source| HistoryError::Write {
            path: path.into(),
            source,
        };
        let file = std::fs::File::create(path).map_err(write_err)?;
        let mut out = std::io::BufWriter::new(file);
        for e in &self.events {
            let line = serde_json::to_string(e).map_err(|e| HistoryError::Write {
                path: path.into(),
                source: std::io::Error::other(e),
            })?;
            writeln!(out, "{line}").map_err(write_err)?;
        }
        out.flush().map_err(write_err)
    }

    /// Pairs each client invocation with the next event of the same process. An invocation
    /// without a completion is an unknown outcome. A completion without an invocation, or a
    /// second invocation before the first completed, is a malformed history.
    pub fn operations(&self) -> Result<Vec<Operation>, HistoryError> {
        let mut open: BTreeMap<u64, usize> = BTreeMap::new();
        let mut ops: Vec<Operation> = Vec::new();
        for e in &self.events {
            let Process::Client(p) = e.process else {
                continue;
            };
            match e.kind {
                EventType::Invoke => {
                    if open.contains_key(&p) {
                        return Err(HistoryError::Malformed {
                            index: e.index,
                            message: format!("process {p} invoked again before completing"),
                        });
                    }
                    open.insert(p, ops.len());
                    ops.push(Operation {
                        invoke_index: e.index,
                        complete_index: None,
                        process: e.process,
                        f: e.f.clone(),
                        key: e.key.clone(),
                        invoke_ms: e.time_ms,
                        complete_ms: None,
                        completion: Completion::Info,
                        input: e.value.clone(),
                        output: Value::Null,
                    });
                }
                kind => {
                    let Some(slot) = open.remove(&p) else {
                        return Err(HistoryError::Malformed {
                            index: e.index,
                            message: format!("process {p} completed without an invocation"),
                        });
                    };
                    let Some(op) = ops.get_mut(slot) else {
                        continue;
                    };
                    if op.f != e.f {
                        return Err(HistoryError::Malformed {
                            index: e.index,
                            message: format!(
                                "completion of {:?} pairs with invoke of {:?}",
                                e.f, op.f
                            ),
                        });
                    }
                    op.complete_index = Some(e.index);
                    op.complete_ms = Some(e.time_ms);
                    op.completion = Operation::completion_of(kind);
                    op.output = e.value.clone();
                }
            }
        }
        Ok(ops)
    }

    /// The nemesis's faults: each `start` event up to the next `stop`.
    pub fn nemesis_intervals(&self) -> Vec<NemesisInterval> {
        let mut out: Vec<NemesisInterval> = Vec::new();
        for e in self.events.iter().filter(|e| e.process == Process::NEMESIS) {
            match e.f.as_str() {
                "start" => out.push(NemesisInterval {
                    start_ms: e.time_ms,
                    end_ms: None,
                    fault: e
                        .value
                        .get("fault")
                        .and_then(Value::as_str)
                        .unwrap_or("fault")
                        .to_string(),
                }),
                "stop" => {
                    if let Some(last) = out.iter_mut().rev().find(|i| i.end_ms.is_none()) {
                        last.end_ms = Some(e.time_ms);
                    }
                }
                _ => {}
            }
        }
        out
    }
}
