//! What a leaf's processes use, by the kernel's own accounting: the CPU time `cpu.stat`
//! counts for the leaf (every process that ever ran in it, exited ones included), and the
//! memory charged to it — v1 `memory.usage_in_bytes` on hosts whose memory controller is v1,
//! else v2 `memory.current`, else the resident pages of the processes now in it.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use crate::cgroup_leaf::{flat_keyed, CgroupLeaf};
use crate::error::IsolationError;

/// Longest control file read (`cpu.stat` is a few lines).
const CONTROL_FILE_BYTES_MAX: usize = 4 * 1024;

/// A leaf's usage at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeafUsage {
    /// User and system CPU time, in microseconds.
    pub cpu_usec: u64,
    /// Memory charged to the leaf, in bytes.
    pub memory_bytes: u64,
}

impl LeafUsage {
    /// The leaf's usage now; `None` when the leaf does not exist (its attempt was reaped).
    pub fn of(leaf: &CgroupLeaf) -> Result<Option<LeafUsage>, IsolationError> {
        let Some(stat) = read_control(&leaf.path().join("cpu.stat"))? else {
            return Ok(None);
        };
        let usage_usec = flat_keyed(&stat, "usage_usec").and_then(|v| v.parse().ok());
        let cpu_usec = usage_usec.ok_or_else(|| {
            IsolationError::Launch(format!(
                "{} has no usage_usec line: {stat:?}",
                leaf.path().join("cpu.stat").display()
            ))
        })?;
        let memory_bytes = memory_bytes(leaf)?;
        // A leaf removed between the two reads may have lent its memory figure to nothing:
        // what is read of a leaf that is gone is not reported.
        if !leaf.exists() {
            return Ok(None);
        }
        Ok(Some(LeafUsage {
            cpu_usec,
            memory_bytes,
        }))
    }
}

fn memory_bytes(leaf: &CgroupLeaf) -> Result<u64, IsolationError> {
    let charged = [
        leaf.v1_memory_path()
            .map(|d| d.join("memory.usage_in_bytes")),
        Some(leaf.path().join("memory.current")),
    ];
    for file in charged.into_iter().flatten() {
        if let Some(text) = read_control(&file)? {
            return text.trim().parse().map_err(|_| {
                IsolationError::Launch(format!("{} is not a number: {text:?}", file.display()))
            });
        }
    }
    let page = rustix::param::page_size() as u64;
    Ok(leaf
        .procs()?
        .into_iter()
        .filter_map(|pid| fs::read_to_string(format!("/proc/{pid}/statm")).ok())
        .filter_map(|statm| resident_pages(&statm))
        .fold(0u64, |sum, pages| {
            sum.saturating_add(pages.saturating_mul(page))
        }))
}

/// A control file's text; `None` when it does not exist, or its cgroup is being removed
/// (ENODEV).
pub(crate) fn read_control(path: &Path) -> Result<Option<String>, IsolationError> {
    match fs::read_to_string(path) {
        Ok(text) if text.len() > CONTROL_FILE_BYTES_MAX => Err(IsolationError::Launch(format!(
            "{} is longer than {CONTROL_FILE_BYTES_MAX} bytes",
            path.display()
        ))),
        Ok(text) => Ok(Some(text)),
        Err(e)
            if e.kind() == ErrorKind::NotFound
                || e.raw_os_error() == Some(rustix::io::Errno::NODEV.raw_os_error()) =>
        {
            Ok(None)
        }
        Err(e) => Err(IsolationError::io("read", path.to_path_buf(), e)),
    }
}

/// The second field of `/proc/{pid}/statm`: resident pages.
fn resident_pages(statm: &str) -> Option<u64> {
    statm.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_stat_lines_are_read_by_key() {
        let stat = "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\n";
        assert_eq!(flat_keyed(stat, "usage_usec"), Some("1234567"));
        assert_eq!(flat_keyed(stat, "system_usec"), Some("234567"));
        assert_eq!(flat_keyed(stat, "nr_throttled"), None);
        assert_eq!(
            flat_keyed("usage_usec many\n", "usage_usec").and_then(|v| v.parse::<u64>().ok()),
            None
        );
    }

    #[test]
    fn statm_gives_resident_pages() {
        assert_eq!(resident_pages("2514 361 300 10 0 156 0\n"), Some(361));
        assert_eq!(resident_pages("2514"), None);
    }
}
