//! Records the history of a run as it happens, shared by every client and the nemesis.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;

use crate::event::{Event, EventType, Process};
use crate::history::History;

/// A shared, append-only event log with one monotonic clock.
#[derive(Debug, Clone)]
pub struct Recorder {
    start: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            events: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Milliseconds since the recorder was made.
    pub fn now_ms(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1000.0
    }

    fn push(&self, process: Process, kind: EventType, f: &str, key: Option<&str>, value: Value) {
        // The time is taken under the lock so that indexes and times agree in order.
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let index = events.len() as u64;
        events.push(Event {
            index,
            time_ms: self.now_ms(),
            process,
            kind,
            f: f.to_string(),
            key: key.map(str::to_string),
            value,
        });
    }

    pub fn invoke(&self, process: u64, f: &str, key: &str, value: Value) {
        self.push(
            Process::Client(process),
            EventType::Invoke,
            f,
            Some(key),
            value,
        );
    }

    pub fn complete(&self, process: u64, kind: EventType, f: &str, key: &str, value: Value) {
        self.push(Process::Client(process), kind, f, Some(key), value);
    }

    /// A nemesis action: `start` of a fault or `stop` (its heal).
    pub fn nemesis(&self, f: &str, fault: &str, detail: Value) {
        self.push(
            Process::NEMESIS,
            EventType::Info,
            f,
            None,
            serde_json::json!({"fault": fault, "detail": detail}),
        );
    }

    pub fn history(&self) -> History {
        History::new(
            self.events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}
