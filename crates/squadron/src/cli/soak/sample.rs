//! One soak sample: the counts a cycle must give back (from the project's evidence and the
//! soak's own tasks), and the memory and open files of every Squadron process on this host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use squadron_api::agents::ProjectEvidence;

/// The most `/proc` entries one sample reads.
pub const PROC_ENTRIES_MAX: usize = 100_000;
/// The most entries one directory's measurement visits.
pub const DIR_FILES_MAX: usize = 1_000_000;
/// The most items a count keeps by name (the count itself is exact).
pub const COUNT_ITEMS_MAX: usize = 50;
/// The process name of a Squadron binary (`/proc/PID/comm`).
const PROCESS_NAME: &str = "squadron";
/// The commands that run as long-lived processes.
const ROLES: [&str; 5] = ["server", "dev", "worker", "agent", "soak"];

/// One series' value, with what it found by name (leaf, lease, file).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    pub n: u64,
    pub items: Vec<String>,
}

impl Count {
    pub fn of(items: impl IntoIterator<Item = String>) -> Count {
        let mut all: Vec<String> = items.into_iter().collect();
        let n = all.len() as u64;
        all.truncate(COUNT_ITEMS_MAX);
        Count { n, items: all }
    }

    pub fn number(n: u64) -> Count {
        Count {
            n,
            items: Vec::new(),
        }
    }
}

/// A Squadron process's resident memory and open file descriptors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessFigures {
    pub pid: u32,
    /// Its first argument: `server`, `worker`, `dev`, `agent`.
    pub role: String,
    pub rss_bytes: u64,
    pub open_fds: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirSize {
    pub path: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    pub at_ms: u64,
    /// The cycle this sample ends (0: the baseline, taken before the first).
    pub cycle: u32,
    pub counts: BTreeMap<String, Count>,
    pub processes: Vec<ProcessFigures>,
    pub dirs: Vec<DirSize>,
    /// What could not be sampled (a sample with errors cannot show that nothing leaked).
    pub errors: Vec<String>,
}

/// The series a project's evidence gives.
pub fn counts_of(evidence: &ProjectEvidence, counts: &mut BTreeMap<String, Count>) {
    counts.insert(
        "leases_not_terminal".into(),
        Count::of(evidence.leases_not_terminal.iter().map(|l| l.to_string())),
    );
    counts.insert(
        "slots_held".into(),
        Count::number(u64::from(evidence.slots_held_now)),
    );
    if let Some(w) = &evidence.worker {
        counts.insert(
            "cgroup_leaves".into(),
            Count::of(w.cgroup_leaves_left.iter().cloned()),
        );
        counts.insert(
            "credential_files".into(),
            Count::of(w.credential_files_left.iter().cloned()),
        );
        counts.insert(
            "provider_processes".into(),
            Count::number(u64::from(w.processes_now)),
        );
        counts.insert(
            "task_sandboxes".into(),
            Count::of(w.task_sandboxes.iter().map(|h| h.label())),
        );
        counts.insert("worktrees".into(), Count::of(w.worktrees.iter().cloned()));
    }
}

/// Every Squadron process on this host but this one, or those whose command line contains
/// `matching`.
pub fn squadron_processes(matching: Option<&str>) -> Vec<ProcessFigures> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<ProcessFigures> = entries
        .take(PROC_ENTRIES_MAX)
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter_map(|pid| process_figures(pid, matching))
        .collect();
    found.sort_by_key(|p| p.pid);
    found
}

fn process_figures(pid: u32, matching: Option<&str>) -> Option<ProcessFigures> {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
    if comm.trim() != PROCESS_NAME {
        return None;
    }
    let cmdline = std::fs::read(dir.join("cmdline")).ok()?;
    if let Some(text) = matching {
        let args = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !args.contains(text) {
            return None;
        }
    }
    let role = role_of(&cmdline);
    let open_fds = std::fs::read_dir(dir.join("fd")).ok()?.count() as u64;
    Some(ProcessFigures {
        pid,
        role,
        rss_bytes: squadron_bench::rss_kib(pid)? * 1024,
        open_fds,
    })
}

/// The command a `squadron` command line runs: its first known subcommand, after any global
/// flags.
fn role_of(cmdline: &[u8]) -> String {
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .skip(1)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    args.iter()
        .find(|a| ROLES.contains(&a.as_str()))
        .or_else(|| args.first())
        .cloned()
        .unwrap_or_default()
}

/// The bytes of the regular files beneath `root` (links not followed), up to
/// [`DIR_FILES_MAX`] entries: the sandbox agent's own disk walk.
pub fn dir_size(root: &Path) -> DirSize {
    let mut budget = DIR_FILES_MAX;
    DirSize {
        path: root.display().to_string(),
        bytes: squadron_agent::sandbox_usage::tree_bytes(root, &mut budget),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_is_the_subcommand_after_global_flags() {
        assert_eq!(role_of(b"squadron\0server\0--config\0n1.toml\0"), "server");
        assert_eq!(
            role_of(b"/usr/bin/squadron\0--log-format\0json\0worker\0--id\0w1\0"),
            "worker"
        );
        assert_eq!(role_of(b"squadron\0task\0list\0"), "task");
        assert_eq!(role_of(b"squadron\0"), "");
    }

    #[test]
    fn a_count_keeps_its_total_beyond_the_named_items() {
        let c = Count::of((0..(COUNT_ITEMS_MAX + 5)).map(|i| i.to_string()));
        assert_eq!(c.n, (COUNT_ITEMS_MAX + 5) as u64);
        assert_eq!(c.items.len(), COUNT_ITEMS_MAX);
    }

    #[test]
    fn a_directory_is_measured_without_following_links() {
        let dir = std::env::temp_dir().join(format!("soak-dir-size-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/one"), [0u8; 100]).unwrap();
        std::fs::write(dir.join("a/b/two"), [0u8; 23]).unwrap();
        std::os::unix::fs::symlink("/usr", dir.join("link")).unwrap();
        assert_eq!(dir_size(&dir).bytes, 123);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
