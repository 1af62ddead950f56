//! `/metrics` in the OpenMetrics text format, encoded by `prometheus-client`: it escapes label
//! values and names each counter's sample `…_total`. The values stay where they are counted
//! (the write path, the read-index rounds, the log store, the replicated state); a collector
//! reads them at each scrape.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    text, DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use squadron_core::task_tally::{DurationTally, TaskTally, DURATION_BUCKET_BOUNDS_MS};

use crate::node::ControlNode;
use crate::rest::AppState;

pub use squadron_api::OPENMETRICS_CONTENT_TYPE;

pub async fn render(State(node): State<AppState>) -> Response {
    // The state's figures: the small parts read under the lock, the live tasks scanned after
    // it from a copy of their persistent map, on the blocking pool, so a large state holds
    // neither apply nor a runtime thread (and the heartbeats behind it). The ended tasks'
    // figures the state keeps summed: they never change, and decoding each would cost a
    // scrape a second at a million tasks.
    let reader = node.clone();
    let gauges = tokio::task::spawn_blocking(move || {
        let now_ms = reader.clock.now_ms();
        let (mut gauges, tasks) = reader
            .state
            .with_state(|s| (StateGauges::of(s, now_ms), s.tasks_shared()));
        gauges.add_live_tasks(tasks.values().filter_map(|t| t.live()));
        gauges
    })
    .await;
    let gauges = match gauges {
        Ok(g) => g,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(NodeMetrics(node, gauges)));
    match exposition(&registry) {
        Ok(text) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn exposition(registry: &Registry) -> Result<String, fmt::Error> {
    let mut out = String::new();
    text::encode(&mut out, registry)?;
    Ok(out)
}

/// One node's metrics, read when scraped, with the state's figures read before.
#[derive(Debug)]
struct NodeMetrics(AppState, StateGauges);

impl Collector for NodeMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let node = &self.0;
        raft(node, &mut encoder)?;
        writes(node, &mut encoder)?;
        reads(node, &mut encoder)?;
        clock(node, &mut encoder)?;
        machine(node, &mut encoder)?;
        self.1.encode(&mut encoder)
    }
}

/// An agent whose last check-in is older than this is not counted as connected: three of the
/// default 30 s heartbeats.
pub const AGENT_CONNECTED_WITHIN_MS: u64 = 90_000;
/// A histogram in seconds read from tallies in milliseconds: the live tasks' durations, observed
/// as the state is scanned, plus those of the ended tasks (the pruned ones too), which the
/// state keeps summed. prometheus-client's `Histogram` takes observations one by one, and the
/// ended ones exist only as bucket counts.
#[derive(Debug, Clone, Copy)]
struct TallyHistogram<'a>(&'a DurationTally);

impl EncodeMetric for TallyHistogram<'_> {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        let bounds = DURATION_BUCKET_BOUNDS_MS
            .iter()
            .map(|ms| *ms as f64 / 1000.0)
            .chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds.zip(self.0.buckets.iter().copied()).collect();
        let sum = self.0.sum_ms as f64 / 1000.0;
        encoder.encode_histogram::<NoLabelSet>(sum, self.0.count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
}

/// `name` without the `_total` the encoder appends to the sample.
fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let counter = ConstCounter::new(value);
    counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)
}

/// A metric family of `kind` with one sample per label set.
fn family<L: EncodeLabelSet, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    (name, help, kind): (&str, &str, MetricType),
    samples: impl IntoIterator<Item = (L, M)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, metric) in samples {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A gauge with one sample per label set.
fn gauges<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, u64)>,
) -> fmt::Result {
    let samples = samples.into_iter().map(|(l, v)| (l, ConstGauge::new(v)));
    family(encoder, (name, help, MetricType::Gauge), samples)
}

fn raft(node: &ControlNode, e: &mut DescriptorEncoder) -> fmt::Result {
    let m = node.raft.metrics().borrow().clone();
    gauge(e, "squadron_raft_term", "Current Raft term", m.current_term)?;
    gauge(
        e,
        "squadron_raft_is_leader",
        "1 when this node is the leader",
        u64::from(m.current_leader == Some(node.id)),
    )?;
    gauge(
        e,
        "squadron_raft_last_log_index",
        "Index of the last log entry",
        m.last_log_index.unwrap_or(0),
    )?;
    gauge(
        e,
        "squadron_raft_applied_index",
        "Index of the last applied entry",
        m.last_applied.map_or(0, |l| l.index),
    )?;
    let appends = &node.append_stats;
    counter(
        e,
        "squadron_log_appends",
        "Synced log appends (one fsync each)",
        appends.appends.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "squadron_log_entries_appended",
        "Log entries written by those appends; entries / appends = proposals per fsync",
        appends.entries.load(Ordering::Relaxed),
    )?;
    histogram(
        e,
        "squadron_log_sync_duration_seconds",
        "How long each sync of the log's write-ahead log took",
        &appends.sync_seconds,
    )?;
    histogram(
        e,
        "squadron_log_entries_per_sync",
        "Log entries each synced append made durable (group commit)",
        &appends.entries_per_sync,
    )
}

/// The state machine: apply and snapshot costs (DESIGN §7's apply p99 and snapshot stall).
fn machine(node: &ControlNode, e: &mut DescriptorEncoder) -> fmt::Result {
    let m = node.state.stats();
    counter(
        e,
        "squadron_entries_applied",
        "Log entries applied to the state machine",
        m.entries_applied.load(Ordering::Relaxed),
    )?;
    histogram(
        e,
        "squadron_apply_duration_seconds",
        "Each applied batch of entries, from asking for the state's write lock to releasing it",
        &m.apply_seconds,
    )?;
    histogram(
        e,
        "squadron_apply_entry_duration_seconds",
        "Each log entry applied (one entry may carry a batch of concurrent commands), under the lock",
        &m.apply_entry_seconds,
    )?;
    histogram(
        e,
        "squadron_apply_entry_cpu_seconds",
        "The applying thread's CPU time for each log entry (its wall time less the time its core was taken)",
        &m.apply_entry_cpu_seconds,
    )?;
    histogram(
        e,
        "squadron_apply_lock_wait_seconds",
        "The part of each apply spent waiting for the lock (readers, a snapshot's copy)",
        &m.apply_lock_wait_seconds,
    )?;
    histogram(
        e,
        "squadron_snapshot_build_duration_seconds",
        "Each snapshot built: copied under the lock, encoded, written to disk",
        &m.snapshot_build_seconds,
    )?;
    histogram(
        e,
        "squadron_snapshot_copy_duration_seconds",
        "The copy of the state each snapshot took under the read lock",
        &m.snapshot_copy_seconds,
    )?;
    histogram(
        e,
        "squadron_snapshot_install_duration_seconds",
        "Each snapshot received from the leader: checked, written to disk, decoded, installed",
        &m.snapshot_install_seconds,
    )?;
    gauge(
        e,
        "squadron_snapshot_bytes",
        "Size of the last snapshot this node built, installed or started from",
        m.snapshot_bytes.load(Ordering::Relaxed),
    )
}

fn histogram(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    histogram: &Histogram,
) -> fmt::Result {
    histogram.encode(encoder.encode_descriptor(name, help, None, MetricType::Histogram)?)
}

fn clock(node: &ControlNode, e: &mut DescriptorEncoder) -> fmt::Result {
    let gauge = ConstGauge::new(node.clock.offset_ms() as f64 / 1000.0);
    gauge.encode(e.encode_descriptor(
        "squadron_clock_offset_seconds",
        "This node's wall clock minus the cluster clock it stamps and reads deadlines by",
        None,
        gauge.metric_type(),
    )?)
}

fn writes(node: &ControlNode, e: &mut DescriptorEncoder) -> fmt::Result {
    let stats = node.writes.stats();
    let batches = node.writes.batcher().stats();
    counter(
        e,
        "squadron_proposals",
        "Commands proposed by this node and applied",
        stats.proposals.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "squadron_proposals_rejected",
        "Applied commands answered with a rejection",
        stats.proposals_rejected.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "squadron_forwards",
        "Writes forwarded to the leader",
        stats.forwards.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "squadron_writes_leader_waited",
        "Writes that arrived while this node knew no leader and waited for an election",
        stats.leader_waits.load(Ordering::Relaxed),
    )?;
    let appends = node.tls.raft_append_stats();
    counter(
        e,
        "squadron_raft_append_streams_opened",
        "Streams this node opened to its peers for Raft appends",
        appends.streams_opened.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "squadron_raft_appends_streamed",
        "Raft appends this node sent on a stream and had answered",
        appends.streamed.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "squadron_raft_appends_unary",
        "Raft appends this node sent as unary calls (the peer's stream busy, or none)",
        appends.unary.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "squadron_forward_requests",
        "Requests that carried this node's forwarded writes to the leader (a batch is one)",
        node.writes.forwarder().requests(),
    )?;
    counter(
        e,
        "squadron_proposal_entries",
        "Raft entries this node proposed (a batch is one)",
        batches.entries.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "squadron_proposal_commands",
        "Writes those entries carried; divided by the entries, the batch size",
        batches.commands.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "squadron_proposal_entries_abandoned",
        "Entries this node stopped waiting for at the write timeout (their writes' outcome unknown)",
        batches.abandoned.load(Ordering::Relaxed),
    )?;
    histogram(
        e,
        "squadron_proposal_commit_duration_seconds",
        "From an entry's proposal on this node to its answer: appended, replicated, applied \
         (committed entries only; abandoned ones are counted above)",
        &batches.commit_seconds,
    )?;
    histogram(
        e,
        "squadron_proposal_writes_per_entry",
        "Writes each committed entry of this node carried (the batch size)",
        &batches.writes_per_entry,
    )?;
    node.request_latency.family().encode(e.encode_descriptor(
        "squadron_http_request_duration_seconds",
        "REST requests by method and status class, from arrival to the answer's head",
        None,
        MetricType::Histogram,
    )?)
}

fn reads(node: &ControlNode, e: &mut DescriptorEncoder) -> fmt::Result {
    let c = &node.counters;
    let (leader, follower) = (node.leader_reads.stats(), node.follower_reads.stats());
    counter(
        e,
        "squadron_reads_linearizable",
        "Linearizable reads served",
        c.linearizable_reads.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "squadron_reads_stale",
        "Stale reads served",
        c.stale_reads.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "squadron_read_index_rounds",
        "Leadership confirmations (leader) and read-index requests (follower) made for reads",
        leader.rounds.load(Ordering::Relaxed) + follower.rounds.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "squadron_read_index_reads",
        "Linearizable reads those rounds answered",
        leader.reads.load(Ordering::Relaxed) + follower.reads.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "squadron_mcp_denied",
        "MCP authorization checks answered 403 / PERMISSION_DENIED by this node",
        c.mcp_denials.total(),
    )?;
    let accepted = [
        ("rest", &c.accepted.rest),
        ("grpc", &c.accepted.grpc),
        ("peer", &c.accepted.peer),
    ];
    family(
        e,
        (
            "squadron_connections_accepted",
            "TCP connections each listener accepted since the node started (TLS handshakes begun)",
            MetricType::Counter,
        ),
        accepted.map(|(listener, n)| {
            (
                [("listener", listener)],
                ConstCounter::new(n.load(Ordering::Relaxed)),
            )
        }),
    )
}

/// Counts of the replicated state, taken under one read of it.
#[derive(Debug, Default)]
struct StateGauges {
    /// Every task's figures, held and pruned: the states each entered (the seed's
    /// `tasks_total{state}`), submit to end by end state (`task_duration_seconds{outcome}`),
    /// PROVISIONING to READY by runtime (`vm_provision_duration_seconds`).
    tally: TaskTally,
    /// Tasks not ended, by state (`tasks_active{state}`).
    active: BTreeMap<&'static str, u64>,
    /// Agents of running attempts heard from within `AGENT_CONNECTED_WITHIN_MS`.
    agents_connected: u64,
    /// Ended tasks the retention policy pruned.
    pruned: u64,
    leases: BTreeMap<&'static str, u64>,
    workers: BTreeMap<String, u64>,
    /// `tenant/project`, slots held, `max_active`.
    slots: Vec<(String, u32, u32)>,
}

impl StateGauges {
    /// Everything but the live tasks, which [`Self::add_live_tasks`] adds.
    fn of(s: &squadron_core::State, now_ms: u64) -> StateGauges {
        let mut g = StateGauges::default();
        g.add_ended(s.ended_tasks_tally(), s.pruned_tasks().count);
        g.agents_connected = s
            .agent_sessions()
            .filter(|(_, a)| now_ms.saturating_sub(a.last_seen_ms) <= AGENT_CONNECTED_WITHIN_MS)
            .count() as u64;
        for l in s.leases() {
            *g.leases.entry(l.state.name()).or_default() += 1;
        }
        for w in s.workers() {
            *g.workers
                .entry(format!("{:?}", w.status).to_lowercase())
                .or_default() += 1;
        }
        g.slots = s
            .projects()
            .map(|p| {
                (
                    format!("{}/{}", p.tenant, p.project),
                    p.slots_held,
                    p.max_active,
                )
            })
            .collect();
        g
    }

    fn add_live_tasks<'a>(&mut self, tasks: impl Iterator<Item = &'a squadron_core::task::Task>) {
        for t in tasks {
            assert!(
                !t.state.is_terminal(),
                "task {} is held live in {}",
                t.id,
                t.state
            );
            self.tally.add(t);
            *self.active.entry(t.state.as_str()).or_default() += 1;
        }
    }

    /// Every task that ended, the ones the retention policy pruned too (`pruned` of them):
    /// counts and durations only grow.
    fn add_ended(&mut self, ended: &TaskTally, pruned: u64) {
        self.tally.absorb(ended);
        self.pruned = pruned;
    }

    fn encode(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        // The seed's task metrics under the `squadron_` prefix.
        family(
            e,
            (
                "squadron_tasks",
                "Tasks that entered each state (the sample is squadron_tasks_total)",
                MetricType::Counter,
            ),
            self.tally
                .entered
                .iter()
                .map(|(s, n)| ([("state", s.as_str())], ConstCounter::new(*n))),
        )?;
        gauges(
            e,
            "squadron_tasks_active",
            "Tasks not ended, by state",
            self.active.iter().map(|(s, n)| ([("state", *s)], *n)),
        )?;
        counter(
            e,
            "squadron_tasks_pruned",
            "Ended tasks the retention policy pruned ([retention.terminal_tasks])",
            self.pruned,
        )?;
        family(
            e,
            (
                "squadron_task_duration_seconds",
                "Submit to end of ended tasks, by the state they ended in",
                MetricType::Histogram,
            ),
            self.tally
                .durations
                .iter()
                .map(|(s, t)| ([("outcome", s.as_str())], TallyHistogram(t))),
        )?;
        family(
            e,
            (
                "squadron_vm_provision_duration_seconds",
                "PROVISIONING to READY (the sandbox made and, where one runs, its agent registered), by runtime",
                MetricType::Histogram,
            ),
            self.tally.provisions.iter().map(|(r, t)| {
                let runtime: &'static str = (*r).into();
                ([("runtime", runtime)], TallyHistogram(t))
            }),
        )?;
        gauge(
            e,
            "squadron_agent_connected",
            "Agents of running attempts that checked in within the last 90 s",
            self.agents_connected,
        )?;
        gauges(
            e,
            "squadron_leases",
            "Retained leases by state",
            self.leases.iter().map(|(s, n)| ([("state", *s)], *n)),
        )?;
        gauges(
            e,
            "squadron_workers",
            "Workers by status",
            self.workers
                .iter()
                .map(|(s, n)| ([("status", s.as_str())], *n)),
        )?;
        gauges(
            e,
            "squadron_project_slots_held",
            "Slot-holding leases per project (INV-5)",
            self.slots.iter().map(|(project, held, max)| {
                (
                    ([("project", project.as_str())], [("max", *max)]),
                    u64::from(*held),
                )
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fixed(StateGauges);

    impl Collector for Fixed {
        fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
            counter(&mut encoder, "squadron_forwards", "Writes forwarded", 7)?;
            self.0.encode(&mut encoder)
        }
    }

    fn exposition_of(gauges: StateGauges) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Fixed(gauges)));
        exposition(&registry).unwrap()
    }

    #[test]
    fn label_values_with_a_quote_a_backslash_and_a_newline_are_escaped() {
        let text = exposition_of(StateGauges {
            slots: vec![("a\"b\\c\nd".into(), 2, 4)],
            ..StateGauges::default()
        });
        assert!(
            text.contains("squadron_project_slots_held{project=\"a\\\"b\\\\c\\nd\",max=\"4\"} 2\n"),
            "{text}"
        );
        // Every sample stays on one line: no label value broke out of its quotes.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("squadron_"), "{line:?} in\n{text}");
        }
    }

    /// `squadron-bench`, the end-to-end tests and the docs read these exact sample names.
    #[test]
    fn counters_are_named_total_and_the_exposition_ends_with_eof() {
        let mut active = BTreeMap::new();
        active.insert("PENDING", 3);
        let text = exposition_of(StateGauges {
            active,
            ..StateGauges::default()
        });
        assert!(
            text.contains("# TYPE squadron_forwards counter\n"),
            "{text}"
        );
        assert!(text.contains("\nsquadron_forwards_total 7\n"), "{text}");
        assert!(
            text.contains("\nsquadron_tasks_active{state=\"PENDING\"} 3\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    /// The seed's set: tasks entered per state, active per state, durations per outcome and
    /// provisioning per runtime as histograms, connected agents.
    #[test]
    fn the_seed_task_metrics_are_exposed() {
        use squadron_core::manifest::RuntimeKind;
        use squadron_core::task::TaskState;
        let mut g = StateGauges::default();
        g.tally.entered.insert(TaskState::Completed, 2);
        g.active.insert("RUNNING", 1);
        let observed = |values_ms: &[u64]| {
            let mut t = DurationTally::default();
            values_ms.iter().for_each(|v| t.observe(*v));
            t
        };
        g.tally
            .durations
            .insert(TaskState::Completed, observed(&[200, 3_000]));
        g.tally
            .provisions
            .insert(RuntimeKind::Docker, observed(&[1_500]));
        g.agents_connected = 1;
        let mut pruned = TaskTally {
            count: 5,
            ..Default::default()
        };
        pruned.entered.insert(TaskState::Completed, 5);
        let mut tally = DurationTally::default();
        tally.observe(400);
        pruned.durations.insert(TaskState::Completed, tally);
        g.add_ended(&pruned, 5);
        let text = exposition_of(g);
        for want in [
            "# TYPE squadron_tasks counter\n",
            "\nsquadron_tasks_total{state=\"COMPLETED\"} 7\n",
            "\nsquadron_tasks_active{state=\"RUNNING\"} 1\n",
            "\nsquadron_tasks_pruned_total 5\n",
            "# TYPE squadron_task_duration_seconds histogram\n",
            "\nsquadron_task_duration_seconds_count{outcome=\"COMPLETED\"} 3\n",
            "\nsquadron_task_duration_seconds_sum{outcome=\"COMPLETED\"} 3.6\n",
            "\nsquadron_task_duration_seconds_bucket{le=\"0.5\",outcome=\"COMPLETED\"} 2\n",
            "\nsquadron_task_duration_seconds_bucket{le=\"+Inf\",outcome=\"COMPLETED\"} 3\n",
            "\nsquadron_vm_provision_duration_seconds_count{runtime=\"docker\"} 1\n",
            "\nsquadron_agent_connected 1\n",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
    }
}
