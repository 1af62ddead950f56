//! One cgroup leaf: the v2 directory every process of one attempt lives in, plus the v1
//! memory/pids/cpu directories of the same name on hosts whose limit controllers are v1.

use std::collections::BTreeSet;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::IsolationError;
use crate::fs_util;
use crate::process_entry::ProcessEntry;

/// `cpu.max` (v2) and `cpu.cfs_period_us` (v1) period: quota = cpus × period.
pub const CPU_PERIOD_US: u64 = 100_000;
/// Most v1 cpu ancestors read for a limit a leaf's quota must stay under.
const V1_CPU_ANCESTORS_MAX: usize = 64;
/// Deepest nesting of cgroups removed under a leaf (a boundary cannot make any, but be safe).
pub const LEAF_DESCENDANT_DEPTH_MAX: usize = 8;

/// Limits for one leaf; `None` leaves the host default (unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    pub memory_bytes: Option<u64>,
    pub pids_max: Option<u64>,
    /// Whole CPUs: v2 `cpu.max`, or the v1 CFS quota on hosts whose cpu controller is v1.
    pub cpus: Option<u32>,
}

/// What `set_limits` did: the files written, and the limits the host cannot enforce.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppliedLimits {
    /// (control file, value written).
    pub written: Vec<(PathBuf, String)>,
    /// One line per requested limit that has no controller on this host.
    pub unavailable: Vec<String>,
}

/// A leaf's v1 directories, one per controller its limits go to in v1 (none on a pure v2
/// host).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct V1Dirs {
    pub(crate) memory: Option<PathBuf>,
    pub(crate) pids: Option<PathBuf>,
    pub(crate) cpu: Option<PathBuf>,
}

impl V1Dirs {
    fn iter(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.memory, &self.pids, &self.cpu].into_iter().flatten()
    }
}

/// A leaf's handle; creating it touches nothing (see `create`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLeaf {
    name: String,
    v2: PathBuf,
    v1: V1Dirs,
    v2_controllers: BTreeSet<String>,
}

impl CgroupLeaf {
    pub(crate) fn new(
        name: &str,
        v2: PathBuf,
        v1: V1Dirs,
        v2_controllers: BTreeSet<String>,
    ) -> Self {
        CgroupLeaf {
            name: name.to_owned(),
            v2,
            v1,
            v2_controllers,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The v2 directory: the leaf's identity and the only proof of quiescence.
    pub fn path(&self) -> &Path {
        &self.v2
    }

    /// The v1 memory directory, on hosts where memory limits are v1.
    pub fn v1_memory_path(&self) -> Option<&Path> {
        self.v1.memory.as_deref()
    }

    /// The v1 pids directory, on hosts where pids limits are v1.
    pub fn v1_pids_path(&self) -> Option<&Path> {
        self.v1.pids.as_deref()
    }

    /// The v1 cpu directory, on hosts where cpu limits are v1.
    pub fn v1_cpu_path(&self) -> Option<&Path> {
        self.v1.cpu.as_deref()
    }

    /// Whether the v2 directory exists.
    pub fn exists(&self) -> bool {
        self.v2.join("cgroup.procs").exists()
    }

    /// Creates the v2 directory and the v1 ones; an existing leaf is left as it is.
    pub fn create(&self) -> Result<(), IsolationError> {
        fs_util::create_dir(&self.v2, "create cgroup leaf")?;
        for dir in self.v1.iter() {
            fs_util::create_dir(dir, "create v1 cgroup leaf")?;
        }
        Ok(())
    }

    /// The `cgroup.procs` files a process must be written into to be inside this leaf.
    pub fn attach_files(&self) -> Vec<PathBuf> {
        std::iter::once(&self.v2)
            .chain(self.v1.iter())
            .map(|dir| dir.join("cgroup.procs"))
            .collect()
    }

    /// The file enforcing the memory limit: v2 `memory.max` or v1 `memory.limit_in_bytes`.
    pub fn memory_limit_file(&self) -> Option<PathBuf> {
        if self.v2_controllers.contains("memory") {
            Some(self.v2.join("memory.max"))
        } else {
            self.v1
                .memory
                .as_ref()
                .map(|dir| dir.join("memory.limit_in_bytes"))
        }
    }

    /// The file that keeps the leaf out of swap: v2 `memory.swap.max` (written 0) or v1
    /// `memory.memsw.limit_in_bytes` (memory plus swap, written equal to the memory limit).
    /// `None` where the kernel does not account swap.
    pub fn swap_limit_file(&self) -> Option<PathBuf> {
        let file = if self.v2_controllers.contains("memory") {
            self.v2.join("memory.swap.max")
        } else {
            self.v1.memory.as_ref()?.join("memory.memsw.limit_in_bytes")
        };
        file.exists().then_some(file)
    }

    /// The file enforcing the pids limit: `pids.max` in v2 or in the v1 pids hierarchy.
    pub fn pids_limit_file(&self) -> Option<PathBuf> {
        if self.v2_controllers.contains("pids") {
            Some(self.v2.join("pids.max"))
        } else {
            self.v1.pids.as_ref().map(|dir| dir.join("pids.max"))
        }
    }

    /// Writes the limits into whichever hierarchy carries each controller.
    pub fn set_limits(&self, limits: &CgroupLimits) -> Result<AppliedLimits, IsolationError> {
        let mut applied = AppliedLimits::default();
        if let Some(bytes) = limits.memory_bytes {
            match self.memory_limit_file() {
                Some(file) => self.set_memory_limit(&mut applied, file, bytes)?,
                None => applied.unavailable.push(format!(
                    "memory limit {bytes} bytes: no v2 memory controller and no v1 memory \
                     hierarchy for {}",
                    self.v2.display()
                )),
            }
        }
        if let Some(pids) = limits.pids_max {
            match self.pids_limit_file() {
                Some(file) => write_limit(&mut applied, file, pids.to_string())?,
                None => applied.unavailable.push(format!(
                    "pids limit {pids}: no v2 pids controller and no v1 pids hierarchy for {}",
                    self.v2.display()
                )),
            }
        }
        if let Some(cpus) = limits.cpus {
            self.set_cpu_limit(&mut applied, cpus)?;
        }
        Ok(applied)
    }

    /// `cpus` whole CPUs of time per period: v2 `cpu.max`, else the v1 CFS period and quota
    /// (period first: v1 checks the quota against the period it has).
    fn set_cpu_limit(&self, applied: &mut AppliedLimits, cpus: u32) -> Result<(), IsolationError> {
        let quota = u64::from(cpus).saturating_mul(CPU_PERIOD_US);
        if self.v2_controllers.contains("cpu") {
            return write_limit(
                applied,
                self.v2.join("cpu.max"),
                format!("{quota} {CPU_PERIOD_US}"),
            );
        }
        match &self.v1.cpu {
            Some(dir) => {
                // v1 refuses a quota above a limited ancestor's (v2 just caps it): the worker
                // itself may run under one (systemd's CPUQuota, a container's --cpus).
                let quota = v1_cpu_ceiling_us(dir).map_or(quota, |ceiling| quota.min(ceiling));
                let period = dir.join("cpu.cfs_period_us");
                let written =
                    write_limit(applied, period, CPU_PERIOD_US.to_string()).and_then(|()| {
                        write_limit(applied, dir.join("cpu.cfs_quota_us"), quota.to_string())
                    });
                // Refused all the same (below v1's 1 ms minimum, or an ancestor this process
                // cannot see): the sandbox runs without it, reported, rather than not at all.
                if let Err(e) = written {
                    applied.unavailable.push(format!(
                        "cpu limit {cpus} cpus: the v1 cpu hierarchy refused it: {e}"
                    ));
                }
                Ok(())
            }
            None => {
                applied.unavailable.push(format!(
                    "cpu limit {cpus} cpus: no v2 cpu controller and no v1 cpu hierarchy for {}",
                    self.v2.display()
                ));
                Ok(())
            }
        }
    }

    /// The memory limit, and with it the swap limit: a memory limit the leaf could get around
    /// by swapping is no limit (the host's swap would take what it refused), so the leaf gets
    /// none. v1 refuses a memsw limit below the memory limit and a memory limit above the memsw
    /// one, so on an existing leaf whose limit grows, memsw goes first.
    fn set_memory_limit(
        &self,
        applied: &mut AppliedLimits,
        file: PathBuf,
        bytes: u64,
    ) -> Result<(), IsolationError> {
        let swap = self.swap_limit_file();
        let memsw_below = swap.as_ref().is_some_and(|f| {
            f.ends_with("memory.memsw.limit_in_bytes")
                && fs::read_to_string(f)
                    .ok()
                    .and_then(|t| t.trim().parse::<u64>().ok())
                    .is_some_and(|current| bytes > current)
        });
        if memsw_below {
            self.set_swap_limit(applied, swap, bytes)?;
            return write_limit(applied, file, bytes.to_string());
        }
        write_limit(applied, file, bytes.to_string())?;
        self.set_swap_limit(applied, swap, bytes)
    }

    /// `swap`: [`CgroupLeaf::swap_limit_file`], read once by the caller.
    fn set_swap_limit(
        &self,
        applied: &mut AppliedLimits,
        swap: Option<PathBuf>,
        bytes: u64,
    ) -> Result<(), IsolationError> {
        match swap {
            Some(file) if file.ends_with("memory.swap.max") => {
                write_limit(applied, file, "0".into())
            }
            Some(file) => write_limit(applied, file, bytes.to_string()),
            // Nothing to enforce on a host without swap.
            None if !host_has_swap() => Ok(()),
            None => {
                applied.unavailable.push(format!(
                    "swap limit: the kernel does not account swap for {}, so the memory limit \
                     of {bytes} bytes does not cover swap",
                    self.v2.display()
                ));
                Ok(())
            }
        }
    }

    /// `populated` from `cgroup.events`: true while any process is in the leaf or below.
    /// An absent leaf holds nothing (rmdir succeeds only on an empty cgroup), so it is false.
    pub fn populated(&self) -> Result<bool, IsolationError> {
        self.event("populated").map(|v| v == Some(true))
    }

    /// `frozen` from `cgroup.events`.
    pub fn frozen(&self) -> Result<bool, IsolationError> {
        self.event("frozen").map(|v| v == Some(true))
    }

    /// Reads one `key 0|1` line of `cgroup.events`; `None` when the leaf is absent.
    fn event(&self, key: &str) -> Result<Option<bool>, IsolationError> {
        let path = self.v2.join("cgroup.events");
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(IsolationError::io("read", path, e)),
        };
        match flat_keyed(&text, key).map(|v| v == "1") {
            Some(v) => Ok(Some(v)),
            None => Err(IsolationError::Launch(format!(
                "{} has no {key} line: {text:?}",
                path.display()
            ))),
        }
    }

    /// Stops every process in the leaf (they stay, unable to run, until killed or thawed).
    pub fn freeze(&self) -> Result<(), IsolationError> {
        fs_util::write_control(&self.v2.join("cgroup.freeze"), "1", "freeze")
    }

    pub fn thaw(&self) -> Result<(), IsolationError> {
        fs_util::write_control(&self.v2.join("cgroup.freeze"), "0", "thaw")
    }

    /// SIGKILLs every process in the leaf and below at once, frozen or not, through
    /// `cgroup.kill`; on kernels without it, `kill -KILL` of every listed pid instead.
    /// Returns the method used, for the evidence.
    pub fn kill(&self) -> Result<&'static str, IsolationError> {
        let control = self.v2.join("cgroup.kill");
        if control.exists() {
            fs_util::write_control(&control, "1", "kill")?;
            return Ok("cgroup.kill");
        }
        send_signal("KILL", &self.procs()?)?;
        Ok("kill -KILL on cgroup.procs")
    }

    /// The pids now in the leaf itself (not its descendants); empty when the leaf is absent.
    pub fn procs(&self) -> Result<Vec<u32>, IsolationError> {
        let path = self.v2.join("cgroup.procs");
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(IsolationError::io("read", path, e)),
        };
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// The processes of the leaf that run inside a nested PID namespace (the boundary and its
    /// descendants), as opposed to the shim and the outer bubblewrap, which run in ours.
    /// Signalling those outer two would end the boundary with SIGKILL (`--die-with-parent`)
    /// instead of letting the provider handle SIGTERM.
    pub fn sandboxed_procs(&self) -> Result<Vec<u32>, IsolationError> {
        let own = ProcessEntry::own_namespace_depth().unwrap_or(1);
        Ok(self
            .procs()?
            .into_iter()
            .filter(|pid| ProcessEntry::namespace_depth(*pid).is_some_and(|d| d > own))
            .collect())
    }

    /// Removes the leaf (descendants first) and its v1 directories. Fails while populated.
    pub fn remove(&self) -> Result<(), IsolationError> {
        remove_tree(&self.v2, LEAF_DESCENDANT_DEPTH_MAX)?;
        for dir in self.v1.iter() {
            remove_tree(dir, LEAF_DESCENDANT_DEPTH_MAX)?;
        }
        Ok(())
    }
}

/// The value of `key` in a cgroup "flat keyed" file (`key value` lines: `cgroup.events`,
/// `cpu.stat`), trimmed.
pub(crate) fn flat_keyed<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.trim())
}

/// The tightest CPU quota of `dir`'s v1 ancestors, per [`CPU_PERIOD_US`]; `None` when none is
/// limited. The walk stops where `cpu.cfs_quota_us` ends (the hierarchy's mount point).
fn v1_cpu_ceiling_us(dir: &Path) -> Option<u64> {
    let read =
        |path: PathBuf| -> Option<i64> { fs::read_to_string(path).ok()?.trim().parse().ok() };
    let mut ceiling: Option<u64> = None;
    for ancestor in dir.ancestors().skip(1).take(V1_CPU_ANCESTORS_MAX) {
        let Some(quota) = read(ancestor.join("cpu.cfs_quota_us")) else {
            break;
        };
        let period = read(ancestor.join("cpu.cfs_period_us")).unwrap_or(0);
        if let (Ok(quota @ 1..), Ok(period @ 1..)) = (u64::try_from(quota), u64::try_from(period)) {
            let per_period = quota.saturating_mul(CPU_PERIOD_US) / period;
            ceiling = Some(ceiling.map_or(per_period, |c| c.min(per_period)));
        }
    }
    ceiling
}

/// Whether `/proc/swaps` lists any swap area (its first line is a header). Unreadable counts
/// as swap, so a missing swap limit is reported rather than assumed harmless.
fn host_has_swap() -> bool {
    fs::read_to_string("/proc/swaps").map_or(true, |text| text.lines().count() > 1)
}

fn write_limit(
    applied: &mut AppliedLimits,
    file: PathBuf,
    value: String,
) -> Result<(), IsolationError> {
    fs_util::write_control(&file, &value, "set limit")?;
    applied.written.push((file, value));
    Ok(())
}

/// rmdir of a cgroup directory and the cgroup directories below it (cgroupfs allows only
/// rmdir; its control files vanish with the directory).
fn remove_tree(dir: &Path, depth_left: usize) -> Result<(), IsolationError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(IsolationError::io("list cgroup", dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| IsolationError::io("list cgroup", dir, e))?;
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            if depth_left == 0 {
                return Err(IsolationError::Launch(format!(
                    "cgroup {} nests deeper than {LEAF_DESCENDANT_DEPTH_MAX} levels",
                    dir.display()
                )));
            }
            remove_tree(&entry.path(), depth_left - 1)?;
        }
    }
    fs_util::remove_dir(dir, "remove cgroup")
}

/// `kill -<signal> pid…` through /bin/kill (no libc in this workspace). Pids that are gone
/// already are not an error: they are what we wanted.
pub(crate) fn send_signal(signal: &str, pids: &[u32]) -> Result<(), IsolationError> {
    if pids.is_empty() {
        return Ok(());
    }
    let output = Command::new(KILL_PROGRAM)
        .arg(format!("-{signal}"))
        .args(pids.iter().map(u32::to_string))
        .env_clear()
        .output()
        .map_err(|e| IsolationError::io("run", KILL_PROGRAM, e))?;
    if !output.status.success() {
        let still_there: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|pid| Path::new(&format!("/proc/{pid}")).exists())
            .collect();
        if !still_there.is_empty() {
            tracing::debug!(
                signal,
                ?still_there,
                stderr = %String::from_utf8_lossy(&output.stderr),
                "kill reported failures; the listed pids may be exiting"
            );
        }
    }
    Ok(())
}

/// procps' kill, present on every Debian host (`procps` is required).
pub const KILL_PROGRAM: &str = "/bin/kill";

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu_dir(dir: &Path, quota: i64, period: u64) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("cpu.cfs_quota_us"), format!("{quota}\n")).unwrap();
        fs::write(dir.join("cpu.cfs_period_us"), format!("{period}\n")).unwrap();
    }

    /// A worker under a limited v1 cgroup (systemd's CPUQuota, a container's --cpus) gets leaf
    /// quotas no higher than its own, which v1 would refuse; unlimited levels are skipped and
    /// the walk stops where the hierarchy ends.
    #[test]
    fn a_v1_cpu_quota_stays_under_the_tightest_ancestor() {
        let tmp = tempfile::tempdir().unwrap();
        let mount = tmp.path().join("cpu");
        cpu_dir(&mount, -1, 100_000);
        let worker = mount.join("worker.service");
        cpu_dir(&worker, 150_000, 200_000);
        let parent = worker.join("squadron/w1");
        cpu_dir(&worker.join("squadron"), -1, 100_000);
        cpu_dir(&parent, -1, 100_000);
        let leaf = parent.join("task-1-a1");
        assert_eq!(v1_cpu_ceiling_us(&leaf), Some(75_000));
        cpu_dir(&mount, 50_000, 100_000);
        assert_eq!(v1_cpu_ceiling_us(&leaf), Some(50_000));
        let unlimited = tmp.path().join("other/leaf");
        cpu_dir(&tmp.path().join("other"), -1, 100_000);
        assert_eq!(v1_cpu_ceiling_us(&unlimited), None);
        // The walk stops at the first level without cpu files (the mount's edge): a limit
        // above it is not the hierarchy's.
        let outer = tmp.path().join("outer");
        cpu_dir(&outer, 10_000, 100_000);
        assert_eq!(v1_cpu_ceiling_us(&outer.join("gap/leaf")), None);
    }
}
