//! What the sandbox uses, for the heartbeat: CPU time and resident memory of every process
//! the agent can see (the sandbox's own pid namespace), and the bytes of the task's files.

use std::path::{Path, PathBuf};

use squadron_proto::v1 as pb;

/// Processes read from `/proc`, at most.
pub const PROCESSES_SCANNED_MAX: usize = 4_096;
/// Directory entries counted for the disk figure, at most; a larger tree is reported as far
/// as it was counted.
pub const DISK_ENTRIES_SCANNED_MAX: usize = 200_000;

pub fn measure(disk_paths: &[PathBuf]) -> pb::SandboxUsage {
    let (cpu_usec, memory_bytes) = processes();
    pb::SandboxUsage {
        cpu_usec,
        memory_bytes,
        disk_bytes: disk_bytes(disk_paths),
    }
}

fn processes() -> (u64, u64) {
    let ticks = rustix::param::clock_ticks_per_second().max(1);
    let page = rustix::param::page_size() as u64;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return (0, 0);
    };
    let (mut cpu, mut memory) = (0u64, 0u64);
    for entry in entries.flatten().take(PROCESSES_SCANNED_MAX) {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let dir = entry.path();
        if let Some(t) = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|s| cpu_ticks(&s))
        {
            cpu = cpu.saturating_add(t.saturating_mul(1_000_000) / ticks);
        }
        if let Some(pages) = std::fs::read_to_string(dir.join("statm"))
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        {
            memory = memory.saturating_add(pages.saturating_mul(page));
        }
    }
    (cpu, memory)
}

/// utime + stime + cutime + cstime of a `/proc/{pid}/stat` line. The command name may hold
/// spaces and parentheses, so the fields are counted from the last `)`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of the line, utime 14 … cstime 17.
    let sum = fields
        .get(11..15)?
        .iter()
        .map(|f| f.parse::<u64>().unwrap_or(0))
        .sum();
    Some(sum)
}

/// Bytes of the regular files under `paths`, at most [`DISK_ENTRIES_SCANNED_MAX`] entries
/// visited in all; links are not followed.
pub fn disk_bytes(paths: &[PathBuf]) -> u64 {
    let mut budget = DISK_ENTRIES_SCANNED_MAX;
    paths.iter().map(|p| tree_bytes(p, &mut budget)).sum()
}

/// Bytes of the regular files under `root`, never following a symlink, visiting at most
/// `budget` entries (spent as it goes). Written here: a bounded, no-follow walk is these few
/// lines, and no walking crate is in the build.
pub fn tree_bytes(root: &Path, budget: &mut usize) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if *budget == 0 {
                return total;
            }
            *budget -= 1;
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_count_from_the_last_parenthesis() {
        let line = "42 (a (weird) name) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 2 1 20 0 1 0 5 0 0";
        assert_eq!(cpu_ticks(line), Some(13));
        assert_eq!(cpu_ticks("no parenthesis"), None);
    }

    #[test]
    fn this_process_is_seen_and_files_are_counted_without_following_links() {
        let (cpu, memory) = processes();
        assert!(memory > 0, "the test process itself has resident memory");
        let _ = cpu;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![0u8; 1000]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b"), vec![0u8; 24]).unwrap();
        std::os::unix::fs::symlink("/usr", dir.path().join("link")).unwrap();
        assert_eq!(disk_bytes(&[dir.path().to_path_buf()]), 1024);
    }
}
