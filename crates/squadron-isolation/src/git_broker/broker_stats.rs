//! The broker's counters: the evidence for "zero commits from a non-current generation"
//! and for the stale writers it turned away.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::broker_answer::{CommitOutcome, RefusalCode};

/// A snapshot of the counters since the broker started. Commit requests only, except
/// `head_reads`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerStats {
    /// Commits written.
    pub accepted: u64,
    /// Retries answered with the first answer, writing nothing.
    pub replayed: u64,
    /// Refused because the generation was not current (`stale_generation`).
    pub refused_stale: u64,
    /// Refused because HEAD was not `expected_head`.
    pub refused_head_moved: u64,
    /// Refused for bad input (`invalid_argument`, `unknown_profile`, `nothing_to_commit`).
    pub refused_invalid: u64,
    /// Refused because the key was used for another request.
    pub refused_conflict: u64,
    /// Refused because the request named a profile its socket does not serve.
    pub refused_forbidden: u64,
    /// Refused for any other reason (fence unavailable, busy, timeout, repository error).
    pub refused_other: u64,
    /// Commits after which a second fence check found a newer generation granted (or could
    /// not say which generation is current): a second writer may have existed when the commit
    /// was written. Zero by construction (see the module doc); measured so that evidence can
    /// show it.
    pub accepted_from_non_current: u64,
    /// Commits after which the second check found the generation's own lease ended (released,
    /// fenced, expired) and no newer generation granted: the lease ended while the commit was
    /// in flight, with no second writer then or since. A race with a stop, not a dual writer.
    #[serde(default)]
    pub ended_during_commit: u64,
    /// Head requests answered.
    pub head_reads: u64,
}

#[derive(Debug, Default)]
pub(crate) struct BrokerCounters {
    accepted: AtomicU64,
    replayed: AtomicU64,
    refused_stale: AtomicU64,
    refused_head_moved: AtomicU64,
    refused_invalid: AtomicU64,
    refused_conflict: AtomicU64,
    refused_forbidden: AtomicU64,
    refused_other: AtomicU64,
    accepted_from_non_current: AtomicU64,
    ended_during_commit: AtomicU64,
    head_reads: AtomicU64,
}

impl BrokerCounters {
    /// Counts the answer to one commit request.
    pub(crate) fn count_commit(&self, outcome: &CommitOutcome) {
        let counter = match outcome {
            CommitOutcome::Committed {
                replayed: false, ..
            } => &self.accepted,
            CommitOutcome::Committed { replayed: true, .. } => &self.replayed,
            CommitOutcome::Refused(refusal) => self.refusal_counter(refusal.code),
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refusal that is not an answer to a parsed commit (a bad line).
    pub(crate) fn count_refusal(&self, code: RefusalCode) {
        self.refusal_counter(code).fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_non_current(&self) {
        self.accepted_from_non_current
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_ended_during_commit(&self) {
        self.ended_during_commit.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_head_read(&self) {
        self.head_reads.fetch_add(1, Ordering::Relaxed);
    }

    fn refusal_counter(&self, code: RefusalCode) -> &AtomicU64 {
        match code {
            RefusalCode::StaleGeneration => &self.refused_stale,
            RefusalCode::HeadMoved => &self.refused_head_moved,
            RefusalCode::InvalidArgument
            | RefusalCode::UnknownProfile
            | RefusalCode::NothingToCommit => &self.refused_invalid,
            RefusalCode::Conflict => &self.refused_conflict,
            RefusalCode::Forbidden => &self.refused_forbidden,
            RefusalCode::FenceUnavailable
            | RefusalCode::Busy
            | RefusalCode::Timeout
            | RefusalCode::Internal => &self.refused_other,
        }
    }

    pub(crate) fn snapshot(&self) -> BrokerStats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        BrokerStats {
            accepted: read(&self.accepted),
            replayed: read(&self.replayed),
            refused_stale: read(&self.refused_stale),
            refused_head_moved: read(&self.refused_head_moved),
            refused_invalid: read(&self.refused_invalid),
            refused_conflict: read(&self.refused_conflict),
            refused_forbidden: read(&self.refused_forbidden),
            refused_other: read(&self.refused_other),
            accepted_from_non_current: read(&self.accepted_from_non_current),
            ended_during_commit: read(&self.ended_during_commit),
            head_reads: read(&self.head_reads),
        }
    }
}
