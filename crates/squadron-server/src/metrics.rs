//! `/metrics` in the Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::rest::AppState;

pub async fn render(State(node): State<AppState>) -> impl IntoResponse {
    let mut out = String::new();
    let m = node.raft.metrics().borrow().clone();
    let mut gauge = |name: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    };
    gauge("squadron_raft_term", "Current Raft term", m.current_term);
    gauge(
        "squadron_raft_is_leader",
        "1 when this node is the leader",
        u64::from(m.current_leader == Some(node.id)),
    );
    gauge(
        "squadron_raft_last_log_index",
        "Index of the last log entry",
        m.last_log_index.unwrap_or(0),
    );
    gauge(
        "squadron_raft_applied_index",
        "Index of the last applied entry",
        m.last_applied.map_or(0, |l| l.index),
    );
    let c = &node.counters;
    let mut counter = |name: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
        );
    };
    counter(
        "squadron_proposals_total",
        "Commands proposed by this node and applied",
        node.writes.stats().proposals.load(Ordering::Relaxed),
    );
    counter(
        "squadron_proposals_rejected_total",
        "Applied commands answered with a rejection",
        node.writes
            .stats()
            .proposals_rejected
            .load(Ordering::Relaxed),
    );
    counter(
        "squadron_forward_requests_total",
        "Requests that carried this node's forwarded writes to the leader (a batch is one)",
        node.writes.forwarder().requests(),
    );
    counter(
        "squadron_proposal_entries_total",
        "Raft entries this node proposed (a batch is one)",
        node.writes
            .batcher()
            .stats()
            .entries
            .load(Ordering::Relaxed),
    );
    counter(
        "squadron_proposal_commands_total",
        "Writes those entries carried; divided by the entries, the batch size",
        node.writes
            .batcher()
            .stats()
            .commands
            .load(Ordering::Relaxed),
    );
    counter(
        "squadron_read_index_rounds_total",
        "Leadership confirmations (leader) and read-index requests (follower) made for reads",
        node.leader_reads.stats().rounds.load(Ordering::Relaxed)
            + node.follower_reads.stats().rounds.load(Ordering::Relaxed),
    );
    counter(
        "squadron_read_index_reads_total",
        "Linearizable reads those rounds answered",
        node.leader_reads.stats().reads.load(Ordering::Relaxed)
            + node.follower_reads.stats().reads.load(Ordering::Relaxed),
    );
    counter(
        "squadron_mcp_denied_total",
        "MCP authorization checks answered 403 / PERMISSION_DENIED by this node",
        c.mcp_denials.total(),
    );
    counter(
        "squadron_forwards_total",
        "Writes forwarded to the leader",
        node.writes.stats().forwards.load(Ordering::Relaxed),
    );
    counter(
        "squadron_reads_linearizable_total",
        "Linearizable reads served",
        c.linearizable_reads.load(Ordering::Relaxed),
    );
    counter(
        "squadron_reads_stale_total",
        "Stale reads served",
        c.stale_reads.load(Ordering::Relaxed),
    );
    counter(
        "squadron_log_appends_total",
        "Synced log appends (one fsync each)",
        node.append_stats.appends.load(Ordering::Relaxed),
    );
    counter(
        "squadron_log_entries_appended_total",
        "Log entries written by those appends; entries / appends = proposals per fsync",
        node.append_stats.entries.load(Ordering::Relaxed),
    );
    let (tasks, leases, workers, slots) = node.state.with_state(|s| {
        let mut tasks: BTreeMap<&'static str, u64> = BTreeMap::new();
        for t in s.tasks(None) {
            *tasks.entry(t.state.as_str()).or_default() += 1;
        }
        let mut leases: BTreeMap<&'static str, u64> = BTreeMap::new();
        for l in s.leases() {
            *leases.entry(l.state.name()).or_default() += 1;
        }
        let mut workers: BTreeMap<String, u64> = BTreeMap::new();
        for w in s.workers() {
            *workers
                .entry(format!("{:?}", w.status).to_lowercase())
                .or_default() += 1;
        }
        let slots: Vec<(String, u32, u32)> = s
            .projects()
            .map(|p| {
                (
                    format!("{}/{}", p.tenant, p.project),
                    p.slots_held,
                    p.max_active,
                )
            })
            .collect();
        (tasks, leases, workers, slots)
    });
    let _ = writeln!(
        out,
        "# HELP squadron_tasks Tasks by state\n# TYPE squadron_tasks gauge"
    );
    for (state, n) in tasks {
        let _ = writeln!(out, "squadron_tasks{{state=\"{state}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP squadron_leases Retained leases by state\n# TYPE squadron_leases gauge"
    );
    for (state, n) in leases {
        let _ = writeln!(out, "squadron_leases{{state=\"{state}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP squadron_workers Workers by status\n# TYPE squadron_workers gauge"
    );
    for (status, n) in workers {
        let _ = writeln!(out, "squadron_workers{{status=\"{status}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP squadron_project_slots_held Slot-holding leases per project (INV-5)\n# TYPE squadron_project_slots_held gauge"
    );
    for (project, held, max) in slots {
        let _ = writeln!(
            out,
            "squadron_project_slots_held{{project=\"{project}\",max=\"{max}\"}} {held}"
        );
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}
