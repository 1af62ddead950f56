//! A small real scale run: a 3-node cluster loaded with projects, profiles and tasks (most
//! cancelled, some left pending), snapshotting every 100 entries and keeping 20 log entries
//! behind each, then a follower restarted from its disk and a new follower added — which
//! must catch up by the leader's snapshot. Every figure the report gives is checked against
//! what the load did, on every node.
//!
//! Needs the `squadron` binary (`SQUADRON_BIN`, or `<target>/debug/squadron` beside this test's
//! `deps` directory: `cargo build -p squadron` first).

mod support;

use squadron_bench::{render_scale, scale, NodeFigures, ScaleOptions};

const PROJECTS: usize = 20;
const PROFILES_PER_PROJECT: usize = 2;
const TASKS: usize = 1_200;
const PENDING: usize = 100;

fn assert_state_of_the_load(n: &NodeFigures, table: &str) {
    assert_eq!(
        (n.tasks_submitted, n.tasks_cancelled, n.tasks_pending),
        (TASKS as u64, (TASKS - PENDING) as u64, PENDING as u64),
        "node {}'s tasks:\n{table}",
        n.node
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loaded_cluster_reports_apply_snapshots_memory_restart_and_catch_up() {
    let work = tempfile::tempdir().expect("tempdir");
    let mut opts = ScaleOptions::new(support::squadron_bin());
    opts.projects = PROJECTS;
    opts.profiles_per_project = PROFILES_PER_PROJECT;
    opts.tasks = TASKS;
    opts.pending_tasks = PENDING;
    opts.clients = 8;
    opts.snapshot_after_entries = Some(100);
    opts.log_kept_after_snapshot = Some(20);
    opts.work_dir = Some(work.path().to_path_buf());

    let report = scale(&opts).await.expect("scale run");
    let table = render_scale(&report);
    println!("{table}");

    let writes = (PROJECTS * (1 + PROFILES_PER_PROJECT)) as u64;
    assert_eq!(
        (report.profiles.writes, report.profiles.errors),
        (writes, 0),
        "{table}"
    );
    let writes = (TASKS + TASKS - PENDING) as u64;
    assert_eq!(
        (report.tasks.writes, report.tasks.errors),
        (writes, 0),
        "{table}"
    );
    assert_eq!(report.tasks.latency.count, writes);
    assert!(report.tasks.writes_per_s > 0.0, "{table}");

    assert_eq!(report.nodes.len(), 3, "{table}");
    for n in &report.nodes {
        assert_state_of_the_load(n, &table);
        assert!(n.rss_kib.is_some_and(|k| k > 0), "node {}: {table}", n.node);
        assert!(
            n.apply.count > 0 && n.entries_applied >= n.apply.count,
            "{table}"
        );
        assert_eq!(n.apply_lock_wait.count, n.apply.count, "{table}");
        assert_eq!(n.apply_entry.count, n.entries_applied, "{table}");
        assert_eq!(n.apply_entry_cpu.count, n.entries_applied, "{table}");
        assert!(n.apply.p50_le_ms.is_some(), "{table}");
        // Thousands of writes in entries of a few each: far more than 100 entries.
        assert!(
            n.snapshot_build.count >= 1,
            "node {} built no snapshot: {table}",
            n.node
        );
        assert_eq!(n.snapshot_copy.count, n.snapshot_build.count, "{table}");
        assert!(n.snapshot_bytes > 0, "{table}");
    }

    let restart = &report.restart;
    assert!(
        restart.caught_up_ms.is_some(),
        "the restarted node never caught up: {table}"
    );
    assert!(restart.target_index > 0, "{table}");
    assert_state_of_the_load(&restart.figures, &table);
    // It started from its own snapshot file: it has built none since and been sent none.
    assert!(restart.figures.snapshot_bytes > 0, "{table}");
    assert_eq!(
        (
            restart.figures.snapshot_build.count,
            restart.figures.snapshot_install.count
        ),
        (0, 0),
        "{table}"
    );

    let install = &report.install;
    assert_eq!(install.node, 4, "{table}");
    assert!(
        install.caught_up_ms.is_some(),
        "the new node never caught up: {table}"
    );
    assert_state_of_the_load(&install.figures, &table);
    // The leader's log no longer reached back to the start: the node got a snapshot.
    assert!(
        install.figures.snapshot_install.count >= 1,
        "the new node caught up without a snapshot: {table}"
    );
    assert!(install.figures.snapshot_bytes > 0, "{table}");
}
