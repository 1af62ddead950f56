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
use prometheus_client::encoding::{text, DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::node::ControlNode;
use crate::rest::AppState;

/// The content type of an OpenMetrics text exposition.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub async fn render(State(node): State<AppState>) -> Response {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(NodeMetrics(node)));
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

/// One node's metrics, read when scraped.
#[derive(Debug)]
struct NodeMetrics(AppState);

impl Collector for NodeMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let node = &self.0;
        raft(node, &mut encoder)?;
        writes(node, &mut encoder)?;
        reads(node, &mut encoder)?;
        node.state.with_state(StateGauges::of).encode(&mut encoder)
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

/// A gauge with one sample per label set.
fn gauges<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, u64)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
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
    )
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
    )
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
    )
}

/// Counts of the replicated state, taken under one read of it.
#[derive(Debug, Default)]
struct StateGauges {
    tasks: BTreeMap<&'static str, u64>,
    leases: BTreeMap<&'static str, u64>,
    workers: BTreeMap<String, u64>,
    /// `tenant/project`, slots held, `max_active`.
    slots: Vec<(String, u32, u32)>,
}

impl StateGauges {
    fn of(s: &squadron_core::State) -> StateGauges {
        let mut g = StateGauges::default();
        for t in s.tasks(None) {
            *g.tasks.entry(t.state.as_str()).or_default() += 1;
        }
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

    fn encode(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        gauges(
            e,
            "squadron_tasks",
            "Tasks by state",
            self.tasks.iter().map(|(s, n)| ([("state", *s)], *n)),
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
        let mut tasks = BTreeMap::new();
        tasks.insert("pending", 3);
        let text = exposition_of(StateGauges {
            tasks,
            ..StateGauges::default()
        });
        assert!(
            text.contains("# TYPE squadron_forwards counter\n"),
            "{text}"
        );
        assert!(text.contains("\nsquadron_forwards_total 7\n"), "{text}");
        assert!(
            text.contains("\nsquadron_tasks{state=\"pending\"} 3\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
