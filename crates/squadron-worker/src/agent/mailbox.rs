//! Mailbox and roster delivery: each tick, new mailbox messages of every running profile
//! (roster deltas included) are appended to its generation's `mailbox.jsonl` and
//! acknowledged under the lease. Lifecycle noise never reaches a mailbox (the control plane
//! refuses it), so everything there is relayed. The run directory is read-only inside, so
//! what a provider reads there was written by the worker.

use std::fs;
use std::io::Write as _;
use std::path::Path;

use squadron_client::types::AckMessages;
use squadron_core::lease::FencingToken;
use squadron_core::mailbox::{MessageKind, MessagePayload};

use crate::agent::error::AgentError;
use crate::agent::registry::RunningAttempt;
use crate::agent::supervisor::AgentSupervisor;
use crate::error::WorkerError;
use crate::support::write_atomic;

/// Most bytes of mailbox deliveries kept in one generation's `mailbox.jsonl`; past it the
/// file is rewritten with the newest half.
pub(crate) const MAILBOX_FILE_BYTES_MAX: u64 = 8 << 20;

impl AgentSupervisor {
    pub(super) async fn deliver_mailboxes(&self) {
        let running = self.registry().running();
        for attempt in running {
            self.deliver(attempt).await;
        }
    }

    /// Delivers what is new in one profile's mailbox.
    async fn deliver(&self, running: RunningAttempt) {
        let RunningAttempt {
            token,
            project,
            mailbox_file,
            delivered_through: through,
            ..
        } = running;
        let mailbox = match self.inner.control.read_mailbox(token.profile).await {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(profile = %token.profile, error = %e, "mailbox not read");
                return;
            }
        };
        let fresh: Vec<_> = mailbox
            .messages
            .values()
            .filter(|m| m.seq > through.max(mailbox.acked_through))
            .collect();
        // Delivered but not acknowledged (an earlier ack was lost): acknowledge again.
        let Some(last) = fresh.last().map(|m| m.seq) else {
            if through > mailbox.acked_through {
                self.acknowledge(token, through).await;
            }
            return;
        };
        let mut lines = Vec::new();
        let mut roster = 0u64;
        for m in &fresh {
            if m.kind == MessageKind::RosterDelta || matches!(m.payload, MessagePayload::Roster(_))
            {
                roster += 1;
            }
            match serde_json::to_vec(m) {
                Ok(mut line) => {
                    line.push(b'\n');
                    lines.extend(line);
                }
                Err(e) => tracing::warn!(error = %e, "message not encodable"),
            }
        }
        if let Err(e) = append_bounded(&mailbox_file, &lines) {
            tracing::warn!(profile = %token.profile, error = %e, "mailbox not delivered");
            return;
        }
        self.registry()
            .delivered(token, project, last, fresh.len() as u64, roster);
        self.acknowledge(token, last).await;
    }

    /// Acknowledges a profile's mailbox through `seq` under its lease; a failure is retried
    /// by the next tick.
    async fn acknowledge(&self, token: FencingToken, seq: u64) {
        let ack = AckMessages {
            lease: token.lease,
            generation: token.generation,
            through_seq: seq,
        };
        if let Err(e) = self.inner.control.ack_messages(token.profile, &ack).await {
            tracing::debug!(profile = %token.profile, error = %e, "mailbox not acknowledged yet");
        }
    }
}

/// Appends to a file only the worker writes (the run directory is read-only inside); past
/// the bound the newest half is kept.
fn append_bounded(file: &Path, bytes: &[u8]) -> Result<(), AgentError> {
    let io = |e: std::io::Error| AgentError::from(WorkerError::io("appending", file, e));
    let len = fs::metadata(file).map(|m| m.len()).unwrap_or(0);
    if len + bytes.len() as u64 > MAILBOX_FILE_BYTES_MAX {
        let old = fs::read(file).map_err(io)?;
        let keep = &old[old.len() / 2..];
        let start = keep
            .iter()
            .position(|b| *b == b'\n')
            .map_or(keep.len(), |p| p + 1);
        let mut next = keep[start..].to_vec();
        next.extend_from_slice(bytes);
        return write_atomic(file, &next).map_err(AgentError::from);
    }
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_bounded_keeps_whole_lines_past_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mailbox.jsonl");
        let line = vec![b'x'; 1023];
        let mut one = line.clone();
        one.push(b'\n');
        let total = (MAILBOX_FILE_BYTES_MAX / 1024) + 8;
        for _ in 0..total {
            append_bounded(&file, &one).unwrap();
        }
        let bytes = fs::read(&file).unwrap();
        assert!(bytes.len() as u64 <= MAILBOX_FILE_BYTES_MAX);
        assert!(bytes.len() as u64 >= MAILBOX_FILE_BYTES_MAX / 2 - 1024);
        assert!(bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .all(|l| l == line.as_slice()));
    }
}
