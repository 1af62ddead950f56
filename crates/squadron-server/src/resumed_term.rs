//! The read index of a leader that resumed its term across a restart.
//!
//! openraft 0.9.25 starts a node whose saved vote is a committed one for itself as that
//! term's leader, with no election. Its read index is the larger of the term's first entry
//! and the commit index, and the commit index it starts from is the one saved before the
//! restart — a write openraft does not sync. After a power cut of the whole cluster a read
//! could then be served from a state that missed an acknowledged write (the crash workload of
//! `jepsen/` saw it). Every write this node acknowledged in its term lies in its log, which is
//! synced; so while it leads the term it started in, a read waits for the last entry its log
//! held at the start. A leader never drops its own entries, so that index is reached as soon
//! as a quorum has them; once it has been applied the raise changes nothing. A later term has
//! its own first entry, past every acknowledged write, and needs no raise.

use openraft::storage::RaftLogStorage;
use squadron_store::{LogStore, TypeConfig};

/// The term and last log index a node's log held when it opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResumedTerm {
    pub term: u64,
    pub last_log_index: Option<u64>,
}

impl ResumedTerm {
    /// Reads the saved vote's term and the last entry, before openraft takes the store.
    pub async fn read(store: &mut LogStore) -> Result<Self, String> {
        let vote = RaftLogStorage::<TypeConfig>::read_vote(store)
            .await
            .map_err(|e| format!("read the saved vote: {e}"))?;
        let log = RaftLogStorage::<TypeConfig>::get_log_state(store)
            .await
            .map_err(|e| format!("read the log state: {e}"))?;
        Ok(Self {
            term: vote.map_or(0, |v| v.leader_id().term),
            last_log_index: log.last_log_id.map(|l| l.index),
        })
    }

    /// The index a read confirmed by this node as leader in `term` must wait for.
    pub fn raise(&self, term: u64, read_index: Option<u64>) -> Option<u64> {
        if term == self.term {
            read_index.max(self.last_log_index)
        } else {
            read_index
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ResumedTerm;

    #[test]
    fn a_read_in_the_resumed_term_waits_for_the_log_held_at_the_start() {
        let resumed = ResumedTerm {
            term: 7,
            last_log_index: Some(40),
        };
        assert_eq!(resumed.raise(7, Some(31)), Some(40));
        assert_eq!(resumed.raise(7, None), Some(40));
        assert_eq!(resumed.raise(7, Some(52)), Some(52));
    }

    #[test]
    fn a_read_in_a_later_term_keeps_its_own_index() {
        let resumed = ResumedTerm {
            term: 7,
            last_log_index: Some(40),
        };
        assert_eq!(resumed.raise(8, Some(31)), Some(31));
        assert_eq!(ResumedTerm::default().raise(3, Some(5)), Some(5));
    }
}
