//! Where a worker's cgroup leaves live.
//!
//! Every leaf is a directory of the cgroup v2 hierarchy: that is where `cgroup.freeze`,
//! `cgroup.kill` and `cgroup.events` (`populated`) work, so v2 is required. Memory, pids and
//! cpu limits come from v2 controllers when the host enables them for our subtree (a pure v2
//! host); on a hybrid host, where those controllers are bound to v1 hierarchies, memory,
//! pids and cpu limits go to v1 directories of the same name instead.
//!
//! Layout: `<v2 base>/<worker>/<leaf>`, and the same `<worker>/<leaf>` under the v1 memory,
//! pids and cpu bases when those are used. The default v2 base is `<v2 mount>/squadron`; the
//! default v1 bases are `squadron` under this process's own v1 cgroup, so a sandbox never
//! leaves the memory accounting its worker is in.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

use crate::cgroup_leaf::{CgroupLeaf, V1Dirs};
use crate::error::IsolationError;
use crate::fs_util;

/// The directory made under the detected v2 mount (and the v1 bases) when no base is set.
pub const CGROUP_BASE_NAME_DEFAULT: &str = "squadron";
/// Longest worker or leaf name accepted (one path component).
pub const CGROUP_NAME_BYTES_MAX: usize = 128;
/// The v2 controllers a leaf may use for limits, when the host offers them.
pub const V2_LIMIT_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

const MOUNTINFO: &str = "/proc/self/mountinfo";
const OWN_CGROUPS: &str = "/proc/self/cgroup";

/// Where to put the leaves; every field is optional and detected when unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupRootConfig {
    /// A directory inside a cgroup v2 mount holding one directory per worker.
    /// Default: `<first cgroup2 mount>/squadron` (`/sys/fs/cgroup/squadron` on a pure v2 host,
    /// `/sys/fs/cgroup/unified/squadron` on a hybrid one).
    pub v2_base: Option<PathBuf>,
    /// A directory inside the v1 memory hierarchy, used only when v2 has no memory controller.
    pub v1_memory_base: Option<PathBuf>,
    /// A directory inside the v1 pids hierarchy, used only when v2 has no pids controller.
    pub v1_pids_base: Option<PathBuf>,
    /// A directory inside the v1 cpu hierarchy, used only when v2 has no cpu controller.
    pub v1_cpu_base: Option<PathBuf>,
    /// Never fall back to v1 hierarchies, even when v2 lacks the controllers.
    pub disable_v1: bool,
}

/// A worker's parent cgroup(s), created and ready for leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupRoot {
    worker: String,
    v2_parent: PathBuf,
    /// v2 controllers enabled for the leaves (the parent's `cgroup.subtree_control`).
    v2_controllers: BTreeSet<String>,
    v1_memory_parent: Option<PathBuf>,
    v1_pids_parent: Option<PathBuf>,
    v1_cpu_parent: Option<PathBuf>,
}

impl CgroupRoot {
    /// Finds the hierarchies, creates `<base>/<worker>` in each one used, and enables the v2
    /// limit controllers for it where the host allows. Idempotent: a restarted worker calls it
    /// again and gets the same paths.
    pub fn open(worker: &str, config: &CgroupRootConfig) -> Result<CgroupRoot, IsolationError> {
        validate_name("cgroup worker name", worker)?;
        let mounts = read_mounts()?;
        let v2_base = match &config.v2_base {
            Some(base) => {
                validate_absolute("cgroup v2 base", base)?;
                base.clone()
            }
            None => mounts
                .iter()
                .find(|m| m.fs_type == "cgroup2")
                .map(|m| m.mount_point.join(CGROUP_BASE_NAME_DEFAULT))
                .ok_or_else(|| {
                    IsolationError::Unavailable(format!(
                        "no cgroup2 mount in {MOUNTINFO}; the process runtime needs cgroup v2 \
                         (cgroup.freeze, cgroup.kill, cgroup.events)"
                    ))
                })?,
        };
        let v2_parent = v2_base.join(worker);
        make_v2_dirs(&v2_base, &v2_parent)?;
        // Without these a leaf can be neither frozen nor killed as a whole: no proof possible.
        for file in ["cgroup.freeze", "cgroup.kill", "cgroup.events"] {
            if !v2_parent.join(file).exists() {
                return Err(IsolationError::Unavailable(format!(
                    "{} has no {file}: {} is not a cgroup v2 directory, or the kernel is older \
                     than 5.14",
                    v2_parent.display(),
                    v2_parent.display()
                )));
            }
        }
        let v2_controllers = read_controller_set(&v2_parent.join("cgroup.subtree_control"))?;

        let mut root = CgroupRoot {
            worker: worker.to_owned(),
            v2_parent,
            v2_controllers,
            v1_memory_parent: None,
            v1_pids_parent: None,
            v1_cpu_parent: None,
        };
        if !config.disable_v1 {
            let own = read_own_cgroups();
            if !root.v2_controllers.contains("memory") {
                root.v1_memory_parent =
                    v1_parent("memory", &config.v1_memory_base, &mounts, &own, worker)?;
            }
            if !root.v2_controllers.contains("pids") {
                root.v1_pids_parent =
                    v1_parent("pids", &config.v1_pids_base, &mounts, &own, worker)?;
            }
            if !root.v2_controllers.contains("cpu") {
                root.v1_cpu_parent = v1_cpu_parent(&config.v1_cpu_base, &mounts, &own, worker);
            }
        }
        Ok(root)
    }

    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// `<v2 base>/<worker>`: the directory holding this worker's leaves.
    pub fn v2_parent(&self) -> &Path {
        &self.v2_parent
    }

    /// The v2 controllers available to leaves for limits.
    pub fn v2_controllers(&self) -> &BTreeSet<String> {
        &self.v2_controllers
    }

    /// The v1 memory directory holding this worker's leaves, when memory limits go to v1.
    pub fn v1_memory_parent(&self) -> Option<&Path> {
        self.v1_memory_parent.as_deref()
    }

    /// The v1 pids directory holding this worker's leaves, when pids limits go to v1.
    pub fn v1_pids_parent(&self) -> Option<&Path> {
        self.v1_pids_parent.as_deref()
    }

    /// The v1 cpu directory holding this worker's leaves, when cpu limits go to v1.
    pub fn v1_cpu_parent(&self) -> Option<&Path> {
        self.v1_cpu_parent.as_deref()
    }

    /// The leaf `name` of this worker (not created by this call).
    pub fn leaf(&self, name: &str) -> Result<CgroupLeaf, IsolationError> {
        validate_name("cgroup leaf name", name)?;
        let v1 = |parent: &Option<PathBuf>| parent.as_ref().map(|p| p.join(name));
        Ok(CgroupLeaf::new(
            name,
            self.v2_parent.join(name),
            V1Dirs {
                memory: v1(&self.v1_memory_parent),
                pids: v1(&self.v1_pids_parent),
                cpu: v1(&self.v1_cpu_parent),
            },
            self.v2_controllers.clone(),
        ))
    }

    /// The names of the leaves that exist now, sorted: what a restarted worker may adopt.
    pub fn leaf_names(&self) -> Result<Vec<String>, IsolationError> {
        let entries = fs::read_dir(&self.v2_parent)
            .map_err(|e| IsolationError::io("list cgroup leaves in", &self.v2_parent, e))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry
                .map_err(|e| IsolationError::io("list cgroup leaves in", &self.v2_parent, e))?;
            let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if let (true, Some(name)) = (is_dir, entry.file_name().to_str()) {
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    /// Removes the worker's parent directories; fails while any leaf remains.
    pub fn remove(&self) -> Result<(), IsolationError> {
        fs_util::remove_dir(&self.v2_parent, "remove cgroup parent")?;
        for parent in [
            &self.v1_memory_parent,
            &self.v1_pids_parent,
            &self.v1_cpu_parent,
        ]
        .into_iter()
        .flatten()
        {
            fs_util::remove_dir(parent, "remove v1 cgroup parent")?;
        }
        Ok(())
    }
}

/// Creates base and parent, enabling the limit controllers on the way down where the
/// directory's own `cgroup.controllers` offers them. Failures to enable are not errors: the
/// leaves then fall back to v1 or run without that limit, and the leaf reports which.
fn make_v2_dirs(base: &Path, parent: &Path) -> Result<(), IsolationError> {
    if let Some(above) = base.parent() {
        if !above.join("cgroup.procs").exists() {
            return Err(IsolationError::Unavailable(format!(
                "cgroup v2 base {}: {} is not a cgroup directory",
                base.display(),
                above.display()
            )));
        }
    }
    for dir in [base, parent] {
        fs_util::create_dir(dir, "create cgroup directory")?;
        let offered = read_controller_set(&dir.join("cgroup.controllers"))?;
        let enabled = read_controller_set(&dir.join("cgroup.subtree_control"))?;
        for controller in V2_LIMIT_CONTROLLERS {
            if offered.contains(controller) && !enabled.contains(controller) {
                let control = dir.join("cgroup.subtree_control");
                if let Err(e) = fs::write(&control, format!("+{controller}")) {
                    tracing::warn!(
                        path = %control.display(),
                        controller,
                        error = %e,
                        "cannot enable cgroup v2 controller for squadron leaves"
                    );
                }
            }
        }
    }
    Ok(())
}

fn read_controller_set(path: &Path) -> Result<BTreeSet<String>, IsolationError> {
    let text = fs_util::read_to_string(path, "read cgroup controllers")?;
    Ok(text.split_whitespace().map(str::to_owned).collect())
}

fn v1_parent(
    controller: &str,
    configured: &Option<PathBuf>,
    mounts: &[Mount],
    own: &[OwnCgroup],
    worker: &str,
) -> Result<Option<PathBuf>, IsolationError> {
    let base = match configured {
        Some(base) => {
            validate_absolute("cgroup v1 base", base)?;
            base.clone()
        }
        None => {
            let Some(mount) = mounts
                .iter()
                .find(|m| m.fs_type == "cgroup" && m.super_options.iter().any(|o| o == controller))
            else {
                return Ok(None);
            };
            let own_path = own
                .iter()
                .find(|c| c.controllers.iter().any(|n| n == controller))
                .map(|c| c.path.as_str())
                .unwrap_or("/");
            // With a cgroup namespace the mount's root is a prefix of our own path.
            let relative = own_path
                .strip_prefix(mount.root.as_str())
                .unwrap_or(own_path)
                .trim_start_matches('/');
            mount
                .mount_point
                .join(relative)
                .join(CGROUP_BASE_NAME_DEFAULT)
        }
    };
    let parent = base.join(worker);
    fs::create_dir_all(&parent)
        .map_err(|e| IsolationError::io("create v1 cgroup directory", &parent, e))?;
    if !parent.join("cgroup.procs").exists() {
        return Err(IsolationError::Unavailable(format!(
            "v1 {controller} base {}: not a cgroup directory",
            base.display()
        )));
    }
    Ok(Some(parent))
}

/// The v1 cpu parent, or `None` where it cannot serve: no v1 cpu hierarchy, one this process
/// cannot write, or a kernel without CFS bandwidth control (`cpu.cfs_quota_us`). A CPU limit
/// is then reported as not enforced, as before v1 cpu was used; the runtime still runs.
fn v1_cpu_parent(
    configured: &Option<PathBuf>,
    mounts: &[Mount],
    own: &[OwnCgroup],
    worker: &str,
) -> Option<PathBuf> {
    match v1_parent("cpu", configured, mounts, own, worker) {
        Ok(Some(parent)) if parent.join("cpu.cfs_quota_us").exists() => Some(parent),
        Ok(Some(parent)) => {
            tracing::warn!(
                path = %parent.display(),
                "the v1 cpu hierarchy has no CFS bandwidth control: CPU limits are not enforced"
            );
            let _ = fs::remove_dir(&parent);
            None
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "the v1 cpu hierarchy cannot hold leaves: CPU limits are not enforced");
            None
        }
    }
}

/// One path component made of `[A-Za-z0-9._-]`, not `.` or `..`.
pub(crate) fn validate_name(field: &'static str, name: &str) -> Result<(), IsolationError> {
    let ok = !name.is_empty()
        && name.len() <= CGROUP_NAME_BYTES_MAX
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(IsolationError::invalid(
            field,
            format!(
                "{name:?} must be 1..={CGROUP_NAME_BYTES_MAX} characters of [A-Za-z0-9._-], \
                 not . or .."
            ),
        ))
    }
}

fn validate_absolute(field: &'static str, path: &Path) -> Result<(), IsolationError> {
    let clean = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if clean {
        Ok(())
    } else {
        Err(IsolationError::invalid(
            field,
            format!(
                "{} must be an absolute path without . or ..",
                path.display()
            ),
        ))
    }
}

/// One line of /proc/self/mountinfo, the fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    root: String,
    pub(crate) mount_point: PathBuf,
    fs_type: String,
    super_options: Vec<String>,
}

pub(crate) fn read_mounts() -> Result<Vec<Mount>, IsolationError> {
    let text = fs_util::read_to_string(Path::new(MOUNTINFO), "read mount table")?;
    Ok(text.lines().filter_map(parse_mountinfo_line).collect())
}

/// `36 35 98:0 /root /mount/point rw,noatime [optional…] - fstype source super,options`
fn parse_mountinfo_line(line: &str) -> Option<Mount> {
    let (left, right) = line.split_once(" - ")?;
    let left: Vec<&str> = left.split(' ').collect();
    let mut right = right.split(' ');
    let fs_type = right.next()?.to_owned();
    let _source = right.next()?;
    let super_options = right
        .next()
        .unwrap_or("")
        .split(',')
        .map(str::to_owned)
        .collect();
    Some(Mount {
        root: unescape_mount_field(left.get(3)?),
        mount_point: PathBuf::from(unescape_mount_field(left.get(4)?)),
        fs_type,
        super_options,
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` octal escapes.
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match escape {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One line of /proc/self/cgroup: `id:controller,list:/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OwnCgroup {
    controllers: Vec<String>,
    path: String,
}

fn read_own_cgroups() -> Vec<OwnCgroup> {
    fs::read_to_string(OWN_CGROUPS)
        .map(|text| text.lines().filter_map(parse_own_cgroup_line).collect())
        .unwrap_or_default()
}

fn parse_own_cgroup_line(line: &str) -> Option<OwnCgroup> {
    let mut parts = line.splitn(3, ':');
    let _id = parts.next()?;
    let controllers = parts
        .next()?
        .split(',')
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect();
    let path = parts.next()?.to_owned();
    Some(OwnCgroup { controllers, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_lines_of_both_cgroup_versions() {
        let v1 = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory";
        let v2 = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw";
        let odd = r"50 31 0:40 /a\040b /mnt/with\040space rw - tmpfs tmpfs rw";
        assert_eq!(
            parse_mountinfo_line(v1),
            Some(Mount {
                root: "/".into(),
                mount_point: "/sys/fs/cgroup/memory".into(),
                fs_type: "cgroup".into(),
                super_options: vec!["rw".into(), "memory".into()],
            })
        );
        let v2 = parse_mountinfo_line(v2).expect("v2 line");
        assert_eq!(v2.fs_type, "cgroup2");
        assert_eq!(v2.mount_point, PathBuf::from("/sys/fs/cgroup/unified"));
        let odd = parse_mountinfo_line(odd).expect("escaped line");
        assert_eq!(odd.root, "/a b");
        assert_eq!(odd.mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(parse_mountinfo_line("no separator here"), None);
    }

    #[test]
    fn parses_own_cgroup_lines() {
        assert_eq!(
            parse_own_cgroup_line("4:memory:/process_api/abc"),
            Some(OwnCgroup {
                controllers: vec!["memory".into()],
                path: "/process_api/abc".into()
            })
        );
        assert_eq!(
            parse_own_cgroup_line("0::/"),
            Some(OwnCgroup {
                controllers: vec![],
                path: "/".into()
            })
        );
        let both = parse_own_cgroup_line("2:cpu,cpuacct:/x").expect("line");
        assert_eq!(
            both.controllers,
            vec!["cpu".to_owned(), "cpuacct".to_owned()]
        );
    }

    #[test]
    fn names_must_be_single_safe_components() {
        for good in ["w1", "task-7-a2", "A.b_c-9"] {
            assert!(validate_name("leaf", good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "ü", "x;rm", &"n".repeat(129)] {
            let err = validate_name("leaf", bad).expect_err(bad);
            assert!(err.to_string().contains("invalid leaf"), "{err}");
        }
        assert!(validate_absolute("base", Path::new("/sys/fs/cgroup/x")).is_ok());
        assert!(validate_absolute("base", Path::new("relative")).is_err());
        assert!(validate_absolute("base", Path::new("/a/../b")).is_err());
    }

    #[test]
    fn a_missing_v2_base_parent_is_reported_by_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = CgroupRootConfig {
            v2_base: Some(dir.path().join("squadron")),
            ..CgroupRootConfig::default()
        };
        let err = CgroupRoot::open("w", &config).expect_err("a tempdir is no cgroup");
        assert!(
            err.to_string().contains(&dir.path().display().to_string()),
            "{err}"
        );
    }
}
