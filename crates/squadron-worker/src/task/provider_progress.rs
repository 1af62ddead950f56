//! A running provider's progress from its own stream (`provider_stream`): every tool call it
//! makes becomes a `tool_call` event in `events.jsonl` as it happens (so the task's `events`
//! counter and a followed event stream show it at once), and the running summary goes with
//! the driver's progress reports into the task's replicated record
//! (`GET /api/v1/tasks/{id}/provider`).
//!
//! A restarted worker follows the stream again from its start: `provider-progress.json`, in
//! the task's root (never mounted in a sandbox), says how many tool calls already have their
//! event, so none is told twice.

use serde::{Deserialize, Serialize};
use squadron_core::provider::Provider;
use squadron_core::task::{ProviderProgress, PROVIDER_NAME_BYTES_MAX};

use crate::support::{read_bounded, write_atomic};
use crate::task::provider_stream::{
    ProviderFollower, ProviderSummary, FOLLOW_READ_BYTES_MAX, PROVIDER_STREAM_BYTES_MAX,
};
use crate::task::task_dir::{TaskDir, STDOUT_LOG};

/// The record's name in the task's root.
pub(crate) const PROVIDER_PROGRESS_FILE: &str = "provider-progress.json";
/// Largest record read back (its names are bounded: a few hundred bytes in all).
const PROVIDER_PROGRESS_BYTES_MAX: u64 = 64 * 1024;
/// Looks at the end of a run: the whole stream's bound in the bound of one look.
const DRAIN_LOOKS_MAX: u64 = PROVIDER_STREAM_BYTES_MAX / FOLLOW_READ_BYTES_MAX + 1;

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

    /// The running summary, once the stream said anything.
    pub(crate) fn progress(&self) -> Option<ProviderProgress> {
        (self.follower.summary().lines > 0).then(|| self.record.progress.clone())
    }

    /// Reads what the stream gained; returns the `tool_call` events to append, and keeps the
    /// record up to date.
    pub(crate) fn look(&mut self, dir: &TaskDir) -> Vec<serde_json::Value> {
        let called = self.follower.look(&dir.outbox(), STDOUT_LOG);
        self.tell(dir, called)
    }

    /// The provider exited: the rest of its stream (within the stream's bound), its last line
    /// without a newline too.
    pub(crate) fn drain(&mut self, dir: &TaskDir) -> Vec<serde_json::Value> {
        let mut events = self.look(dir);
        for _ in 0..DRAIN_LOOKS_MAX {
            if !self.follower.behind() {
                break;
            }
            events.extend(self.look(dir));
        }
        let called = self.follower.finish();
        events.extend(self.tell(dir, called));
        events
    }

    /// The events of the calls just read, and the record brought up to date.
    fn tell(&mut self, dir: &TaskDir, called: Vec<String>) -> Vec<serde_json::Value> {
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
        if progress != self.record.progress || !events.is_empty() {
            self.record.progress = progress;
            let bytes = serde_json::to_vec(&(self.attempt, &self.record)).unwrap_or_default();
            if let Err(e) = write_atomic(&dir.root().join(PROVIDER_PROGRESS_FILE), &bytes) {
                tracing::warn!(task = %dir.task(), error = %e, "cannot record the provider's progress");
            }
        }
        events
    }
}

/// The provider's progress as last recorded, if the attempt's stream said any.
#[cfg(test)]
fn read(dir: &TaskDir) -> Option<ProviderProgress> {
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

/// Millionths of a dollar, rounded; a negative or non-finite figure is 0.
fn micro_usd(usd: f64) -> u64 {
    let micro = (usd * 1_000_000.0).round();
    if micro.is_finite() && micro > 0.0 {
        // Saturates at u64::MAX: a figure no run reaches.
        micro as u64
    } else {
        0
    }
}

/// The summary as the core records it; a name beyond the core's bound is cut to it.
fn progress_of(s: &ProviderSummary) -> ProviderProgress {
    ProviderProgress {
        model: s.model.as_deref().and_then(name),
        tool_calls: s.tool_calls,
        current_tool: s.last_tool.as_deref().and_then(name),
        input_tokens: s.input_tokens,
        output_tokens: s.output_tokens,
        cost_micro_usd: s.cost_usd.map(micro_usd),
        turns: s.turns,
    }
}

/// A model or tool name the core accepts: control characters dropped, cut at its bound on a
/// character boundary; `None` when nothing is left.
fn name(text: &str) -> Option<String> {
    let clean: String = text.chars().filter(|c| !c.is_control()).collect();
    let cut = crate::task::provider_stream::cut_at(&clean, PROVIDER_NAME_BYTES_MAX);
    (!cut.is_empty()).then(|| cut.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{task_dir, write};

    const LINE_READ: &str =
        r#"{"type":"assistant","message":{"content":[{"name":"Read","type":"tool_use"}]}}"#;
    const LINE_TWO: &str = r#"{"type":"assistant","message":{"content":[{"name":"Edit","type":"tool_use"},{"name":"Bash","type":"tool_use"}]}}"#;

    /// At the end the rest of the stream is read, beyond one look's bound and up to a last
    /// line without its newline; a tool name longer than the core takes is cut.
    #[test]
    fn the_end_of_a_run_is_read_whole() {
        let (_tmp, dir) = task_dir(4);
        let long = "T".repeat(4 * PROVIDER_NAME_BYTES_MAX);
        let mut stream = format!("{LINE_READ}\n");
        // Past one look's bound, then a call whose line has no newline.
        stream.push_str(&" ".repeat(FOLLOW_READ_BYTES_MAX as usize));
        stream.push('\n');
        stream.push_str(&LINE_READ.replace("Read", &long));
        write(&dir.stdout_log(), &stream);
        let mut live = ProviderLive::resume(&dir, Provider::Claude, 1).unwrap();
        let drained = tools(&live.drain(&dir));
        assert_eq!(drained.len(), 2, "{drained:?}");
        assert_eq!(drained[0], ("Read".to_string(), 1));
        assert_eq!(drained[1].0.len(), PROVIDER_NAME_BYTES_MAX, "cut");
        let recorded = read(&dir).unwrap();
        assert_eq!(recorded.tool_calls, 2);
        assert!(recorded.validate().is_ok(), "{recorded:?}");
    }

    /// What the core records fits its bounds whatever the CLI printed.
    #[test]
    fn names_and_costs_fit_what_the_core_takes() {
        assert_eq!(name("Ba\nsh").as_deref(), Some("Bash"));
        assert_eq!(name("\u{7}"), None);
        let long = "é".repeat(PROVIDER_NAME_BYTES_MAX);
        let cut = name(&long).unwrap();
        assert!(cut.len() <= PROVIDER_NAME_BYTES_MAX && long.starts_with(&cut));
        let p = ProviderProgress {
            model: name(&long),
            current_tool: name("Bash"),
            ..ProviderProgress::default()
        };
        assert!(p.validate().is_ok());
        assert_eq!(micro_usd(0.0048), 4_800);
        assert_eq!(micro_usd(-1.0), 0);
        assert_eq!(micro_usd(f64::NAN), 0);
    }

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

        // A stream the sandbox cut is read again from its start: only calls past those told
        // are told.
        write(&stdout, format!("{LINE_READ}\n"));
        assert!(live.look(&dir).is_empty());
        write(&stdout, format!("{LINE_READ}\n{LINE_TWO}\n{LINE_TWO}\n"));
        assert_eq!(
            tools(&live.look(&dir)),
            [("Edit".to_string(), 4), ("Bash".to_string(), 5)]
        );
        write(&stdout, format!("{LINE_READ}\n{LINE_TWO}\n"));

        // A restart: the stream is read again from its start, no event again.
        let mut again = ProviderLive::resume(&dir, Provider::Claude, 1).unwrap();
        assert!(again.look(&dir).is_empty());
        assert_eq!(read(&dir).unwrap().tool_calls, 3);
        assert_eq!(again.record.evented, 5);
        // Another attempt starts afresh.
        let mut next = ProviderLive::resume(&dir, Provider::Claude, 2).unwrap();
        assert_eq!(tools(&next.look(&dir)).len(), 3);
        assert!(ProviderLive::resume(&dir, Provider::Script, 1).is_none());
    }
}
