//! What `squadron bench scale` loads: projects, profiles and tasks, and how.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use squadron_core::limits::{PENDING_TASKS_MAX, PROFILES_PER_PROJECT_MAX};

use crate::error::BenchError;

/// DESIGN §7's scale: 100,000 profiles over 12,500 projects, a million task records.
pub const SCALE_PROJECTS_DEFAULT: usize = 12_500;
pub const SCALE_PROFILES_PER_PROJECT_DEFAULT: usize = 8;
pub const SCALE_TASKS_DEFAULT: usize = 1_000_000;
/// Tasks left pending at the end (the rest are cancelled as they are submitted).
pub const SCALE_PENDING_TASKS_DEFAULT: usize = 50_000;
pub const SCALE_CLIENTS_DEFAULT: usize = 64;
/// Most projects one run may create.
pub const SCALE_PROJECTS_MAX: usize = 100_000;
/// Most tasks one run may submit: the retention policy's largest `count_max`, so that no
/// task the run made is pruned while it runs.
pub const SCALE_TASKS_MAX: usize = 2_000_000;
/// Most concurrent clients while loading.
pub const SCALE_CLIENTS_MAX: usize = 1_024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleOptions {
    pub squadron_bin: PathBuf,
    pub nodes: usize,
    pub projects: usize,
    pub profiles_per_project: usize,
    /// Task records submitted in all.
    pub tasks: usize,
    /// Of those, how many stay `PENDING`; the others are cancelled (terminal records).
    pub pending_tasks: usize,
    /// Concurrent clients while loading.
    pub clients: usize,
    /// The nodes' `raft.snapshot_after_entries`; `None`: the node's default.
    pub snapshot_after_entries: Option<u64>,
    /// The nodes' `raft.max_in_snapshot_log_to_keep` (log entries kept behind a snapshot; a
    /// new node further behind gets the snapshot); `None`: the node's default.
    pub log_kept_after_snapshot: Option<u64>,
    /// Where the run's temporary directory goes (default: the system's).
    pub work_dir: Option<PathBuf>,
    /// Keep the nodes' directories (configs, data, `node.log`) and name them in the report.
    pub keep_work_dir: bool,
}

impl ScaleOptions {
    /// DESIGN §7's sizes, run by `bin`.
    pub fn new(squadron_bin: PathBuf) -> Self {
        ScaleOptions {
            squadron_bin,
            nodes: 3,
            projects: SCALE_PROJECTS_DEFAULT,
            profiles_per_project: SCALE_PROFILES_PER_PROJECT_DEFAULT,
            tasks: SCALE_TASKS_DEFAULT,
            pending_tasks: SCALE_PENDING_TASKS_DEFAULT,
            clients: SCALE_CLIENTS_DEFAULT,
            snapshot_after_entries: None,
            log_kept_after_snapshot: None,
            work_dir: None,
            keep_work_dir: false,
        }
    }

    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |field: &'static str, reason: String| Err(BenchError::Options { field, reason });
        let per_project = PROFILES_PER_PROJECT_MAX as usize;
        if !(1..=crate::NODES_MAX).contains(&self.nodes) {
            return bad("nodes", format!("must be 1..={}", crate::NODES_MAX));
        }
        if !(1..=SCALE_PROJECTS_MAX).contains(&self.projects) {
            return bad("projects", format!("must be 1..={SCALE_PROJECTS_MAX}"));
        }
        if !(1..=per_project).contains(&self.profiles_per_project) {
            return bad(
                "profiles-per-project",
                format!("must be 1..={per_project} (a project's profile limit)"),
            );
        }
        if !(1..=SCALE_TASKS_MAX).contains(&self.tasks) {
            return bad("tasks", format!("must be 1..={SCALE_TASKS_MAX}"));
        }
        // Each client's last task waits in the queue until its cancel: room for them too.
        let room = PENDING_TASKS_MAX.saturating_sub(self.clients);
        if self.pending_tasks > self.tasks.min(room) {
            return bad(
                "pending-tasks",
                format!(
                    "must be at most --tasks and the pending queue's bound ({PENDING_TASKS_MAX}) \
                     less --clients (each client's task in flight waits there too)"
                ),
            );
        }
        if !(1..=SCALE_CLIENTS_MAX).contains(&self.clients) {
            return bad("clients", format!("must be 1..={SCALE_CLIENTS_MAX}"));
        }
        if self.snapshot_after_entries == Some(0) {
            return bad("snapshot-after-entries", "must be at least 1".into());
        }
        Ok(())
    }

    /// Profiles in all.
    pub fn profiles(&self) -> usize {
        self.projects * self.profiles_per_project
    }

    /// What the nodes' configs add: a retention that keeps every task of the run, and the
    /// snapshot interval if one was given.
    pub(crate) fn node_config(&self) -> String {
        let mut config = format!(
            "[retention.terminal_tasks]\ncount_max = {}\n",
            SCALE_TASKS_MAX
        );
        let raft = [
            ("snapshot_after_entries", self.snapshot_after_entries),
            ("max_in_snapshot_log_to_keep", self.log_kept_after_snapshot),
        ];
        if raft.iter().any(|(_, v)| v.is_some()) {
            config.push_str("\n[raft]\n");
        }
        for (key, value) in raft {
            if let Some(v) = value {
                config.push_str(&format!("{key} = {v}\n"));
            }
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options_are_refused_naming_the_field() {
        let ok = ScaleOptions::new("/bin/true".into());
        ok.validate().unwrap();
        type Spoil = fn(&mut ScaleOptions);
        let cases: [(&str, Spoil); 9] = [
            ("nodes", |o| o.nodes = 0),
            ("projects", |o| o.projects = SCALE_PROJECTS_MAX + 1),
            ("profiles-per-project", |o| o.profiles_per_project = 65),
            ("tasks", |o| o.tasks = 0),
            ("tasks", |o| o.tasks = SCALE_TASKS_MAX + 1),
            ("pending-tasks", |o| o.pending_tasks = PENDING_TASKS_MAX + 1),
            ("pending-tasks", |o| o.pending_tasks = PENDING_TASKS_MAX),
            ("clients", |o| o.clients = 0),
            ("snapshot-after-entries", |o| {
                o.snapshot_after_entries = Some(0)
            }),
        ];
        for (field, spoil) in cases {
            let mut opts = ok.clone();
            spoil(&mut opts);
            let e = opts.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn the_nodes_keep_every_task_of_the_run() {
        let mut opts = ScaleOptions::new("/bin/true".into());
        assert_eq!(
            opts.node_config(),
            "[retention.terminal_tasks]\ncount_max = 2000000\n"
        );
        opts.snapshot_after_entries = Some(100);
        assert!(opts
            .node_config()
            .ends_with("\n[raft]\nsnapshot_after_entries = 100\n"));
        opts.log_kept_after_snapshot = Some(10);
        assert!(opts.node_config().ends_with(
            "\n[raft]\nsnapshot_after_entries = 100\nmax_in_snapshot_log_to_keep = 10\n"
        ));
    }
}
