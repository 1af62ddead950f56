//! One provider attempt of a profile, (profile, generation), in its project's sandbox: a
//! generation-owned cgroup leaf (see `agent_runtime`) and a bubblewrap boundary.
//!
//! What the boundary shows (ADR-0011 decision 5):
//! - `/workspace`: the profile's own worktree, writable; the working directory.
//! - `/state`: the profile's state directory, writable.
//! - `repo/.git`, at its own host path, read-only: the worktree's `.git` file names it
//!   there, so `git status`, `log` and `diff` work, while `add`, `commit` and every other
//!   write of Git metadata fail (Git mutations go through the worker, generation-fenced).
//! - `/mnt/run`: the generation's launch files, read-only.
//! - `/mnt/broker`, when the launch names one: the Git broker's socket directory, read-only
//!   (connecting to a Unix socket is not a write, so a read-only mount suffices).
//! - for a `placement: project` task's attempt: its outbox writable at `/mnt/outbox`, and the
//!   worktree at `/mnt/inbox` as well (its `launch.sh` is the one a dedicated task runs).
//! - the host's system directories read-only, a private /tmp, a PID namespace, no
//!   capabilities, no_new_privs, exactly the given environment (`squadron-isolation`), as
//!   the worker's sandbox user (nobody by default): the worktree is shared with it (its top
//!   directory and `.git` file stay the worker's, for libgit2), the state directory and the
//!   launch files are handed to it, and Git inside treats every directory as safe
//!   (`runtime::sandbox_user`).
//!
//! Peers' worktrees and states, the other generations' launch files and the rest of the
//! sandbox are not mounted at all.
//!
//! Once-only and single writer on the worker's side: `start` records `run/{key}/g{n}.started`
//! exclusively before spawning, and refuses a generation not newer than the last started one,
//! or any start while another generation of the profile still has a populated leaf. The
//! control plane's lease remains the authority; this is the worker refusing to be the second
//! writer if asked to be.
//!
//! The network is the launch's mode (`runtime::boundary_network`); an agent attempt is always
//! `outbound`: a namespace of its own with NAT and the egress filter, torn down with the
//! proving reap and recorded in `run/{key}/g{n}.network` until then. Credentials injected at
//! egress have their proxy listening on that namespace's loopback before the spawn.
//!
//! Restart safety as in the process runtime: output goes to files
//! (`state/{key}/logs/g{n}.{stdout,stderr}.log`), the shim writes the exit code to
//! `run/{key}/g{n}.exit-code`, and a restarted worker finds the attempt by its leaf path and
//! marker (`adopt`).
//!
//! Every call blocks (spawn waits for the leaf join, terminate for the grace, reap for
//! `populated 0`): call them from a blocking task.

use std::collections::BTreeMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use squadron_core::ids::{Generation, ProfileKey};
use squadron_core::manifest::NetworkMode;
use squadron_isolation::{
    BubblewrapCommand, CgroupLeaf, CgroupLimits, ReapEvidence, Reaper, SandboxLaunch,
    SandboxProcess, Termination, TerminationOutcome,
};

use crate::agent::credentials::{self, AgentCredentials};
use crate::agent::project_sandbox::{record_reap, ProfilePaths, ProjectSandbox};
use crate::agent::runtime::{isolation, AgentRuntime, ProjectCgroups, AGENT_RUNTIME};
use crate::egress::EgressSession;
use crate::error::WorkerError;
use crate::runtime::boundary_network::{BoundaryNetwork, NetworkPermits};
use crate::runtime::process::{serve_egress, serve_egress_recorded};
use crate::runtime::sandbox_user::SandboxUser;
use crate::runtime::{RunStatus, SandboxLimits};
use crate::support::remove_path;
use crate::support::write_atomic;
use crate::task::task_dir::{INBOX_MOUNT, OUTBOX_MOUNT};

/// Where the profile's worktree appears inside the boundary.
pub(crate) const WORKSPACE_MOUNT: &str = "/workspace";
/// Where the profile's state directory appears.
pub(crate) const STATE_MOUNT: &str = "/state";
/// Where the generation's launch files appear, read-only.
pub(crate) const AGENT_RUN_MOUNT: &str = "/mnt/run";
/// Where the Git broker's socket directory appears, read-only.
pub(crate) const BROKER_MOUNT: &str = "/mnt/broker";
/// Set inside the boundary by `start`, whatever the launch's environment says.
pub(crate) const PROFILE_KEY_ENV: &str = "SQUADRON_PROFILE_KEY";
pub(crate) const GENERATION_ENV: &str = "SQUADRON_GENERATION";
/// Most launch files of one attempt.
pub(crate) const RUN_FILES_MAX: usize = 16;
/// Largest launch file (a prompt included).
pub(crate) const RUN_FILE_BYTES_MAX: usize = 4 << 20;
/// Longest launch file name.
pub(crate) const RUN_FILE_NAME_BYTES_MAX: usize = 128;

/// What one attempt runs.
#[derive(Debug, Clone, Default)]
pub(crate) struct AgentLaunch {
    /// The command inside the boundary, e.g. `["/bin/sh", "/mnt/run/launch.sh"]`.
    pub(crate) argv: Vec<String>,
    /// The complete environment inside, already reduced to the allowlist.
    /// `SQUADRON_PROFILE_KEY` and `SQUADRON_GENERATION` are added.
    pub(crate) env: BTreeMap<String, String>,
    /// Files written to `run/{key}/g{n}/` before the start, seen at `/mnt/run/{name}`.
    pub(crate) run_files: BTreeMap<String, Vec<u8>>,
    /// The name of one of `run_files` fed to the provider on standard input; `None` for
    /// /dev/null.
    pub(crate) stdin: Option<String>,
    pub(crate) network: NetworkMode,
    pub(crate) limits: SandboxLimits,
    /// The directory holding the Git broker's socket, shown read-only at `/mnt/broker`.
    /// It must hold nothing else a provider may not read.
    pub(crate) broker_dir: Option<PathBuf>,
    /// The generation's filled credential tmpfs, shown read-only where it says
    /// (`agent::credentials`); its `{MOUNT}_FILE` variables are already in `env`. Its
    /// egress proxy, if any, is served in the generation's namespace before the spawn.
    pub(crate) credentials: Option<AgentCredentials>,
    /// A `placement: project` task's outbox: shown writable at `/mnt/outbox`, with the
    /// worktree shown at `/mnt/inbox` too, where the task's `launch.sh` works.
    pub(crate) task_outbox: Option<PathBuf>,
}

/// A started (or adopted) attempt: the handle the worker keeps for (profile, generation).
#[derive(Debug, Clone)]
pub(crate) struct AgentAttempt {
    runtime: AgentRuntime,
    cgroups: ProjectCgroups,
    leaf: CgroupLeaf,
    paths: ProfilePaths,
    generation: Generation,
}

impl AgentAttempt {
    /// Starts generation `generation` of profile `key` (whose worktree `ensure_profile`
    /// made) in `sandbox`, and returns once the shim is inside the leaf.
    ///
    /// Refused before anything runs when the generation is 0, not newer than the last one
    /// started here, or another generation of the profile is still populated. After a
    /// failure past the start record the generation is spent: reap it for evidence.
    pub(crate) fn start(
        runtime: &AgentRuntime,
        sandbox: &ProjectSandbox,
        key: &ProfileKey,
        generation: Generation,
        launch: &AgentLaunch,
    ) -> Result<AgentAttempt, WorkerError> {
        check_startable(sandbox, key, generation, launch)?;
        let paths = sandbox.profile_paths(key);
        let (tenant, project) = (sandbox.tenant(), sandbox.project());
        let leaf_path = runtime.leaf_path(tenant, project, key, generation);
        sandbox.record_start(&paths, generation, &leaf_path, || {
            match runtime.running_generations(tenant, project, key)?.first() {
                Some(running) => Err(invalid(
                    "generation",
                    format!(
                        "generation {running} of profile {key} is still running; reap it \
                         before starting generation {generation}"
                    ),
                )),
                None => Ok(()),
            }
        })?;
        let run_dir = write_run_files(&paths, generation, launch)?;
        if let Some(user) = runtime.config().sandbox_user {
            user.share_work_tree(&paths.worktree)?;
            user.hand_over(&paths.state)?;
            user.hand_over(&run_dir)?;
        }
        let (cgroups, leaf) = make_leaf(runtime, sandbox, key, generation, &leaf_path, launch)?;
        let config = runtime.config();
        let network = BoundaryNetwork::prepare(
            &config.network,
            launch.network,
            // Attempts have no proxy of their own: gateway is for tasks.
            NetworkPermits {
                full: config.allow_full_network,
                gateway: false,
            },
            &leaf_path.display().to_string(),
            &network_record(&paths, generation),
            // An `isolated` project task with credentials injected at egress gets a namespace
            // of its own for the proxy to listen in.
            launch
                .credentials
                .as_ref()
                .is_some_and(|c| c.egress.is_some()),
        )?;
        if let Some(egress) = launch.credentials.as_ref().and_then(|c| c.egress.as_ref()) {
            serve_egress(egress, &network)?;
        }
        let boundary = boundary(runtime, sandbox, &paths, generation, launch, &network)?;
        let sandbox_launch = SandboxLaunch {
            leaf: leaf.clone(),
            boundary,
            exit_code_file: paths.exit_code_file(generation),
            stdin: launch.stdin.as_ref().map(|name| run_dir.join(name)),
            output_root: paths.logs.clone(),
            stdout: paths.stdout_log(generation),
            stderr: paths.stderr_log(generation),
        };
        let process = SandboxProcess::spawn(&sandbox_launch).map_err(isolation)?;
        tracing::info!(
            profile = %key,
            %generation,
            cgroup = %leaf.path().display(),
            shim = process.shim_pid(),
            "agent attempt started"
        );
        process.detach();
        Ok(AgentAttempt {
            runtime: runtime.clone(),
            cgroups,
            leaf,
            paths,
            generation,
        })
    }

    /// The attempt a previous life of this worker started for (profile, generation), found
    /// by its start record or its leaf; `None` when neither exists.
    pub(crate) fn adopt(
        runtime: &AgentRuntime,
        sandbox: &ProjectSandbox,
        key: &ProfileKey,
        generation: Generation,
    ) -> Result<Option<AgentAttempt>, WorkerError> {
        let paths = sandbox.profile_paths(key);
        let (tenant, project) = (sandbox.tenant(), sandbox.project());
        let leaf_path = runtime.leaf_path(tenant, project, key, generation);
        let started = sandbox.started(key, generation)?;
        if started.is_none() && !leaf_path.join("cgroup.procs").exists() {
            return Ok(None);
        }
        if let Some(started) = &started {
            if Path::new(&started.cgroup) != leaf_path {
                return Err(WorkerError::runtime(
                    AGENT_RUNTIME,
                    format!(
                        "generation {generation} of {key} started in {}, not in this \
                         worker's {}",
                        started.cgroup,
                        leaf_path.display()
                    ),
                ));
            }
        }
        let (cgroups, leaf) = {
            let _guard = runtime.lock_cgroups();
            let cgroups = runtime.project_cgroups(tenant, project)?;
            let leaf = cgroups
                .project
                .leaf(&AgentRuntime::leaf_name(key, generation))
                .map_err(isolation)?;
            (cgroups, leaf)
        };
        Ok(Some(AgentAttempt {
            runtime: runtime.clone(),
            cgroups,
            leaf,
            paths,
            generation,
        }))
    }

    /// After a worker restart: egress injection's proxy served again, in the namespace the
    /// generation's network record names.
    pub(crate) fn serve_egress_again(
        &self,
        egress: &Arc<EgressSession>,
    ) -> Result<(), WorkerError> {
        serve_egress_recorded(
            egress,
            &self.runtime.config().network,
            &network_record(&self.paths, self.generation),
            &format!("generation {} of {}", self.generation, self.paths.key),
        )
    }

    pub(crate) fn paths(&self) -> &ProfilePaths {
        &self.paths
    }

    pub(crate) fn generation(&self) -> Generation {
        self.generation
    }

    /// The leaf's v2 directory: the lease holder's cgroup, and what reap evidence names.
    pub(crate) fn cgroup_path(&self) -> &Path {
        self.leaf.path()
    }

    pub(crate) fn leaf(&self) -> &CgroupLeaf {
        &self.leaf
    }

    #[cfg(test)]
    pub(crate) fn stdout_log(&self) -> PathBuf {
        self.paths.stdout_log(self.generation)
    }

    #[cfg(test)]
    pub(crate) fn stderr_log(&self) -> PathBuf {
        self.paths.stderr_log(self.generation)
    }

    /// Running while the leaf is populated; then the exit code the shim recorded, or
    /// `Vanished` when it recorded none (killed from outside, or a failed start).
    pub(crate) fn status(&self) -> Result<RunStatus, WorkerError> {
        if self.leaf.populated().map_err(isolation)? {
            return Ok(RunStatus::Running);
        }
        let exit_code = self.paths.exit_code_file(self.generation);
        if let Some(code) = SandboxProcess::read_exit_code(&exit_code).map_err(isolation)? {
            return Ok(RunStatus::Exited { code });
        }
        let started = self.paths.started_marker(self.generation);
        if self.leaf.exists() && !started.exists() {
            return Ok(RunStatus::Created);
        }
        Ok(RunStatus::Vanished)
    }

    /// SIGTERM to the provider, `grace`, then SIGKILL (see `squadron_isolation::termination`).
    pub(crate) fn terminate(&self, grace: Duration) -> Result<TerminationOutcome, WorkerError> {
        Termination::new(grace).run(&self.leaf).map_err(isolation)
    }

    /// Freeze → kill → `populated 0` → rmdir. The evidence is the proof a crash takeover
    /// and `ProjectSandbox::reset_worktree` need; `populated: true` proves nothing. Proving
    /// evidence is also kept in `run/{key}/g{n}.reaped` (`ProjectSandbox::reap_evidence`).
    pub(crate) fn reap(&self) -> Result<ReapEvidence, WorkerError> {
        let reaper = Reaper::new(self.runtime.config().reap_wait);
        let evidence = reaper.reap(&self.leaf).map_err(isolation)?;
        if !evidence.populated {
            credentials::redact_and_wipe(&self.paths, self.generation)?;
            BoundaryNetwork::tear_down(
                &self.runtime.config().network,
                &network_record(&self.paths, self.generation),
            )?;
            record_reap(&self.paths, self.generation, &evidence)?;
            self.runtime.prune(&self.cgroups);
        }
        Ok(evidence)
    }
}

/// What must hold before anything of a start is written: a valid launch, a granted
/// generation, the profile's worktree, and a broker directory apart from the sandbox.
fn check_startable(
    sandbox: &ProjectSandbox,
    key: &ProfileKey,
    generation: Generation,
    launch: &AgentLaunch,
) -> Result<(), WorkerError> {
    validate_launch(launch)?;
    if generation == Generation::ZERO {
        return Err(invalid(
            "generation",
            "0 is never granted; start the generation the lease holds",
        ));
    }
    let paths = sandbox.profile_paths(key);
    if !sandbox.has_worktree(key) || !paths.state.is_dir() {
        return Err(invalid(
            "profile_key",
            format!(
                "{key} has no worktree in {}; ensure_profile first",
                sandbox.root().display()
            ),
        ));
    }
    check_broker_dir(sandbox, launch)
}

/// `run/{key}/g{n}/` written afresh with the launch files, and the logs made ready.
fn write_run_files(
    paths: &ProfilePaths,
    generation: Generation,
    launch: &AgentLaunch,
) -> Result<PathBuf, WorkerError> {
    let run_dir = paths.generation_run_dir(generation);
    remove_path(&run_dir)?;
    fs::create_dir_all(&run_dir).map_err(|e| WorkerError::io("creating", &run_dir, e))?;
    for (name, bytes) in &launch.run_files {
        write_atomic(&run_dir.join(name), bytes)?;
    }
    prepare_logs(paths, generation)?;
    crate::agent::project_sandbox::prune_launch_files(paths, generation)?;
    Ok(run_dir)
}

/// The generation's cgroup leaf, created at the path its start record names, with the
/// launch's limits.
fn make_leaf(
    runtime: &AgentRuntime,
    sandbox: &ProjectSandbox,
    key: &ProfileKey,
    generation: Generation,
    leaf_path: &Path,
    launch: &AgentLaunch,
) -> Result<(ProjectCgroups, CgroupLeaf), WorkerError> {
    let (cgroups, leaf) = {
        let _guard = runtime.lock_cgroups();
        let cgroups = runtime.project_cgroups(sandbox.tenant(), sandbox.project())?;
        let leaf = cgroups
            .project
            .leaf(&AgentRuntime::leaf_name(key, generation))
            .map_err(isolation)?;
        leaf.create().map_err(isolation)?;
        (cgroups, leaf)
    };
    if leaf.path() != leaf_path {
        return Err(WorkerError::runtime(
            AGENT_RUNTIME,
            format!(
                "leaf {} is not the recorded {}",
                leaf.path().display(),
                leaf_path.display()
            ),
        ));
    }
    let applied = leaf
        .set_limits(&CgroupLimits {
            memory_bytes: launch.limits.memory_bytes,
            pids_max: launch.limits.pids_max,
            cpus: launch.limits.cpus,
        })
        .map_err(isolation)?;
    for missing in &applied.unavailable {
        tracing::warn!(profile = %key, %generation, "limit not enforced: {missing}");
    }
    Ok((cgroups, leaf))
}

/// The boundary's argv (see the module documentation for what it shows).
fn boundary(
    runtime: &AgentRuntime,
    sandbox: &ProjectSandbox,
    paths: &ProfilePaths,
    generation: Generation,
    launch: &AgentLaunch,
    network: &BoundaryNetwork,
) -> Result<Vec<String>, WorkerError> {
    let config = runtime.config();
    let git_dir = sandbox.git_dir();
    let git_dir_inside = git_dir
        .to_str()
        .ok_or_else(|| {
            invalid(
                "data_dir",
                format!("{} is not valid UTF-8", git_dir.display()),
            )
        })?
        .to_owned();
    let mut env = launch.env.clone();
    env.insert(PROFILE_KEY_ENV.to_owned(), paths.key.to_string());
    env.insert(GENERATION_ENV.to_owned(), generation.to_string());
    if config.sandbox_user.is_some() {
        SandboxUser::git_env(&mut env);
    }
    let mut command = BubblewrapCommand::new(launch.argv.clone())
        .program(&config.bwrap)
        .setpriv(config.setpriv.clone())
        .sandbox_user(config.sandbox_user.map(SandboxUser::pair))
        .tmp_bytes(config.tmp_bytes)
        .bind_rw(&paths.worktree, WORKSPACE_MOUNT)
        .bind_rw(&paths.state, STATE_MOUNT)
        .bind_ro(&git_dir, git_dir_inside)
        .bind_ro(paths.generation_run_dir(generation), AGENT_RUN_MOUNT)
        .env(env)
        .chdir(WORKSPACE_MOUNT);
    command = network.apply(command);
    if let Some(broker) = &launch.broker_dir {
        command = command.bind_ro(broker, BROKER_MOUNT);
    }
    if let Some(credentials) = &launch.credentials {
        command = command.bind_ro(&credentials.host, credentials.sandbox.clone());
    }
    if let Some(outbox) = &launch.task_outbox {
        command = command
            .bind_rw(&paths.worktree, INBOX_MOUNT)
            .bind_rw(outbox, OUTBOX_MOUNT);
    }
    command.argv().map_err(isolation)
}

/// `run/{key}/g{n}.network`: names the generation's own network namespace while it has one.
fn network_record(paths: &ProfilePaths, generation: Generation) -> PathBuf {
    paths.run.join(format!("g{generation}.network"))
}

/// The broker directory must exist and lie outside the sandbox, whose other directories no
/// profile may see.
fn check_broker_dir(sandbox: &ProjectSandbox, launch: &AgentLaunch) -> Result<(), WorkerError> {
    let Some(broker) = &launch.broker_dir else {
        return Ok(());
    };
    let real =
        fs::canonicalize(broker).map_err(|e| WorkerError::io("resolving broker_dir", broker, e))?;
    if !real.is_dir() || real.starts_with(sandbox.root()) || sandbox.root().starts_with(&real) {
        return Err(invalid(
            "broker_dir",
            format!(
                "{} must be a directory apart from the project sandbox {}",
                broker.display(),
                sandbox.root().display()
            ),
        ));
    }
    Ok(())
}

/// The state directory is the provider's to write, so an earlier generation may have left
/// a symlink or a FIFO where the worker (as root, outside the boundary) is about to open
/// this generation's logs: anything but a plain `logs` directory is replaced, and the two
/// log paths are cleared so the shim creates them.
fn prepare_logs(paths: &ProfilePaths, generation: Generation) -> Result<(), WorkerError> {
    match fs::symlink_metadata(&paths.logs) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => remove_path(&paths.logs)?,
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(WorkerError::io("inspecting", &paths.logs, e)),
    }
    match fs::create_dir(&paths.logs) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(WorkerError::io("creating", &paths.logs, e)),
    }
    for log in [paths.stdout_log(generation), paths.stderr_log(generation)] {
        remove_path(&log)?;
    }
    Ok(())
}

fn validate_launch(launch: &AgentLaunch) -> Result<(), WorkerError> {
    if launch.argv.is_empty() {
        return Err(invalid("argv", "must not be empty"));
    }
    if launch.run_files.len() > RUN_FILES_MAX {
        return Err(invalid(
            "run_files",
            format!("{} files, at most {RUN_FILES_MAX}", launch.run_files.len()),
        ));
    }
    for (name, bytes) in &launch.run_files {
        let valid = !name.is_empty()
            && name.len() <= RUN_FILE_NAME_BYTES_MAX
            && name != "."
            && name != ".."
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid {
            return Err(invalid(
                "run_files",
                format!(
                    "{name:?} must be 1..={RUN_FILE_NAME_BYTES_MAX} characters of \
                     [A-Za-z0-9._-], not . or .."
                ),
            ));
        }
        if bytes.len() > RUN_FILE_BYTES_MAX {
            return Err(invalid(
                "run_files",
                format!(
                    "{name} is {} bytes, at most {RUN_FILE_BYTES_MAX}",
                    bytes.len()
                ),
            ));
        }
    }
    if let Some(stdin) = &launch.stdin {
        if !launch.run_files.contains_key(stdin) {
            return Err(invalid(
                "stdin",
                format!("{stdin:?} is not one of the launch's run_files"),
            ));
        }
    }
    Ok(())
}

fn invalid(field: &str, message: impl Into<String>) -> WorkerError {
    WorkerError::Invalid {
        field: field.to_owned(),
        message: message.into(),
    }
}

#[cfg(test)]
mod tests;
