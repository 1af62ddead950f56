//! Starting a boundary inside a leaf, without unsafe code and without tying its life to the
//! worker's.
//!
//! The worker spawns `/bin/sh -c <shim>`. The shim writes its own pid into the leaf's
//! `cgroup.procs` files (v2, and the v1 memory/pids/cpu leaves when used) so that everything it
//! starts is born inside the leaf, runs bubblewrap (as the preferred OOM victim), and writes bubblewrap's exit status to
//! the exit-code file (write to a temporary name, then rename: a reader sees all or nothing).
//! A restarted worker that is no longer the shim's parent learns the exit code from that
//! file. The shim's stdin, stdout and stderr are files, never pipes to the worker, so a
//! worker crash leaves the run untouched.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::cgroup_leaf::CgroupLeaf;
use crate::error::IsolationError;

/// The shell running the shim.
pub const SHIM_SHELL: &str = "/bin/sh";
/// The only environment variable the shim gets; bubblewrap clears it for the sandbox anyway.
pub const SHIM_PATH_ENV: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// The shim's exit status when it cannot join the leaf (nothing was started).
pub const SHIM_JOIN_FAILED_STATUS: i32 = 125;
/// How long `spawn` waits for the shim to be inside every hierarchy of the leaf.
pub const SHIM_JOIN_WAIT_MS_MAX: u64 = 30_000;
/// Interval between checks while waiting for the join.
pub const SHIM_JOIN_POLL_MS: u64 = 5;
/// `oom_score_adj` of the boundary's processes (the shim keeps its own).
pub const OOM_SCORE_ADJ_BOUNDARY: i32 = 1000;
/// Longest exit-code file read (a decimal number and a newline).
pub const EXIT_CODE_FILE_BYTES_MAX: u64 = 64;

/// Everything needed to start one boundary in one leaf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxLaunch {
    pub leaf: CgroupLeaf,
    /// bubblewrap's argv, from `BubblewrapCommand::argv`.
    pub boundary: Vec<String>,
    /// Where the shim writes bubblewrap's exit status (128 + n when killed by signal n).
    /// Must not exist yet: an attempt runs once.
    pub exit_code_file: PathBuf,
    /// `None` reads from /dev/null.
    pub stdin: Option<PathBuf>,
    /// The directory `stdout` and `stderr` lie beneath. Nothing below it is followed when they
    /// are opened: it may be one the sandbox writes to (a task's outbox), where a link planted
    /// by an earlier attempt would otherwise make this (root) process append to a host file.
    pub output_root: PathBuf,
    /// Appended to, created when missing.
    pub stdout: PathBuf,
    /// Appended to, created when missing.
    pub stderr: PathBuf,
}

/// A running shim, child of this process until `detach`.
#[derive(Debug)]
pub struct SandboxProcess {
    child: Child,
}

impl SandboxProcess {
    /// Spawns the shim and returns once it is inside every hierarchy of the leaf (or has
    /// already finished and recorded an exit code). Fails if it cannot join the leaf.
    pub fn spawn(launch: &SandboxLaunch) -> Result<SandboxProcess, IsolationError> {
        if launch.exit_code_file.exists() {
            return Err(IsolationError::invalid(
                "exit code file",
                format!(
                    "{} exists: this attempt already ran",
                    launch.exit_code_file.display()
                ),
            ));
        }
        if !launch.leaf.exists() {
            return Err(IsolationError::invalid(
                "cgroup leaf",
                format!(
                    "{} does not exist; create it first",
                    launch.leaf.path().display()
                ),
            ));
        }
        let script = Self::shim_script(launch)?;
        let (_, environment) = split_environment(&launch.boundary);
        if !environment.is_empty() {
            write_environment(&environment_file(&launch.exit_code_file), &environment)?;
        }
        let stdin = match &launch.stdin {
            Some(path) => Stdio::from(
                File::open(path).map_err(|e| IsolationError::io("open sandbox stdin", path, e))?,
            ),
            None => Stdio::null(),
        };
        let stdout = open_append(&launch.output_root, &launch.stdout, "open sandbox stdout")?;
        let stderr = open_append(&launch.output_root, &launch.stderr, "open sandbox stderr")?;
        let child = Command::new(SHIM_SHELL)
            .arg("-c")
            .arg(&script)
            .env_clear()
            .env("PATH", SHIM_PATH_ENV)
            .current_dir("/")
            // A group of its own: a terminal's ^C to the worker does not reach the sandbox.
            .process_group(0)
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|e| IsolationError::io("spawn sandbox shim", SHIM_SHELL, e))?;
        let mut process = SandboxProcess { child };
        process.wait_joined(launch)?;
        Ok(process)
    }

    /// The shell script the shim runs, every path and word quoted.
    pub fn shim_script(launch: &SandboxLaunch) -> Result<String, IsolationError> {
        if launch.boundary.is_empty() {
            return Err(IsolationError::invalid(
                "boundary",
                "argv must not be empty",
            ));
        }
        let exit_file = path_string(&launch.exit_code_file)?;
        let exit_tmp = format!("{exit_file}.tmp");
        let (boundary, environment) = split_environment(&launch.boundary);
        let mut script = String::new();
        for procs in launch.leaf.attach_files() {
            let procs = sh_quote(&path_string(&procs)?)?;
            script.push_str(&format!(
                "echo $$ > {procs} || {{ echo \"squadron shim: cannot join cgroup \"{procs} >&2; \
                 exit {SHIM_JOIN_FAILED_STATUS}; }}\n"
            ));
        }
        if !environment.is_empty() {
            // Open, then unlink: the values exist only behind the descriptor bubblewrap reads.
            let file = sh_quote(&path_string(&environment_file(&launch.exit_code_file))?)?;
            script.push_str(&format!(
                "exec {ENVIRONMENT_FD}< {file} && rm -f {file} || {{ echo \"squadron shim: \
                 cannot open the environment\" >&2; exit {SHIM_JOIN_FAILED_STATUS}; }}\n"
            ));
        }
        // The boundary is the OOM killer's first choice (1000), so an OOM in the leaf ends
        // the provider, not the shim that must record its exit code. Raising needs no
        // privilege, and the boundary cannot lower it again below its starting 0.
        script.push_str(&format!(
            "(echo {OOM_SCORE_ADJ_BOUNDARY} > /proc/self/oom_score_adj; exec {})\n",
            sh_join(&boundary)?
        ));
        script.push_str("code=$?\n");
        script.push_str(&format!(
            "echo \"$code\" > {tmp} && mv -f {tmp} {file}\n",
            tmp = sh_quote(&exit_tmp)?,
            file = sh_quote(&exit_file)?
        ));
        script.push_str("exit \"$code\"\n");
        Ok(script)
    }

    /// Reads an exit-code file: `None` while it does not exist.
    pub fn read_exit_code(path: &Path) -> Result<Option<i32>, IsolationError> {
        let meta = match fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(IsolationError::io("read exit code", path, e)),
        };
        if meta.len() > EXIT_CODE_FILE_BYTES_MAX {
            return Err(IsolationError::invalid(
                "exit code file",
                format!(
                    "{} is {} bytes, not an exit code",
                    path.display(),
                    meta.len()
                ),
            ));
        }
        let text =
            fs::read_to_string(path).map_err(|e| IsolationError::io("read exit code", path, e))?;
        text.trim().parse().map(Some).map_err(|_| {
            IsolationError::invalid(
                "exit code file",
                format!("{} holds {text:?}, not an integer", path.display()),
            )
        })
    }

    /// The shim's pid (in this process's PID namespace).
    pub fn shim_pid(&self) -> u32 {
        self.child.id()
    }

    /// The shim's status if it has finished (reaping it).
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, IsolationError> {
        self.child
            .try_wait()
            .map_err(|e| IsolationError::io("wait for sandbox shim", SHIM_SHELL, e))
    }

    /// Blocks until the shim finishes.
    pub fn wait(&mut self) -> Result<ExitStatus, IsolationError> {
        self.child
            .wait()
            .map_err(|e| IsolationError::io("wait for sandbox shim", SHIM_SHELL, e))
    }

    /// Hands the shim to a thread that reaps it when it ends, so it never lingers as a
    /// zombie; its exit code is in the exit-code file, not in this process.
    pub fn detach(self) {
        let mut child = self.child;
        let spawned = thread::Builder::new()
            .name(format!("shim-reaper-{}", child.id()))
            .spawn(move || {
                let _ = child.wait();
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a thread to reap a sandbox shim");
        }
    }

    fn wait_joined(&mut self, launch: &SandboxLaunch) -> Result<(), IsolationError> {
        let pid = self.child.id();
        let started = Instant::now();
        loop {
            if joined_everywhere(&launch.leaf, pid) || launch.exit_code_file.exists() {
                return Ok(());
            }
            if let Some(status) = self.try_wait()? {
                // It may have run to the end between two checks.
                if launch.exit_code_file.exists() {
                    return Ok(());
                }
                return Err(IsolationError::Launch(format!(
                    "sandbox shim exited with {status} without recording an exit code in {} \
                     (cannot join {}?); see {}",
                    launch.exit_code_file.display(),
                    launch.leaf.path().display(),
                    launch.stderr.display()
                )));
            }
            if started.elapsed() > Duration::from_millis(SHIM_JOIN_WAIT_MS_MAX) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(IsolationError::Launch(format!(
                    "sandbox shim did not join {} within {SHIM_JOIN_WAIT_MS_MAX} ms",
                    launch.leaf.path().display()
                )));
            }
            thread::sleep(Duration::from_millis(SHIM_JOIN_POLL_MS));
        }
    }
}

fn joined_everywhere(leaf: &CgroupLeaf, pid: u32) -> bool {
    let pid = pid.to_string();
    leaf.attach_files().iter().all(|procs| {
        fs::read_to_string(procs)
            .map(|text| text.lines().any(|l| l.trim() == pid))
            .unwrap_or(false)
    })
}

fn open_append(root: &Path, path: &Path, what: &'static str) -> Result<File, IsolationError> {
    let relative = path.strip_prefix(root).map_err(|_| {
        IsolationError::invalid(
            "stdout",
            format!("{} is not beneath {}", path.display(), root.display()),
        )
    })?;
    crate::beneath::Beneath::open(root)
        .and_then(|dir| dir.append(relative))
        .map_err(|e| IsolationError::io(what, path, std::io::Error::other(e)))
}

/// The descriptor bubblewrap reads its `--setenv` arguments from (`--args`).
pub const ENVIRONMENT_FD: u32 = 3;

/// Moves every `--setenv NAME VALUE` of a bubblewrap argv into arguments bubblewrap reads
/// from [`ENVIRONMENT_FD`] (`--args 3`, NUL-separated), so no value — an allowlisted API
/// key — shows in `/proc/*/cmdline` or in the shim's script. `BubblewrapCommand::argv`
/// emits them in one run right after `--clearenv`; that run is what moves, and `--args`
/// takes its place, so the order bubblewrap applies them in stays the same.
pub fn split_environment(boundary: &[String]) -> (Vec<String>, Vec<String>) {
    let Some(clear) = boundary.iter().position(|a| a == "--clearenv") else {
        return (boundary.to_vec(), Vec::new());
    };
    let mut end = clear + 1;
    while boundary.get(end).is_some_and(|a| a == "--setenv") && end + 2 < boundary.len() {
        end += 3;
    }
    let environment = boundary[clear + 1..end].to_vec();
    if environment.is_empty() {
        return (boundary.to_vec(), environment);
    }
    let mut argv = boundary[..=clear].to_vec();
    argv.extend(["--args".to_owned(), ENVIRONMENT_FD.to_string()]);
    argv.extend_from_slice(&boundary[end..]);
    (argv, environment)
}

/// Beside the exit-code file (never in a directory the sandbox sees), for the moment between
/// the worker writing it and the shim unlinking it.
fn environment_file(exit_code_file: &Path) -> PathBuf {
    let mut name = exit_code_file.as_os_str().to_owned();
    name.push(".env");
    PathBuf::from(name)
}

fn write_environment(path: &Path, args: &[String]) -> Result<(), IsolationError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut bytes = Vec::new();
    for arg in args {
        if arg.as_bytes().contains(&0) {
            return Err(IsolationError::invalid(
                "environment",
                "a value holds a NUL byte",
            ));
        }
        bytes.extend_from_slice(arg.as_bytes());
        bytes.push(0);
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| IsolationError::io("write the sandbox environment", path, e))?;
    file.write_all(&bytes)
        .map_err(|e| IsolationError::io("write the sandbox environment", path, e))
}

fn path_string(path: &Path) -> Result<String, IsolationError> {
    path.to_str().map(str::to_owned).ok_or_else(|| {
        IsolationError::invalid("path", format!("{} is not valid UTF-8", path.display()))
    })
}

/// `word` quoted so that POSIX `sh` reads it back as exactly one word with the same bytes
/// (`shlex`); a NUL byte cannot be passed through a shell and is refused.
pub(crate) fn sh_quote(word: &str) -> Result<String, IsolationError> {
    shlex::try_quote(word)
        .map(|q| q.into_owned())
        .map_err(|e| IsolationError::invalid("shell word", format!("{word:?}: {e}")))
}

/// Every word quoted (see [`sh_quote`]) and joined with spaces: a command line for `sh`.
pub(crate) fn sh_join<S: AsRef<str>>(words: &[S]) -> Result<String, IsolationError> {
    shlex::try_join(words.iter().map(AsRef::as_ref))
        .map_err(|e| IsolationError::invalid("shell words", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn setenv_arguments_move_behind_the_descriptor_in_their_place() {
        let argv: Vec<String> = [
            "bwrap",
            "--ro-bind",
            "/usr",
            "/usr",
            "--clearenv",
            "--setenv",
            "A",
            "1",
            "--setenv",
            "B",
            "two words",
            "--chdir",
            "/w",
            "--",
            "/bin/sh",
            "--setenv",
        ]
        .map(String::from)
        .to_vec();
        let (boundary, moved) = split_environment(&argv);
        assert_eq!(
            boundary,
            [
                "bwrap",
                "--ro-bind",
                "/usr",
                "/usr",
                "--clearenv",
                "--args",
                "3",
                "--chdir",
                "/w",
                "--",
                "/bin/sh",
                "--setenv"
            ]
        );
        assert_eq!(moved, ["--setenv", "A", "1", "--setenv", "B", "two words"]);
        let none: Vec<String> = ["bwrap", "--clearenv", "--", "true"]
            .map(String::from)
            .to_vec();
        assert_eq!(split_environment(&none), (none.clone(), Vec::new()));
    }

    #[test]
    fn plain_words_stay_readable() {
        assert_eq!(
            sh_quote("/sys/fs/cgroup/unified/a-b_c.d").unwrap(),
            "/sys/fs/cgroup/unified/a-b_c.d"
        );
        assert_eq!(sh_quote("--ro-bind").unwrap(), "--ro-bind");
    }

    #[test]
    fn special_words_are_quoted() {
        assert_eq!(sh_quote("").unwrap(), "''");
        assert_eq!(sh_quote("a b").unwrap(), "'a b'");
        assert_eq!(sh_quote("$HOME").unwrap(), "'$HOME'");
        assert_eq!(sh_quote("`id`;rm -rf /").unwrap(), "'`id`;rm -rf /'");
        assert!(sh_quote("nul\0byte").is_err());
    }

    /// The real proof: `sh` must hand every word back byte for byte, as one argument each.
    #[test]
    fn sh_reads_back_exactly_the_words_given() {
        let words = [
            "plain",
            "",
            "with space",
            "it's",
            "''",
            "\"double\"",
            "$HOME $(id) `id`",
            "back\\slash",
            "new\nline",
            "tab\there",
            "glob * ? [a]",
            "semi;colon&amp|pipe>redir<in",
            "~tilde",
            "#hash",
            "ünïcødé ✓",
            "-n",
            "PATH=/usr/bin:/bin",
        ];
        let script = format!(
            "for w in {}; do printf '%s\\0' \"$w\"; done",
            sh_join(&words).unwrap()
        );
        let out = Command::new("/bin/sh")
            .arg("-c")
            .arg(&script)
            .env_clear()
            .output()
            .expect("run /bin/sh");
        assert!(out.status.success(), "sh failed: {out:?}");
        let got: Vec<String> = out
            .stdout
            .split(|b| *b == 0)
            .map(|w| String::from_utf8(w.to_vec()).expect("utf-8"))
            .collect();
        // printf ends every word with NUL, so the split leaves one empty tail.
        assert_eq!(got.len(), words.len() + 1);
        assert_eq!(&got[..words.len()], &words[..]);
    }
}
