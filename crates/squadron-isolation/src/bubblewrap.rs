//! The bubblewrap boundary's command line.
//!
//! What the boundary gives the provider: the host's system directories read-only, a fresh
//! /proc of its own PID namespace, a minimal /dev, a private /tmp, the caller's read-write and
//! read-only binds and nothing else of the host's file system; a new session; IPC, UTS and
//! cgroup namespaces of its own (network too: loopback only when isolated, or a prepared
//! namespace entered with `nsenter` before bubblewrap starts); death with its parent; no
//! capabilities; an environment of exactly the allowlisted variables; no_new_privs.
//!
//! bubblewrap run by root drops the effective and permitted capabilities but keeps the
//! bounding set; `setpriv` (util-linux) then empties the bounding and inheritable sets
//! inside the boundary, and can switch to an unprivileged uid, before exec'ing the command.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::error::IsolationError;

pub const BWRAP_PROGRAM_DEFAULT: &str = "/usr/bin/bwrap";
pub const SETPRIV_PROGRAM_DEFAULT: &str = "/usr/bin/setpriv";
/// util-linux `nsenter`, which puts bubblewrap into a prepared network namespace.
pub const NSENTER_PROGRAM_DEFAULT: &str = "/usr/bin/nsenter";
/// Host directories shown read-only (or re-created as the same symlink) when they exist.
pub const SYSTEM_RO_PATHS: [&str; 8] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];
/// Host credential files inside the read-only system paths, shown empty: a provider runs as
/// root without capabilities and, as the files' owner, could otherwise read them.
pub const MASKED_SYSTEM_FILES: [&str; 4] = [
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/shadow-",
    "/etc/gshadow-",
];
/// Directory whose `*_key` files (private host keys) are masked the same way.
pub const MASKED_KEY_DIR: &str = "/etc/ssh";
/// The empty, read-only file bound over masked files. A device node such as /dev/null would
/// not do: bubblewrap's binds are `nodev`, so opening it would fail instead of reading nothing.
pub const MASK_FILE: &str = "/run/squadron/empty";
/// Size of the private /tmp (a tmpfs, charged to the leaf's memory).
pub const SANDBOX_TMP_BYTES_DEFAULT: u64 = 1 << 30;
/// Most environment variables passed in.
pub const SANDBOX_ENV_VARS_MAX: usize = 256;
/// Longest environment value; values go on bwrap's command line.
pub const SANDBOX_ENV_VALUE_BYTES_MAX: usize = 32 * 1024;
/// Most caller binds (read-write plus read-only).
pub const SANDBOX_BINDS_MAX: usize = 64;
/// Most words in the command run inside.
pub const SANDBOX_ARGV_WORDS_MAX: usize = 4096;

/// A builder for the argv of one bubblewrap boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BubblewrapCommand {
    program: PathBuf,
    system_paths: Vec<PathBuf>,
    rw_binds: Vec<(PathBuf, String)>,
    ro_binds: Vec<(PathBuf, String)>,
    env: BTreeMap<String, String>,
    isolate_network: bool,
    join_network: Option<PathBuf>,
    chdir: Option<String>,
    tmp_bytes: Option<u64>,
    setpriv: Option<PathBuf>,
    sandbox_user: Option<(u32, u32)>,
    command: Vec<String>,
}

impl BubblewrapCommand {
    /// A boundary running `command` with the defaults: `/usr/bin/bwrap`, the system paths,
    /// a `SANDBOX_TMP_BYTES_DEFAULT` /tmp, bounding set emptied by `/usr/bin/setpriv`, network
    /// shared, uid unchanged, no binds, empty environment.
    pub fn new(command: Vec<String>) -> Self {
        BubblewrapCommand {
            program: PathBuf::from(BWRAP_PROGRAM_DEFAULT),
            system_paths: SYSTEM_RO_PATHS.iter().map(PathBuf::from).collect(),
            rw_binds: Vec::new(),
            ro_binds: Vec::new(),
            env: BTreeMap::new(),
            isolate_network: false,
            join_network: None,
            chdir: None,
            tmp_bytes: Some(SANDBOX_TMP_BYTES_DEFAULT),
            setpriv: Some(PathBuf::from(SETPRIV_PROGRAM_DEFAULT)),
            sandbox_user: None,
            command,
        }
    }

    pub fn program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = program.into();
        self
    }

    /// Replaces the host directories shown read-only at the same place.
    pub fn system_paths(mut self, paths: Vec<PathBuf>) -> Self {
        self.system_paths = paths;
        self
    }

    /// `host` appears writable at `dest`.
    pub fn bind_rw(mut self, host: impl Into<PathBuf>, dest: impl Into<String>) -> Self {
        self.rw_binds.push((host.into(), dest.into()));
        self
    }

    /// `host` appears read-only at `dest`.
    pub fn bind_ro(mut self, host: impl Into<PathBuf>, dest: impl Into<String>) -> Self {
        self.ro_binds.push((host.into(), dest.into()));
        self
    }

    /// The complete environment inside; nothing else is inherited.
    pub fn env(mut self, env: BTreeMap<String, String>) -> Self {
        self.env = env;
        self
    }

    /// A network namespace of its own: loopback only.
    pub fn isolate_network(mut self, isolate: bool) -> Self {
        self.isolate_network = isolate;
        self
    }

    /// Runs bubblewrap inside this existing network namespace (a file such as
    /// `/run/netns/NAME`, see `sandbox_network`): the argv then starts with `nsenter`.
    pub fn join_network(mut self, netns: Option<PathBuf>) -> Self {
        self.join_network = netns;
        self
    }

    pub fn chdir(mut self, dir: impl Into<String>) -> Self {
        self.chdir = Some(dir.into());
        self
    }

    /// Size cap of the private /tmp; `None` for the tmpfs default (half of RAM).
    pub fn tmp_bytes(mut self, bytes: Option<u64>) -> Self {
        self.tmp_bytes = bytes;
        self
    }

    /// The `setpriv` that empties the bounding set inside; `None` keeps bubblewrap's
    /// behaviour (effective and permitted sets empty, bounding set kept, no_new_privs set).
    pub fn setpriv(mut self, setpriv: Option<PathBuf>) -> Self {
        self.setpriv = setpriv;
        self
    }

    /// Run the command as this host (uid, gid) instead of root; needs `setpriv`.
    pub fn sandbox_user(mut self, user: Option<(u32, u32)>) -> Self {
        self.sandbox_user = user;
        self
    }

    /// The full argv, bwrap first. Checks every field and reads the system paths (to show
    /// symlinks such as `/bin -> usr/bin` as symlinks).
    pub fn argv(&self) -> Result<Vec<String>, IsolationError> {
        self.validate()?;
        let mut argv = Vec::new();
        if let Some(netns) = &self.join_network {
            argv.extend([
                NSENTER_PROGRAM_DEFAULT.to_owned(),
                format!("--net={}", path_str("network namespace", netns)?),
                "--".to_owned(),
            ]);
        }
        argv.push(path_str("bubblewrap program", &self.program)?);
        let mut push = |words: &[&str]| argv.extend(words.iter().map(|w| (*w).to_owned()));
        push(&[
            "--die-with-parent",
            "--new-session",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
        ]);
        if self.isolate_network {
            push(&["--unshare-net"]);
        }
        push(&["--cap-drop", "ALL"]);
        if self.setpriv.is_some() {
            push(&["--cap-add", "CAP_SETPCAP"]);
            if self.sandbox_user.is_some() {
                push(&["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]);
            }
        }

        for path in &self.system_paths {
            let shown = path_str("system path", path)?;
            let Ok(meta) = fs::symlink_metadata(path) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                let target =
                    fs::read_link(path).map_err(|e| IsolationError::io("read symlink", path, e))?;
                argv.extend([
                    "--symlink".to_owned(),
                    path_str("system path symlink target", &target)?,
                    shown,
                ]);
            } else if meta.is_dir() {
                argv.extend(["--ro-bind".to_owned(), shown.clone(), shown]);
            }
        }
        if self.system_paths.iter().any(|p| p == Path::new("/etc")) {
            let files = masked_system_files();
            if !files.is_empty() {
                ensure_mask_file()?;
            }
            for file in files {
                argv.extend(["--ro-bind".to_owned(), MASK_FILE.to_owned(), file]);
            }
        }
        argv.extend(["--proc", "/proc", "--dev", "/dev"].map(str::to_owned));
        argv.extend(["--perms".to_owned(), "1777".to_owned()]);
        if let Some(bytes) = self.tmp_bytes {
            argv.extend(["--size".to_owned(), bytes.to_string()]);
        }
        argv.extend(["--tmpfs".to_owned(), "/tmp".to_owned()]);
        // bubblewrap would make missing parents of a bind (like /mnt) with the mode of the
        // source's parent, often 0700: create them 0755 so an unprivileged user gets through.
        for dir in bind_parents(self.rw_binds.iter().chain(&self.ro_binds).map(|(_, d)| d)) {
            argv.extend([
                "--perms".to_owned(),
                "0755".to_owned(),
                "--dir".to_owned(),
                dir,
            ]);
        }
        for (host, dest) in &self.ro_binds {
            argv.extend([
                "--ro-bind".to_owned(),
                path_str("read-only bind", host)?,
                dest.clone(),
            ]);
        }
        for (host, dest) in &self.rw_binds {
            argv.extend([
                "--bind".to_owned(),
                path_str("read-write bind", host)?,
                dest.clone(),
            ]);
        }

        // The root itself is a tmpfs of bubblewrap's; nothing may be written there.
        argv.extend(["--remount-ro".to_owned(), "/".to_owned()]);

        argv.push("--clearenv".to_owned());
        for (name, value) in &self.env {
            argv.extend(["--setenv".to_owned(), name.clone(), value.clone()]);
        }
        if let Some(dir) = &self.chdir {
            argv.extend(["--chdir".to_owned(), dir.clone()]);
        }

        argv.push("--".to_owned());
        if let Some(setpriv) = &self.setpriv {
            argv.push(path_str("setpriv program", setpriv)?);
            if let Some((uid, gid)) = self.sandbox_user {
                argv.extend([
                    "--reuid".to_owned(),
                    uid.to_string(),
                    "--regid".to_owned(),
                    gid.to_string(),
                    "--clear-groups".to_owned(),
                ]);
            }
            argv.extend(
                [
                    "--bounding-set",
                    "-all",
                    "--inh-caps",
                    "-all",
                    "--no-new-privs",
                    "--",
                ]
                .map(str::to_owned),
            );
        }
        argv.extend(self.command.iter().cloned());
        Ok(argv)
    }

    fn validate(&self) -> Result<(), IsolationError> {
        if self.command.is_empty() {
            return Err(IsolationError::invalid("command", "must not be empty"));
        }
        if self.command.len() > SANDBOX_ARGV_WORDS_MAX {
            return Err(IsolationError::invalid(
                "command",
                format!(
                    "{} words, at most {SANDBOX_ARGV_WORDS_MAX}",
                    self.command.len()
                ),
            ));
        }
        if self.command.iter().any(|w| w.contains('\0')) {
            return Err(IsolationError::invalid("command", "a word contains NUL"));
        }
        if self.isolate_network && self.join_network.is_some() {
            return Err(IsolationError::invalid(
                "network",
                "isolated (loopback only) and a joined namespace exclude each other",
            ));
        }
        if self.sandbox_user.is_some() && self.setpriv.is_none() {
            return Err(IsolationError::invalid(
                "sandbox user",
                "switching uid needs setpriv",
            ));
        }
        if self
            .sandbox_user
            .is_some_and(|(uid, gid)| uid == 0 || gid == 0)
        {
            return Err(IsolationError::invalid(
                "sandbox user",
                "uid and gid must not be 0; leave it unset to stay root without capabilities",
            ));
        }
        let binds = self.rw_binds.len() + self.ro_binds.len();
        if binds > SANDBOX_BINDS_MAX {
            return Err(IsolationError::invalid(
                "binds",
                format!("{binds} binds, at most {SANDBOX_BINDS_MAX}"),
            ));
        }
        for (host, dest) in self.rw_binds.iter().chain(&self.ro_binds) {
            if !host.is_dir() && !host.is_file() {
                return Err(IsolationError::invalid(
                    "bind source",
                    format!("{} does not exist", host.display()),
                ));
            }
            validate_sandbox_path("bind destination", dest)?;
        }
        if let Some(dir) = &self.chdir {
            validate_sandbox_path("working directory", dir)?;
        }
        if self.env.len() > SANDBOX_ENV_VARS_MAX {
            return Err(IsolationError::invalid(
                "environment",
                format!(
                    "{} variables, at most {SANDBOX_ENV_VARS_MAX}",
                    self.env.len()
                ),
            ));
        }
        for (name, value) in &self.env {
            let valid_name = name
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid_name {
                return Err(IsolationError::invalid(
                    "environment",
                    format!("{name:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"),
                ));
            }
            if value.contains('\0') || value.len() > SANDBOX_ENV_VALUE_BYTES_MAX {
                return Err(IsolationError::invalid(
                    "environment",
                    format!(
                        "value of {name} must be at most {SANDBOX_ENV_VALUE_BYTES_MAX} bytes \
                         without NUL"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Every proper ancestor of the destinations, except `/` and the system paths, parents
/// before children, once each.
fn bind_parents<'a>(dests: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut parents: Vec<String> = Vec::new();
    for dest in dests {
        let mut ancestor = Path::new(dest.as_str()).parent();
        let mut chain = Vec::new();
        while let Some(dir) = ancestor.filter(|d| *d != Path::new("/")) {
            chain.push(dir.display().to_string());
            ancestor = dir.parent();
        }
        for dir in chain.into_iter().rev() {
            let system = SYSTEM_RO_PATHS
                .iter()
                .any(|s| dir == *s || dir.starts_with(&format!("{s}/")));
            // /tmp is bubblewrap's own tmpfs by then, but its subdirectories are not: a
            // bind below it (a data directory under /tmp) needs them searchable too.
            let made = dir == "/tmp"
                || ["/proc", "/dev"]
                    .iter()
                    .any(|m| dir == *m || dir.starts_with(&format!("{m}/")));
            if !system && !made && !parents.contains(&dir) {
                parents.push(dir);
            }
        }
    }
    parents
}

/// A path inside the sandbox: absolute, no `..`, no NUL.
fn validate_sandbox_path(field: &'static str, path: &str) -> Result<(), IsolationError> {
    let ok =
        path.starts_with('/') && !path.contains('\0') && !path.split('/').any(|part| part == "..");
    if ok {
        Ok(())
    } else {
        Err(IsolationError::invalid(
            field,
            format!("{path:?} must be absolute, without .. or NUL"),
        ))
    }
}

fn path_str(field: &'static str, path: &Path) -> Result<String, IsolationError> {
    path.to_str()
        .filter(|s| !s.contains('\0'))
        .map(str::to_owned)
        .ok_or_else(|| {
            IsolationError::invalid(field, format!("{} is not valid UTF-8", path.display()))
        })
}

/// Creates the empty mask file (root-owned, mode 0400, like the files it stands for) if it is
/// missing or not empty.
fn ensure_mask_file() -> Result<(), IsolationError> {
    use std::os::unix::fs::PermissionsExt;
    let path = Path::new(MASK_FILE);
    if fs::symlink_metadata(path)
        .is_ok_and(|m| m.is_file() && m.len() == 0 && m.permissions().mode() & 0o7777 == 0o400)
    {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| IsolationError::io("create directory", dir, e))?;
    }
    let _ = fs::remove_file(path);
    fs::write(path, b"").map_err(|e| IsolationError::io("create the mask file", path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o400))
        .map_err(|e| IsolationError::io("set permissions of", path, e))
}

/// The credential files present on this host that the boundary shows as empty.
fn masked_system_files() -> Vec<String> {
    let mut files: Vec<String> = MASKED_SYSTEM_FILES
        .iter()
        .filter(|f| Path::new(f).is_file())
        .map(|f| (*f).to_owned())
        .collect();
    if let Ok(entries) = fs::read_dir(MASKED_KEY_DIR) {
        let mut keys: Vec<String> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.path().to_str().map(str::to_owned))
            .filter(|p| p.ends_with("_key"))
            .collect();
        keys.sort();
        files.extend(keys);
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(argv: &[String]) -> Vec<&str> {
        argv.iter().map(String::as_str).collect()
    }

    /// Index of the first occurrence of `seq` as consecutive words.
    fn position(argv: &[String], seq: &[&str]) -> Option<usize> {
        argv.windows(seq.len())
            .position(|w| w.iter().map(String::as_str).eq(seq.iter().copied()))
    }

    #[test]
    fn argv_has_every_boundary_flag_before_the_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut env = BTreeMap::new();
        env.insert("HOME".to_owned(), "/mnt/outbox/home".to_owned());
        env.insert("LANG".to_owned(), "C.UTF-8".to_owned());
        let argv = BubblewrapCommand::new(vec!["/bin/sh".into(), "/mnt/run/launch.sh".into()])
            .bind_rw(dir.path(), "/mnt/inbox")
            .bind_ro(dir.path(), "/mnt/run")
            .env(env)
            .chdir("/mnt/inbox")
            .argv()
            .expect("argv");
        let w = words(&argv);
        assert_eq!(w[0], BWRAP_PROGRAM_DEFAULT);
        let sep = position(&argv, &["--"]).expect("-- separator");
        for flag in [
            "--die-with-parent",
            "--new-session",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--clearenv",
        ] {
            let at = position(&argv, &[flag]).unwrap_or_else(|| panic!("{flag} missing"));
            assert!(at < sep, "{flag} after --");
        }
        assert!(!w.contains(&"--unshare-net"), "network shared by default");
        assert!(position(&argv, &["--cap-drop", "ALL"]).is_some());
        assert!(position(&argv, &["--proc", "/proc", "--dev", "/dev"]).is_some());
        assert!(position(&argv, &["--perms", "1777", "--size"]).is_some());
        assert!(position(&argv, &["--tmpfs", "/tmp"]).is_some());
        let host = dir.path().to_str().expect("utf-8");
        assert!(position(&argv, &["--bind", host, "/mnt/inbox"]).is_some());
        assert!(position(&argv, &["--ro-bind", host, "/mnt/run"]).is_some());
        assert!(position(&argv, &["--ro-bind", "/usr", "/usr"]).is_some());
        assert!(position(&argv, &["--setenv", "HOME", "/mnt/outbox/home"]).is_some());
        assert!(position(&argv, &["--setenv", "LANG", "C.UTF-8"]).is_some());
        // --clearenv comes before every --setenv, or it would wipe them.
        let clear = position(&argv, &["--clearenv"]).expect("clearenv");
        assert!(argv
            .iter()
            .enumerate()
            .filter(|(_, a)| *a == "--setenv")
            .all(|(i, _)| i > clear));
        assert!(position(&argv, &["--chdir", "/mnt/inbox"]).is_some());
        // /mnt is made 0755 before the binds under it, and the root is read-only after them.
        let mnt = position(&argv, &["--perms", "0755", "--dir", "/mnt"]).expect("/mnt");
        assert!(mnt < position(&argv, &["--bind", host, "/mnt/inbox"]).expect("bind"));
        assert_eq!(argv.iter().filter(|a| *a == "/mnt").count(), 1);
        let ro = position(&argv, &["--remount-ro", "/"]).expect("remount-ro");
        assert!(ro > position(&argv, &["--bind", host, "/mnt/inbox"]).expect("bind"));
        assert!(ro < sep);
        // setpriv empties the bounding set, then the command follows.
        assert_eq!(
            &w[sep + 1..],
            &[
                SETPRIV_PROGRAM_DEFAULT,
                "--bounding-set",
                "-all",
                "--inh-caps",
                "-all",
                "--no-new-privs",
                "--",
                "/bin/sh",
                "/mnt/run/launch.sh"
            ]
        );
        assert!(position(&argv, &["--cap-add", "CAP_SETPCAP"]).is_some());
        assert!(position(&argv, &["--cap-add", "CAP_SETUID"]).is_none());
    }

    #[test]
    fn host_symlinks_are_recreated_and_missing_paths_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real");
        fs::create_dir(&real).expect("mkdir");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("real", &link).expect("symlink");
        let missing = dir.path().join("missing");
        let argv = BubblewrapCommand::new(vec!["true".into()])
            .system_paths(vec![real.clone(), link.clone(), missing.clone()])
            .argv()
            .expect("argv");
        let real = real.to_str().expect("utf-8");
        let link = link.to_str().expect("utf-8");
        assert!(position(&argv, &["--ro-bind", real, real]).is_some());
        assert!(position(&argv, &["--symlink", "real", link]).is_some());
        assert!(!argv.iter().any(|a| Path::new(a) == missing));
    }

    #[test]
    fn isolated_network_user_switch_and_plain_bwrap_variants() {
        let argv = BubblewrapCommand::new(vec!["true".into()])
            .isolate_network(true)
            .sandbox_user(Some((65534, 65534)))
            .argv()
            .expect("argv");
        assert!(position(&argv, &["--unshare-net"]).is_some());
        assert!(position(
            &argv,
            &["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        )
        .is_some());
        assert!(position(
            &argv,
            &["--reuid", "65534", "--regid", "65534", "--clear-groups"]
        )
        .is_some());

        let joined = BubblewrapCommand::new(vec!["true".into()])
            .join_network(Some(PathBuf::from("/run/netns/sq-x-0001")))
            .argv()
            .expect("argv");
        assert_eq!(
            &joined[..4],
            &[
                NSENTER_PROGRAM_DEFAULT,
                "--net=/run/netns/sq-x-0001",
                "--",
                BWRAP_PROGRAM_DEFAULT
            ]
        );
        assert!(position(&joined, &["--unshare-net"]).is_none());

        let plain = BubblewrapCommand::new(vec!["true".into()])
            .setpriv(None)
            .tmp_bytes(None)
            .argv()
            .expect("argv");
        assert!(!plain.iter().any(|a| a == "--cap-add" || a == "--size"));
        assert_eq!(plain.last().map(String::as_str), Some("true"));
    }

    #[test]
    fn bad_fields_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cases: Vec<(BubblewrapCommand, &str)> = vec![
            (BubblewrapCommand::new(vec![]), "command"),
            (
                BubblewrapCommand::new(vec!["x".into()]).bind_rw(dir.path().join("nope"), "/a"),
                "bind source",
            ),
            (
                BubblewrapCommand::new(vec!["x".into()]).bind_ro(dir.path(), "relative"),
                "bind destination",
            ),
            (
                BubblewrapCommand::new(vec!["x".into()]).bind_ro(dir.path(), "/a/../etc"),
                "bind destination",
            ),
            (
                BubblewrapCommand::new(vec!["x".into()]).chdir("../x"),
                "working directory",
            ),
            (
                BubblewrapCommand::new(vec!["x".into()])
                    .env([("BAD-NAME".to_owned(), "v".to_owned())].into()),
                "environment",
            ),
            (
                BubblewrapCommand::new(vec!["x".into()])
                    .env([("A".to_owned(), "a\0b".to_owned())].into()),
                "environment",
            ),
            (
                BubblewrapCommand::new(vec!["x".into()]).sandbox_user(Some((0, 0))),
                "sandbox user",
            ),
            (
                BubblewrapCommand::new(vec!["x".into()])
                    .isolate_network(true)
                    .join_network(Some(PathBuf::from("/run/netns/x"))),
                "network",
            ),
            (
                BubblewrapCommand::new(vec!["x".into()])
                    .setpriv(None)
                    .sandbox_user(Some((1000, 1000))),
                "sandbox user",
            ),
        ];
        for (command, field) in cases {
            let err = command.argv().expect_err(field);
            assert!(
                err.to_string().contains(&format!("invalid {field}")),
                "{err}"
            );
        }
    }
}
