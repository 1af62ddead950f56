//! A running provider's progress from its own stream (`provider_stream`): every tool call it
//! makes becomes a `tool_call` event in `events.jsonl` as it happens (so the task's `events`
//! counter and a followed event stream show it at once), and the running summary is kept in
//! `provider-progress.json` in the task's root — never mounted in a sandbox — where the task's
//! usage view reads it.
//!
//! A restarted worker follows the stream again from its start: the record says how many tool
//! calls already have their event, so none is told twice.

use serde::{Deserialize, Serialize};
use squadron_api::ProviderProgress;
use squadron_core::provider::Provider;

use crate::support::{read_bounded, write_atomic};
use crate::task::provider_stream::{ProviderFollower, ProviderSummary};
use crate::task::task_dir::{TaskDir, STDOUT_LOG};

/// The record's name in the task's root.
pub(crate) const PROVIDER_PROGRESS_FILE: &str = "provider-progress.json";
/// Largest record read back.
const PROVIDER_PROGRESS_BYTES_MAX: u64 = 64 * 1024;

/// `provider-progress.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct ProgressRecord {
    progress: ProviderProgress,
    /// Tool calls whose `tool_call` event was written.
    evented: u64,
}

/// The stream of one running attempt, followed.
#[derive(Debug)]
pub(crate) struct ProviderLive {
    follower: ProviderFollower,
    record: ProgressRecord,
    /// The attempt the record is of: another attempt's is started afresh.
    attempt: u32,
}

impl ProviderLive {
    /// Follows `provider`'s stream in `dir`, after what an earlier life of the worker told of
    /// this attempt; `None` for a provider without a structured stream.
    pub(crate) fn resume(dir: &TaskDir, provider: Provider, attempt: u32) -> Option<Self> {
        let follower = ProviderFollower::new(provider)?;
        let record = read_record(dir)
            .filter(|(a, _)| *a == attempt)
            .map(|(_, r)| r)
            .unwrap_or_default();
        Some(ProviderLive {
            follower,
            record,
            attempt,
        })
    }

    /// Reads what the stream gained; returns the `tool_call` events to append, and keeps the
    /// record up to date.
    pub(crate) fn look(&mut self, dir: &TaskDir) -> Vec<serde_json::Value> {
        let called = self.follower.look(&dir.outbox(), STDOUT_LOG);
        let summary = self.follower.summary();
        let mut events = Vec::new();
        let first = summary.tool_calls - called.len() as u64;
        for (i, tool) in called.into_iter().enumerate() {
            let n = first + i as u64 + 1;
            if n > self.record.evented {
                events
                    .push(serde_json::json!({"event": "tool_call", "tool": tool, "tool_calls": n}));
                self.record.evented = n;
            }
        }
        let progress = progress_of(summary);
        if progress != self.record.progress {
            self.record.progress = progress;
            let bytes = serde_json::to_vec(&(self.attempt, &self.record)).unwrap_or_default();
            if let Err(e) = write_atomic(&dir.root().join(PROVIDER_PROGRESS_FILE), &bytes) {
                tracing::warn!(task = %dir.task(), error = %e, "cannot record the provider's progress");
            }
        }
        events
    }
}

/// The provider's progress as the usage view shows it, if the attempt's stream said any.
pub(crate) fn read(dir: &TaskDir) -> Option<ProviderProgress> {
    read_record(dir).map(|(_, r)| r.progress)
}

fn read_record(dir: &TaskDir) -> Option<(u32, ProgressRecord)> {
    let bytes = read_bounded(
        &dir.root().join(PROVIDER_PROGRESS_FILE),
        PROVIDER_PROGRESS_BYTES_MAX,
    )
    .ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn progress_of(s: &ProviderSummary) -> ProviderProgress {
    ProviderProgress {
        model: s.model.clone(),
        tool_calls: s.tool_calls,
        current_tool: s.last_tool.clone(),
        input_tokens: s.input_tokens,
        output_tokens: s.output_tokens,
        cost_usd: s.cost_usd,
        turns: s.turns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{task_dir, write};

    const LINE_READ: &str =
        r#"{"type":"assistant","message":{"content":[{"name":"Read","type":"tool_use"}]}}"#;
    const LINE_TWO: &str = r#"{"type":"assistant","message":{"content":[{"name":"Edit","type":"tool_use"},{"name":"Bash","type":"tool_use"}]}}"#;

    fn tools(events: &[serde_json::Value]) -> Vec<(String, u64)> {
        events
            .iter()
            .map(|e| {
                assert_eq!(e["event"], "tool_call");
                (
                    e["tool"].as_str().unwrap().to_string(),
                    e["tool_calls"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    /// Each tool call is told once, as its line ends — a line still being written waits —
    /// the usage view reads the running summary, and a restarted worker that follows the
    /// stream from its start tells none twice.
    #[test]
    fn tool_calls_are_told_as_they_happen_and_once() {
        let (_tmp, dir) = task_dir(3);
        let stdout = dir.stdout_log();
        write(&stdout, format!("{LINE_READ}\n{}", &LINE_TWO[..20]));
        let mut live = ProviderLive::resume(&dir, Provider::Claude, 1).unwrap();
        assert_eq!(tools(&live.look(&dir)), [("Read".to_string(), 1)]);
        let shown = read(&dir).unwrap();
        assert_eq!(
            (shown.tool_calls, shown.current_tool.as_deref()),
            (1, Some("Read"))
        );
        assert!(live.look(&dir).is_empty(), "nothing new");

        write(&stdout, format!("{LINE_READ}\n{LINE_TWO}\n"));
        assert_eq!(
            tools(&live.look(&dir)),
            [("Edit".to_string(), 2), ("Bash".to_string(), 3)]
        );
        assert_eq!(read(&dir).unwrap().current_tool.as_deref(), Some("Bash"));

        // A restart: the stream is read again from its start, no event again.
        let mut again = ProviderLive::resume(&dir, Provider::Claude, 1).unwrap();
        assert!(again.look(&dir).is_empty());
        assert_eq!(read(&dir).unwrap().tool_calls, 3);
        // Another attempt starts afresh.
        let mut next = ProviderLive::resume(&dir, Provider::Claude, 2).unwrap();
        assert_eq!(tools(&next.look(&dir)).len(), 3);
        assert!(ProviderLive::resume(&dir, Provider::Script, 1).is_none());
    }
}
