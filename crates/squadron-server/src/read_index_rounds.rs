//! Read-index rounds shared by concurrent linearizable reads.
//!
//! A linearizable read needs an index obtained by confirming leadership (a heartbeat round
//! to a quorum; on a follower, one request to the leader) *after* the read began. Reads that
//! arrive while a round is in flight wait for the next round, which starts after they
//! arrived, and share its answer: one round serves every read queued behind it, so the cost
//! of a read under load falls from one round each to one round per batch.
//!
//! Correctness: a round's index is at least the commit index at the moment the round began
//! (Raft's ReadIndex), and every read it answers began before that moment.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

/// Reads waiting for the next round; beyond it a read is refused at once.
pub const READS_WAITING_MAX: usize = 65_536;

pub type RoundFuture = Pin<Box<dyn Future<Output = Result<Option<u64>, String>> + Send>>;
/// Runs one round: confirms leadership (or asks the leader) and answers the read index.
pub type RoundFn = Arc<dyn Fn() -> RoundFuture + Send + Sync>;

type Waiter = oneshot::Sender<Result<Option<u64>, String>>;

#[derive(Default)]
struct Queue {
    running: bool,
    waiting: Vec<Waiter>,
}

/// Counters of `/metrics`.
#[derive(Debug, Default)]
pub struct RoundStats {
    pub rounds: AtomicU64,
    pub reads: AtomicU64,
}

#[derive(Clone)]
pub struct ReadIndexRounds {
    queue: Arc<Mutex<Queue>>,
    round: RoundFn,
    stats: Arc<RoundStats>,
}

impl std::fmt::Debug for ReadIndexRounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadIndexRounds")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl ReadIndexRounds {
    pub fn new(round: RoundFn) -> ReadIndexRounds {
        ReadIndexRounds {
            queue: Arc::new(Mutex::new(Queue::default())),
            round,
            stats: Arc::new(RoundStats::default()),
        }
    }

    pub fn stats(&self) -> &RoundStats {
        &self.stats
    }

    /// The read index of a round that began after this call.
    pub async fn index(&self) -> Result<Option<u64>, String> {
        let (tx, rx) = oneshot::channel();
        let start_driver = {
            let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            if q.waiting.len() >= READS_WAITING_MAX {
                return Err(format!(
                    "{READS_WAITING_MAX} reads are already waiting for a read index"
                ));
            }
            q.waiting.push(tx);
            !std::mem::replace(&mut q.running, true)
        };
        if start_driver {
            tokio::spawn(drive(
                self.queue.clone(),
                self.round.clone(),
                self.stats.clone(),
            ));
        }
        rx.await
            .unwrap_or_else(|_| Err("the read-index round was dropped".into()))
    }
}

/// Runs rounds while reads wait; each round answers exactly the reads queued before it began.
async fn drive(queue: Arc<Mutex<Queue>>, round: RoundFn, stats: Arc<RoundStats>) {
    loop {
        let batch = {
            let mut q = queue.lock().unwrap_or_else(PoisonError::into_inner);
            if q.waiting.is_empty() {
                q.running = false;
                return;
            }
            std::mem::take(&mut q.waiting)
        };
        stats.rounds.fetch_add(1, Ordering::Relaxed);
        stats.reads.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let answer = round().await;
        for waiter in batch {
            let _ = waiter.send(answer.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// A round that answers its own sequence number after a pause, so a test can tell which
    /// round answered a read.
    fn counting_round(started: Arc<AtomicUsize>) -> RoundFn {
        Arc::new(move || {
            let started = started.clone();
            Box::pin(async move {
                let n = started.fetch_add(1, Ordering::SeqCst) as u64 + 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(Some(n))
            })
        })
    }

    #[tokio::test]
    async fn reads_that_arrive_during_a_round_are_answered_by_a_later_round() {
        let started = Arc::new(AtomicUsize::new(0));
        let rounds = ReadIndexRounds::new(counting_round(started.clone()));
        let first = tokio::spawn({
            let r = rounds.clone();
            async move { r.index().await }
        });
        // Let round 1 begin, then send reads while it is in flight.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(started.load(Ordering::SeqCst), 1);
        let late: Vec<_> = (0..20)
            .map(|_| {
                let r = rounds.clone();
                tokio::spawn(async move { r.index().await })
            })
            .collect();
        assert_eq!(first.await.unwrap(), Ok(Some(1)));
        for l in late {
            // Never the round that began before they arrived.
            assert_eq!(l.await.unwrap(), Ok(Some(2)));
        }
        assert_eq!(
            started.load(Ordering::SeqCst),
            2,
            "20 reads shared one round"
        );
        assert_eq!(rounds.stats().reads.load(Ordering::Relaxed), 21);
    }

    #[tokio::test]
    async fn a_failed_round_fails_its_reads_and_the_next_round_runs_afresh() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let rounds = ReadIndexRounds::new(Arc::new(move || {
            let n = c.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if n == 0 {
                    Err("no quorum".to_string())
                } else {
                    Ok(Some(7))
                }
            })
        }));
        assert_eq!(rounds.index().await, Err("no quorum".into()));
        assert_eq!(rounds.index().await, Ok(Some(7)));
    }
}
