//! What the sandbox uses, for the heartbeat: CPU time and resident memory of every process
//! the agent can see (the sandbox's own pid namespace), and the bytes of the task's files.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

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

/// Deepest directory nesting the disk walk descends into; each level holds one open
/// directory, so this bounds the descriptors a walk holds too.
pub const DISK_WALK_DEPTH_MAX: usize = 64;

/// Bytes of the regular files under `root`, visiting at most `budget` entries (spent as it
/// goes). The walk goes by directory handle: every directory is opened relative to its parent's
/// handle with `O_NOFOLLOW` and every entry is stat'ed without following it, so a sandbox that
/// swaps a directory it can write for a link between two steps makes the walk skip it, never
/// leave the tree (the worker runs this as root over sandbox-writable directories). It stays
/// on `root`'s file system. Written here: a bounded, handle-relative walk is these few lines,
/// and no walking crate offers one.
pub fn tree_bytes(root: &Path, budget: &mut usize) -> u64 {
    let Ok(fd) = rustix::fs::open(root, walk_flags(), Mode::empty()) else {
        return 0;
    };
    let Ok(st) = rustix::fs::fstat(&fd) else {
        return 0;
    };
    let mut total = 0u64;
    walk(&fd, st.st_dev, 0, budget, &mut total);
    total
}

fn walk_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn walk(fd: &OwnedFd, dev: u64, depth: usize, budget: &mut usize, total: &mut u64) {
    let Ok(mut dir) = Dir::read_from(fd) else {
        return;
    };
    while let Some(Ok(entry)) = dir.read() {
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let Ok(st) = rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {
                *total = total.saturating_add(u64::try_from(st.st_size).unwrap_or(0));
            }
            FileType::Directory if depth < DISK_WALK_DEPTH_MAX && st.st_dev == dev => {
                if let Ok(child) = rustix::fs::openat(fd, name, walk_flags(), Mode::empty()) {
                    walk(&child, dev, depth + 1, budget, total);
                }
            }
            _ => {}
        }
    }
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

    /// A root that is itself a link is not walked; the budget stops the walk; nesting past
    /// the depth bound is not descended into.
    #[test]
    fn the_walk_refuses_a_linked_root_and_keeps_its_bounds() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/usr", dir.path().join("root-link")).unwrap();
        assert_eq!(disk_bytes(&[dir.path().join("root-link")]), 0);
        let flat = dir.path().join("flat");
        std::fs::create_dir(&flat).unwrap();
        for i in 0..10 {
            std::fs::write(flat.join(format!("f{i}")), [0u8; 10]).unwrap();
        }
        let mut budget = 4;
        assert_eq!(tree_bytes(&flat, &mut budget), 40);
        assert_eq!(budget, 0);
        let top = dir.path().join("top");
        let mut deep = top.join("deep");
        for _ in 0..=DISK_WALK_DEPTH_MAX {
            deep = deep.join("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("far"), [0u8; 7]).unwrap();
        std::fs::write(top.join("deep/near"), [0u8; 5]).unwrap();
        assert_eq!(
            disk_bytes(&[top]),
            5,
            "the far file is past the depth bound"
        );
    }
}
