//! The proposal batcher: writes that arrive while earlier ones are being committed share one
//! Raft entry (`Command::Batch`), so a busy node pays the per-entry cost of Raft (append,
//! replicate, fsync, apply, notify) once per batch instead of once per write.
//!
//! It adds no waiting of its own. At most [`PROPOSALS_IN_FLIGHT_MAX`] entries are being
//! committed at once; the next entry takes every write queued by the time a slot frees. An
//! idle node therefore proposes each write alone, at once, and a loaded one in batches whose
//! size follows the load.
//!
//! An entry's wait is bounded by the write timeout: openraft 0.9 answers a proposal when its
//! entry is applied here or its index is truncated by a conflict, but not when a snapshot from
//! a newer leader replaces the log it was in (a leader cut off, deposed, then caught up by
//! snapshot). Such a proposal is never answered, and unbounded it would hold its slot for
//! good: a node with both slots held could never commit again once it led — writes timed
//! out on it, and forwards to it, until it restarted (the chaos suite's post-heal stall).
//! Past the bound the batch's writes are answered "timed out, outcome unknown" and the slot
//! is free.
//!
//! Each command of a batch is applied exactly as a single entry would be (its own idempotency
//! key, the batch's leader-stamped time), so batching changes no answer. A write that meets a
//! follower comes back as `WriteError::NotLeader`; forwarding it is the write path's decision.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use squadron_api::TraceId;
use squadron_core::access::Subject;
use squadron_core::codec::command_encoded_len;
use squadron_core::command::Batch;
use squadron_core::ids::IdempotencyKey;
use squadron_core::limits::COMMANDS_PER_BATCH_MAX;
use squadron_core::{BatchedCommand, Command, CommandEnvelope, Outcome, Response};
use squadron_raft::RaftNode;
use squadron_store::NodeAddr;
use tokio::sync::{mpsc, oneshot};

use super::batch_loop::{run_batches, BatchLimits};
use super::WriteError;
use crate::clock::ClusterClock;
use crate::raft_view;

/// Raft entries of this node being committed at once. Small, so that writes queue (and
/// batch) behind a few entries rather than each becoming its own.
pub const PROPOSALS_IN_FLIGHT_MAX: usize = 2;
/// Writes waiting for an entry; beyond it a write is answered "overloaded" at once.
pub const PROPOSAL_QUEUE_MAX: usize = 16_384;
/// Encoded bytes of one batch entry (the core's entry limit is 4 MiB, the log's 16 MiB).
pub const BATCH_BYTES_MAX: usize = 2 * 1024 * 1024;

/// Counters and histograms of `/metrics`.
#[derive(Debug)]
pub struct BatchStats {
    /// Raft entries the batcher proposed and saw committed.
    pub entries: AtomicU64,
    /// Writes carried by them.
    pub commands: AtomicU64,
    /// Entries given up at the commit bound (their writes' outcome unknown).
    pub abandoned: AtomicU64,
    /// From an entry's proposal to its answer: appended, replicated to a majority, applied.
    pub commit_seconds: Histogram,
    /// Writes per committed entry.
    pub writes_per_entry: Histogram,
}

impl Default for BatchStats {
    fn default() -> Self {
        BatchStats {
            entries: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            // 0.1 ms doubling to about 6.5 s (the write timeout's order).
            commit_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 17)),
            // 1 doubling to `COMMANDS_PER_BATCH_MAX`'s order.
            writes_per_entry: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
        }
    }
}

struct Pending {
    subject: Subject,
    key: Option<IdempotencyKey>,
    command: Command,
    bytes: usize,
    traced: Traced,
    reply: oneshot::Sender<Result<Response, WriteError>>,
}

/// What the "command applied" line names of a write: its request's trace id and its command.
#[derive(Debug, Clone, Copy)]
struct Traced {
    trace: Option<TraceId>,
    command: &'static str,
}

impl Traced {
    fn of(command: &Command) -> Self {
        Self {
            trace: crate::trace::current(),
            command: command.name(),
        }
    }

    /// Logged once its entry is applied here; at debug, as a line per write would cost a
    /// busy leader more than its fsyncs. The fields are built inside the macro, so a leader
    /// that does not log at debug formats no trace id per write.
    fn applied(&self, index: u64, response: &Response) {
        tracing::debug!(
            trace_id = self.trace.map(|t| t.to_string()).unwrap_or_default(),
            index,
            command = self.command,
            rejected = !response.is_ok(),
            "command applied"
        );
    }
}

#[derive(Debug, Clone)]
pub struct ProposalBatcher {
    tx: mpsc::Sender<Pending>,
    stats: Arc<BatchStats>,
}

impl ProposalBatcher {
    /// Starts the batching task on the current runtime.
    /// `commit_wait` bounds how long one entry may wait to be committed and applied.
    pub fn start(
        raft: RaftNode,
        clock: Arc<ClusterClock>,
        commit_wait: Duration,
    ) -> ProposalBatcher {
        let (tx, rx) = mpsc::channel(PROPOSAL_QUEUE_MAX);
        let stats = Arc::new(BatchStats::default());
        tokio::spawn(run(raft, clock, commit_wait, rx, stats.clone()));
        ProposalBatcher { tx, stats }
    }

    pub fn stats(&self) -> &BatchStats {
        &self.stats
    }

    /// Proposes one command and waits for its answer.
    pub async fn propose(
        &self,
        subject: Subject,
        key: Option<IdempotencyKey>,
        command: Command,
    ) -> Result<Response, WriteError> {
        let (reply, answer) = oneshot::channel();
        let bytes = command_encoded_len(&command);
        let pending = Pending {
            traced: Traced::of(&command),
            subject,
            key,
            command,
            bytes,
            reply,
        };
        if self.tx.try_send(pending).is_err() {
            return Err(WriteError::Overloaded);
        }
        answer
            .await
            .unwrap_or_else(|_| Err(WriteError::Raft("the batcher stopped".into())))
    }
}

async fn run(
    raft: RaftNode,
    clock: Arc<ClusterClock>,
    commit_wait: Duration,
    rx: mpsc::Receiver<Pending>,
    stats: Arc<BatchStats>,
) {
    let limits = BatchLimits {
        in_flight_max: PROPOSALS_IN_FLIGHT_MAX,
        items_max: COMMANDS_PER_BATCH_MAX,
        weight_max: BATCH_BYTES_MAX,
    };
    run_batches(
        rx,
        limits,
        |p| p.bytes,
        |_, _| true,
        move |batch| {
            let (raft, stats) = (raft.clone(), stats.clone());
            let at_ms = clock.now_ms();
            async move {
                let writes = batch.len();
                // Dropped at the bound, the batch's reply senders answer its writes with
                // "the batcher stopped", by then past their own identical timeout anyway.
                if tokio::time::timeout(commit_wait, commit(&raft, at_ms, batch, &stats))
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        writes,
                        wait_ms = commit_wait.as_millis() as u64,
                        "an entry was neither committed nor refused in time; its writes' \
                         outcome is unknown"
                    );
                    stats.abandoned.fetch_add(1, Ordering::Relaxed);
                }
            }
        },
    )
    .await;
}

/// A batch entry's own subject is the node that proposed it; each batched command keeps its
/// caller's. `at_ms` is the cluster clock when the batch was formed.
async fn commit(raft: &RaftNode, at_ms: u64, mut batch: Vec<Pending>, stats: &BatchStats) {
    let proposed = Instant::now();
    let count = |n: usize| {
        stats.entries.fetch_add(1, Ordering::Relaxed);
        stats.commands.fetch_add(n as u64, Ordering::Relaxed);
        stats
            .commit_seconds
            .observe(proposed.elapsed().as_secs_f64());
        stats.writes_per_entry.observe(n as f64);
    };
    if batch.len() == 1 {
        let Some(p) = batch.pop() else { return };
        let envelope = CommandEnvelope {
            at_ms,
            idempotency_key: p.key,
            subject: p.subject,
            command: p.command,
        };
        let answer = raft.client_write(envelope).await;
        if let Ok(r) = &answer {
            count(1);
            p.traced.applied(r.log_id.index, &r.data);
        }
        let _ = p.reply.send(answer.map(|r| r.data).map_err(failure));
        return;
    }
    let mut replies = Vec::with_capacity(batch.len());
    let mut traced = Vec::with_capacity(batch.len());
    let commands = batch
        .into_iter()
        .map(|p| {
            replies.push(p.reply);
            traced.push(p.traced);
            BatchedCommand {
                idempotency_key: p.key,
                subject: p.subject,
                command: p.command,
            }
        })
        .collect();
    let envelope = CommandEnvelope {
        at_ms,
        idempotency_key: None,
        subject: Subject::Node(raft_view::node_id(raft)),
        command: Command::Batch(Batch { commands }),
    };
    match raft.client_write(envelope).await {
        Ok(r) => match r.data {
            Response::Ok(Outcome::Batch { responses }) if responses.len() == replies.len() => {
                count(replies.len());
                for ((reply, response), traced) in replies.into_iter().zip(responses).zip(traced) {
                    traced.applied(r.log_id.index, &response);
                    let _ = reply.send(Ok(response));
                }
            }
            other => {
                // Cannot happen: apply answers a batch with one response per command. The
                // entry is committed, so the outcome of each write is unknown to its caller.
                tracing::error!(answer = ?other, "a batch was answered with something else");
                for reply in replies {
                    let _ = reply.send(Err(WriteError::Raft(
                        "the batch's answer was malformed; the outcome is unknown".into(),
                    )));
                }
            }
        },
        Err(e) => {
            let f = failure(e);
            for reply in replies {
                let _ = reply.send(Err(f.clone()));
            }
        }
    }
}

fn failure(e: RaftError<u64, ClientWriteError<u64, NodeAddr>>) -> WriteError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => WriteError::NotLeader {
            leader: f.leader_node,
        },
        other => WriteError::Raft(other.to_string()),
    }
}
