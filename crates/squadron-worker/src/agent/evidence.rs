//! The worker's half of a project's release evidence (`squadron evidence`): what only the
//! sandbox's host can see — its processes, cgroup leaves, launch files and broker counters.

use std::fs;
use std::path::Path;

use squadron_client::WorkerEvidence;
use squadron_core::ids::{ProjectId, TenantId};

use crate::agent::evidence_ledger::broker_evidence;
use crate::agent::project_sandbox::{REPO_DIR, WORKTREES_DIR};
use crate::agent::runtime::{leaf_populated, PROJECT_LEAVES_SCANNED_MAX};
use crate::agent::supervisor::AgentSupervisor;

/// Names that mark a file under a project's launch directories as a credential.
const CREDENTIAL_FILE_MARKERS: [&str; 4] = ["credential", ".token", "secret", ".pem"];

impl AgentSupervisor {
    /// The worker's half of the project's release evidence.
    pub(crate) fn evidence(&self, tenant: &TenantId, project: &ProjectId) -> WorkerEvidence {
        let key = (tenant.clone(), project.clone());
        self.sample_processes(tenant, project);
        let counters = self.registry().counters(&key);
        let root = self
            .inner
            .data_dir
            .join("projects")
            .join(tenant.as_str())
            .join(project.as_str());
        let stats = self.inner.broker.stats();
        let cgroup_dir = self.inner.runtime.project_cgroup_path(tenant, project);
        WorkerEvidence {
            worker: self.inner.worker.to_string(),
            sandboxes: u32::from(root.join("sandbox.json").is_file()),
            peak_concurrent_processes: counters.peak_processes,
            processes_now: populated_leaves(&cgroup_dir),
            mailbox_messages_delivered: counters.messages_delivered,
            roster_deltas_delivered: counters.roster_deltas_delivered,
            self_fenced: counters.self_fenced,
            broker: broker_evidence(&self.inner.broker_base, &stats),
            cgroup_leaves_left: list_dir_names(&cgroup_dir),
            credential_files_left: credential_files(&root.join("run")),
            binary_sha256: squadron_pki::own_binary_sha256().unwrap_or_default(),
            // The route adds them: it holds the runtimes.
            task_sandboxes: Vec::new(),
            task_sandbox_errors: Vec::new(),
            worktrees: worktrees(&root),
        }
    }

    /// Counts the project's populated generation leaves and keeps the peak.
    pub(super) fn sample_processes(&self, tenant: &TenantId, project: &ProjectId) {
        let now = populated_leaves(&self.inner.runtime.project_cgroup_path(tenant, project));
        self.registry()
            .processes_seen((tenant.clone(), project.clone()), now);
    }
}

/// Populated `profile-*-g*` leaves of a project cgroup.
fn populated_leaves(dir: &Path) -> u32 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for entry in entries.flatten().take(PROJECT_LEAVES_SCANNED_MAX) {
        let is_leaf = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with("profile-"));
        if is_leaf && leaf_populated(&entry.path()).unwrap_or(false) {
            n += 1;
        }
    }
    n
}

/// The project sandbox's worktree directories and Git's administrative records of them: a
/// profile's worktree is made once and kept, so their number only grows with the profiles.
fn worktrees(root: &Path) -> Vec<String> {
    let mut found = list_dir_names(&root.join(WORKTREES_DIR));
    found.extend(list_dir_names(
        &root.join(REPO_DIR).join(".git").join("worktrees"),
    ));
    found
}

fn list_dir_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path().display().to_string())
        .take(PROJECT_LEAVES_SCANNED_MAX)
        .collect()
}

/// Files under a project's launch directories whose names mark them as credentials.
fn credential_files(run_root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![run_root.to_path_buf()];
    let mut seen = 0usize;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > PROJECT_LEAVES_SCANNED_MAX * 16 {
                return found;
            }
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(t) if t.is_file() => {
                    let name = entry.file_name().to_string_lossy().to_lowercase();
                    if CREDENTIAL_FILE_MARKERS.iter().any(|m| name.contains(m)) {
                        found.push(path.display().to_string());
                    }
                }
                _ => {}
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_files_are_found_by_name_anywhere_under_run() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("a/g1")).unwrap();
        fs::write(dir.path().join("a/g1/launch.sh"), "x").unwrap();
        fs::write(dir.path().join("a/g1/api.token"), "x").unwrap();
        fs::write(dir.path().join("a/Credentials.json"), "x").unwrap();
        let mut found = credential_files(dir.path());
        found.sort();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].ends_with("Credentials.json"));
        assert!(found[1].ends_with("api.token"));
    }
}
