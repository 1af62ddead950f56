//! A process as /proc shows it: its pid plus the start time that tells a live process from a
//! later one that reused the pid. Used to corroborate a reap (never as the proof itself: the
//! proof is the leaf's `populated 0`) and to find which members of a leaf run inside the
//! boundary's PID namespace.

use std::fs;
use std::path::PathBuf;

/// One process, identified by pid and start time (clock ticks after boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessEntry {
    pub pid: u32,
    pub start_ticks: u64,
}

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StatLine {
    state: char,
    start_ticks: u64,
}

impl ProcessEntry {
    /// Reads the process now; `None` if no such pid exists (or it is already reaped).
    pub fn read(pid: u32) -> Option<ProcessEntry> {
        let stat = read_stat(pid)?;
        Some(ProcessEntry {
            pid,
            start_ticks: stat.start_ticks,
        })
    }

    /// True while this very process (same pid, same start time) exists and is not a zombie.
    pub fn is_alive(&self) -> bool {
        match read_stat(self.pid) {
            Some(stat) => stat.start_ticks == self.start_ticks && !matches!(stat.state, 'Z' | 'X'),
            None => false,
        }
    }

    /// How many PID namespaces deep the process is, seen from this /proc: 1 for a process in
    /// the same namespace as /proc's, 2 inside one nested namespace, and so on.
    pub fn namespace_depth(pid: u32) -> Option<usize> {
        nspid_depth(&fs::read_to_string(proc_path(pid, "status")).ok()?)
    }

    /// The pid namespace depth of the calling process.
    pub fn own_namespace_depth() -> Option<usize> {
        nspid_depth(&fs::read_to_string("/proc/self/status").ok()?)
    }
}

fn nspid_depth(status: &str) -> Option<usize> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))
        .map(|ids| ids.split_whitespace().count())
}

fn proc_path(pid: u32, file: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{file}"))
}

fn read_stat(pid: u32) -> Option<StatLine> {
    parse_stat(&fs::read_to_string(proc_path(pid, "stat")).ok()?)
}

/// Parses `pid (comm) state ppid … starttime …`; `comm` may hold spaces and parentheses, so
/// the fields start after the last `)`.
fn parse_stat(stat: &str) -> Option<StatLine> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 of proc(5) is the state, field 22 the start time: indexes 0 and 19 here.
    let state = fields.first()?.chars().next()?;
    let start_ticks = fields.get(19)?.parse().ok()?;
    Some(StatLine { state, start_ticks })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn parses_a_stat_line_whose_comm_has_spaces_and_parens() {
        let line = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(
            parse_stat(line),
            Some(StatLine {
                state: 'S',
                start_ticks: 987654
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(nspid_depth("Name:\tx\nNSpid:\t5061\t1\n"), Some(2));
    }

    #[test]
    fn a_running_child_is_alive_and_a_reaped_one_is_not() {
        let mut child = Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let entry = ProcessEntry::read(child.id()).expect("child in /proc");
        assert!(entry.is_alive());
        assert_eq!(
            ProcessEntry::namespace_depth(child.id()),
            ProcessEntry::own_namespace_depth()
        );
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert!(!entry.is_alive());
    }

    #[test]
    fn a_reused_pid_is_not_the_same_process() {
        let me = ProcessEntry::read(std::process::id()).expect("own /proc entry");
        assert!(me.is_alive());
        let impostor = ProcessEntry {
            pid: me.pid,
            start_ticks: me.start_ticks.wrapping_add(1),
        };
        assert!(!impostor.is_alive());
    }
}
