//! Who did what: a bounded, replicated record of the state-changing commands that were applied
//! (a refused command changes nothing, the audit record included; the node's log names the
//! refusals it answered).
//! Periodic machinery (heartbeats, renewals, progress counters, the sweep, the scheduler) is
//! left out, so the record holds decisions rather than noise; the subject of those commands is
//! still in their log entries.

use std::collections::VecDeque;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::subject::Subject;
use crate::limits::AUDIT_RECORDS_KEPT;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AuditRecord {
    /// Rises by one per record, from 1; survives pruning, so a reader can page.
    pub seq: u64,
    pub at_ms: u64,
    pub subject: Subject,
    /// `Command::name()`.
    pub command: String,
    /// What the command named first (a project, profile, lease, task, worker, token).
    pub target: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AuditLog {
    next_seq: u64,
    records: VecDeque<AuditRecord>,
}

impl AuditLog {
    pub(crate) fn record(&mut self, at_ms: u64, subject: &Subject, command: &str, target: String) {
        self.next_seq += 1;
        self.records.push_back(AuditRecord {
            seq: self.next_seq,
            at_ms,
            subject: subject.clone(),
            command: command.to_owned(),
            target,
        });
        while self.records.len() > AUDIT_RECORDS_KEPT {
            self.records.pop_front();
        }
    }

    /// Records with `seq > after`, oldest first, at most `limit`.
    pub fn after(&self, after: u64, limit: usize) -> impl Iterator<Item = &AuditRecord> {
        self.records
            .iter()
            .filter(move |r| r.seq > after)
            .take(limit)
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The checker's view: sequence numbers rise by one and the log stays within its bound.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.records.len() > AUDIT_RECORDS_KEPT {
            return Err(format!("audit holds {} records", self.records.len()));
        }
        let mut expected = self
            .records
            .front()
            .map(|r| r.seq)
            .unwrap_or(self.next_seq + 1);
        for r in &self.records {
            if r.seq != expected {
                return Err(format!("audit seq {} where {expected} was due", r.seq));
            }
            expected += 1;
        }
        if !self.records.is_empty() && expected != self.next_seq + 1 {
            return Err("audit next_seq does not follow the last record".into());
        }
        Ok(())
    }
}
