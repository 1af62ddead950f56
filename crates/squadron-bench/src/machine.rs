//! The machine a comparison ran on: absolute figures mean little without it.

use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineInfo {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_total_kib: u64,
    pub kernel: String,
    /// Filesystem type and source of the mount holding the node data directories.
    pub data_filesystem: String,
}

impl MachineInfo {
    /// Reads `/proc`; fields it cannot learn stay empty.
    pub fn probe(data_dir: &Path) -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let meminfo = read("/proc/meminfo");
        Self {
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            cpu_model: cpuinfo
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default(),
            memory_total_kib: meminfo
                .lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            data_filesystem: filesystem_of(&read("/proc/mounts"), data_dir),
        }
    }
}

/// `type (source) at mountpoint` of the longest mount point containing `path`.
fn filesystem_of(mounts: &str, path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (source, point, kind) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(point)
                .then(|| (point.len(), format!("{kind} ({source}) at {point}")))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, s)| s)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_mount_point_wins() {
        let mounts =
            "overlay / overlay rw 0 0\n/dev/sdb1 /data ext4 rw 0 0\ntmpfs /dev tmpfs rw 0 0\n";
        assert_eq!(
            filesystem_of(mounts, Path::new("/data/bench/x")),
            "ext4 (/dev/sdb1) at /data"
        );
        assert_eq!(
            filesystem_of(mounts, Path::new("/srv")),
            "overlay (overlay) at /"
        );
        let here = MachineInfo::probe(Path::new("/"));
        assert!(here.cpus >= 1 && here.memory_total_kib > 0, "{here:?}");
    }
}
