//! The capsule Squadron writes for a provider that wrote none (issue 16, "provider-neutral
//! continuity from real output"): what the stopped generation's own structured stream says —
//! session, turns, tool calls, its last message —, the pending work it was given, the
//! worktree's revision, the mailbox cursor, and its native session as the context reference,
//! so the next provider (the same CLI or the other) starts from it.

use std::fs;
use std::io::Read as _;
use std::path::Path;

use squadron_core::capsule::CapsulePayload;
use squadron_core::ids::Generation;
use squadron_core::provider::Provider;
use squadron_isolation::beneath::Beneath;

use crate::agent::project_sandbox::ProfilePaths;
use crate::task::provider_stream::{cut_at, summarize};

/// The run file that records the pending work a generation was started with.
pub(crate) const PENDING_FILE_NAME: &str = "pending.json";
/// Most bytes of one pending item kept (a long prompt is cut at a character boundary).
pub(crate) const PENDING_ITEM_BYTES_MAX: usize = 4 * 1024;
/// Largest pending-work file read back.
const PENDING_FILE_BYTES_MAX: u64 = 64 * 1024;

/// How a generation whose stream is read came to an end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Stopped by a graceful takeover.
    Takeover,
    /// Gone without a handover: it exited, was stopped, or crashed.
    Unhanded,
}

/// What the stopped generation carries over; `None` when its stream says nothing (a
/// provider without a structured stream, or one that wrote no line).
pub(crate) fn capsule_from_stream(
    paths: &ProfilePaths,
    generation: Generation,
    provider: Provider,
    ending: Ending,
    revision: Option<String>,
    mailbox_cursor: u64,
) -> Option<CapsulePayload> {
    // The log lies in the provider's writable state: read without following a link.
    let logs = Beneath::open(&paths.logs).ok()?;
    let stream = logs
        .read(Path::new(&format!("g{generation}.stdout.log")))
        .ok()?;
    let summary = summarize(provider, stream)?;
    if summary.lines == summary.unparsed_lines {
        return None;
    }
    let session = summary
        .session_id
        .as_deref()
        .map(|s| format!(", session {s}"))
        .unwrap_or_default();
    let last_tool = summary
        .last_tool
        .as_deref()
        .map(|t| format!(" (last: {t})"))
        .unwrap_or_default();
    let how = match ending {
        Ending::Takeover => "stopped for a takeover",
        Ending::Unhanded => "ended without a handover",
    };
    let task_state = format!(
        "generation {generation} ({provider}{session}) {how} after {} turns and {} tool \
         calls{last_tool}",
        summary.turns, summary.tool_calls
    );
    Some(CapsulePayload {
        task_state,
        decisions: summary
            .last_text
            .map(|t| vec![format!("last said: {t}")])
            .unwrap_or_default(),
        pending_work: read_pending(&paths.generation_run_dir(generation)),
        repository_revision: revision.unwrap_or_default(),
        mailbox_cursor,
        context_ref: summary
            .session_id
            .map(|s| format!("{provider}-session:{s}"))
            .unwrap_or_default(),
    })
}

/// The pending work a generation starts with: the operator's prompt when there is one,
/// else what the capsule it continues from left pending.
pub(crate) fn pending_of(prompt: Option<&str>, inherited: &[String]) -> Vec<String> {
    match prompt {
        Some(p) => vec![cut_at(p, PENDING_ITEM_BYTES_MAX).to_owned()],
        None => inherited.to_vec(),
    }
}

fn read_pending(run_dir: &Path) -> Vec<String> {
    read_run_file(&run_dir.join(PENDING_FILE_NAME), PENDING_FILE_BYTES_MAX)
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// At most `bytes_max` bytes of a generation's run file (written by the worker), or `None`
/// when it cannot be read.
pub(crate) fn read_run_file(path: &Path, bytes_max: u64) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    fs::File::open(path)
        .and_then(|f| f.take(bytes_max).read_to_end(&mut bytes))
        .ok()?;
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_work_is_the_prompt_or_what_was_inherited_and_bounded() {
        assert_eq!(pending_of(Some("fix it"), &["old".into()]), ["fix it"]);
        assert_eq!(pending_of(None, &["old".into()]), ["old"]);
        let long = "é".repeat(PENDING_ITEM_BYTES_MAX);
        let kept = &pending_of(Some(&long), &[])[0];
        assert!(kept.len() <= PENDING_ITEM_BYTES_MAX && long.starts_with(kept.as_str()));
    }
}
