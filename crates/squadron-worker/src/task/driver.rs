//! Drives one task attempt through the lifecycle. Each step starts from the state the
//! control plane confirmed and ends by reporting the next one; the driver acts on a stage only
//! after the previous transition is committed (INV-10). After a worker restart the driver
//! starts again from the confirmed state, and every step is written to be re-run: staging is
//! idempotent, sandboxes are adopted rather than recreated, and a provider that was already
//! started is never started again.

mod agent;
mod credentials;
mod provision;
mod volume;

use std::sync::Arc;
use std::time::Duration;

use squadron_core::command::TransitionDetail;
use squadron_core::ids::{Generation, LeaseId, TaskId};
use squadron_core::manifest::{FailureAction, Placement, TaskSpec};
use squadron_core::task::{ProviderProgress, TaskState};
use tokio::sync::watch;

use crate::agent::supervisor::AgentSupervisor;
use crate::config::WorkerConfig;
use crate::control_link::{ControlLink, ReportAnswer};
use crate::error::WorkerError;
use crate::output_server::ActiveTasks;
use crate::retry;
use crate::runtime::probe::RuntimeSet;
use crate::runtime::project::{ProjectRuntime, PROJECT_RUNTIME};
use crate::runtime::{LaunchSpec, ReapReport, RunStatus, Runtime, SandboxHandle, SandboxLimits};
use crate::task::agent_relay::AgentRelays;
use crate::task::checkpoint::TaskCheckpoint;
use crate::task::collector::{collect, spec_subpath, CollectSource, RunFacts};
use crate::task::credential_session::{CredentialSession, LiveRedactions, Redactor};
use crate::task::env_allowlist::EnvAllowlist;
use crate::task::launcher::prepare_launch;
use crate::task::output_counter::{append_event, OutputCounter, OutputCounts};
use crate::task::output_retention::{class_of, RetentionRecord};
use crate::task::provider_progress::ProviderLive;
use crate::task::staging::{stage, StagingOptions};
use crate::task::task_dir::TaskDir;
use crate::task::task_dir::INBOX_MOUNT;
use provision::{provision_sandbox, ProvisionFailure};

/// Tries at a proving reap of a project task's generation, a pause apart, before its end is
/// said to be held; the tries go on, the pause doubling up to the last bound.
const PROJECT_REAP_TRIES_MAX: u32 = 5;
const PROJECT_REAP_PAUSE_MS: u64 = 2_000;
const PROJECT_REAP_PAUSE_MS_MAX: u64 = 60_000;
/// Tries at opening a project task's sandbox, a pause apart.
const PROJECT_OPEN_TRIES_MAX: u32 = 5;
const PROJECT_OPEN_PAUSE_MS: u64 = 1_000;

/// Longest error text sent to the control plane.
pub(crate) const ERROR_TEXT_BYTES_MAX: usize = 2_000;

/// What the driver needs from the worker, shared by all drivers.
#[derive(Debug)]
pub(crate) struct DriverContext {
    pub(crate) config: WorkerConfig,
    pub(crate) control: ControlLink,
    pub(crate) runtimes: RuntimeSet,
    pub(crate) active: ActiveTasks,
    /// Credential values of running attempts, for the output server's redaction.
    pub(crate) redactions: LiveRedactions,
    pub(crate) env_allowlist: EnvAllowlist,
    /// The relays of sandbox agents to the control plane.
    pub(crate) relays: AgentRelays,
    /// The agent supervisor, on a worker that runs agent profiles: a `placement: project`
    /// task runs as a generation of its profile in the supervisor's project sandbox.
    pub(crate) agents: Option<AgentSupervisor>,
}

/// A `placement: project` task's runtime lease, as its assignment carried it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TaskLease {
    pub(crate) lease: LeaseId,
    pub(crate) generation: Generation,
}

/// Why a run stopped before the provider exited on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Interruption {
    Cancelled(String),
    TimedOut(u64),
    Hung(u64),
    /// The task directory's quota (bytes) is used up.
    DiskFull(u64),
}

/// How a monitored run ended.
#[derive(Debug)]
enum RunEnd {
    /// The provider exited on its own.
    Exited,
    /// The sandbox is gone without an exit code.
    Vanished,
    Interrupted(Interruption),
}

/// How much of the end of stderr is read for a failed readiness probe's line.
const READINESS_TAIL_BYTES_MAX: u64 = 8 * 1024;

/// The output counters of a running task: what was seen, when output last grew, what the
/// control plane was last sent.
#[derive(Debug)]
struct Progress {
    counter: OutputCounter,
    last: OutputCounts,
    last_output_ms: u64,
    reported: OutputCounts,
    last_report_ms: u64,
    /// What the provider's stream said, as last looked at and as last reported.
    provider: Option<ProviderProgress>,
    reported_provider: Option<ProviderProgress>,
}

impl Progress {
    fn new(dir: &TaskDir) -> Self {
        let mut counter = OutputCounter::new(dir);
        let last = counter.look();
        Self {
            counter,
            last,
            last_output_ms: squadron_client::now_ms(),
            reported: OutputCounts::default(),
            last_report_ms: 0,
            provider: None,
            reported_provider: None,
        }
    }

    /// Looks at the progress files; output that grew resets the hang clock.
    fn look(&mut self, now: u64) -> OutputCounts {
        let counts = self.counter.look();
        if counts.stdout_bytes != self.last.stdout_bytes
            || counts.stderr_bytes != self.last.stderr_bytes
        {
            self.last_output_ms = now;
        }
        self.last = counts;
        counts
    }

    /// Whether the counters changed since the last report and the interval has passed.
    fn due(&self, now: u64, interval_ms: u64) -> bool {
        self.unreported() && now.saturating_sub(self.last_report_ms) >= interval_ms
    }

    fn unreported(&self) -> bool {
        self.last != self.reported || self.provider != self.reported_provider
    }

    fn sent(&mut self, counts: OutputCounts, now: u64) {
        self.reported = counts;
        self.reported_provider = self.provider.clone();
        self.last_report_ms = now;
    }
}

#[derive(Debug)]
pub(crate) struct TaskDriver {
    ctx: Arc<DriverContext>,
    task: TaskId,
    attempt: u32,
    spec: TaskSpec,
    dir: TaskDir,
    cancel: watch::Receiver<Option<String>>,
    /// The attempt's credential values, while it runs (for redaction at its end).
    redactor: Option<Arc<Redactor>>,
    /// The attempt's credentials injected at egress, while its proxy serves.
    egress: Option<Arc<crate::egress::EgressSession>>,
    /// A `placement: project` task's lease, from its assignment.
    lease: Option<TaskLease>,
    /// A `placement: project` task's runtime, once its project sandbox is open.
    project: Option<Arc<ProjectRuntime>>,
    /// A `placement: project` task an earlier build started in a sandbox of its own.
    own_sandbox: bool,
}

/// How a step ended.
enum Step {
    /// The control plane confirmed this state; go on from it.
    Next(TaskState),
    /// The attempt is over for this worker (terminal, or no longer ours).
    Done,
}

impl TaskDriver {
    pub(crate) fn new(
        ctx: Arc<DriverContext>,
        task: TaskId,
        attempt: u32,
        spec: TaskSpec,
        lease: Option<TaskLease>,
        cancel: watch::Receiver<Option<String>>,
    ) -> Self {
        let dir = TaskDir::new(&ctx.config.data_dir, task);
        Self {
            ctx,
            task,
            attempt,
            spec,
            dir,
            cancel,
            redactor: None,
            egress: None,
            lease,
            project: None,
            own_sandbox: false,
        }
    }

    /// Runs the attempt from `state` (the state the control plane reported) to its end.
    pub(crate) async fn run(mut self, mut state: TaskState) {
        // Whatever state it resumes in (a restarted worker adopts attempts at COMPLETING
        // too), the shapes `provider-secrets-v1` hides are hidden from the first read.
        self.redact_shapes_only();
        while !state.is_terminal() {
            let step = match self.step(state).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(task = %self.task, %state, error = %e, "task step failed");
                    self.fail(state, None, truncate(&e.to_string())).await
                }
            };
            match step {
                Step::Next(s) => state = s,
                Step::Done => break,
            }
        }
        self.ctx.relays.close(self.task, None, &self.dir.agent());
        self.end_credentials();
        // Only a committed end retires the files: a driver that stops short leaves them for
        // the next run.
        if self
            .ended()
            .await
            .is_some_and(|s| s != TaskState::FailedPreserved)
        {
            // A volume not retired now is the next start's, which records the retention then.
            if self.retire_volume().await {
                self.start_retention();
            }
        }
    }

    /// From now on the task's files age by its retention class (`output_retention.rs`).
    fn start_retention(&self) {
        let record = RetentionRecord {
            class: class_of(&self.spec).to_string(),
            ended_at_ms: crate::support::now_ms(),
        };
        if let Err(e) = record.write(&self.dir) {
            tracing::warn!(task = %self.task, error = %e, "cannot record the task's retention; its files stay");
        }
    }

    fn cancel_reason(&self) -> Option<String> {
        self.cancel.borrow().clone()
    }

    fn runtime(&self) -> Result<Arc<dyn Runtime>, WorkerError> {
        if self.is_project_task() {
            let project = self.project.clone().ok_or_else(|| {
                WorkerError::runtime(PROJECT_RUNTIME, "the project sandbox is not open")
            })?;
            return Ok(project);
        }
        let kind = self.spec.sandbox.runtime;
        self.ctx
            .runtimes
            .get(kind)
            .cloned()
            .ok_or_else(|| WorkerError::Invalid {
                field: "vm.runtime".into(),
                message: format!("this worker does not offer the {kind} runtime"),
            })
    }

    /// Whether the attempt runs as its profile's generation in the project's sandbox: a
    /// `placement: project` task, unless an earlier build of the worker started it in a
    /// sandbox of its own (it is driven there to its end).
    fn is_project_task(&self) -> bool {
        matches!(self.spec.placement, Placement::Project { .. }) && !self.own_sandbox
    }

    /// A `placement: project` task's runtime: its profile's generation in the project's
    /// sandbox on this worker — the one its record names once PROVISIONING made it, else the
    /// one the assignment's lease holds. The sandbox is asked for a few times: its volume may
    /// be being mounted again after a reboot.
    async fn open_project(&mut self) -> Result<(), String> {
        let Placement::Project {
            tenant,
            project,
            profile,
        } = &self.spec.placement
        else {
            return Ok(());
        };
        if self.project.is_some() || self.own_sandbox {
            return Ok(());
        }
        let record = ProjectRuntime::record(&self.dir, self.attempt).map_err(|e| e.to_string())?;
        if record.is_none() && self.load_checkpoint().and_then(|c| c.sandbox).is_some() {
            self.own_sandbox = true;
            return Ok(());
        }
        let agents = self.ctx.agents.clone().ok_or_else(|| {
            "this worker runs no agent profiles, so no placement: project task".to_string()
        })?;
        let generation = match (&record, self.lease) {
            (Some(run), _) => run.generation,
            (None, Some(lease)) => lease.generation,
            (None, None) => {
                return Err(
                    "no runtime lease came with the assignment of this placement: \
                            project task"
                        .to_string(),
                )
            }
        };
        let mut tries = 0;
        let sandbox = loop {
            match agents.sandbox_of(tenant, project).await {
                Ok(sandbox) => break sandbox,
                Err(e) if tries + 1 >= PROJECT_OPEN_TRIES_MAX => {
                    return Err(format!(
                        "opening the sandbox of project {tenant}/{project}: {e}"
                    ))
                }
                Err(e) => {
                    tracing::warn!(task = %self.task, error = %e, "the project sandbox cannot be opened yet");
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(PROJECT_OPEN_PAUSE_MS)).await;
                }
            }
        };
        self.project = Some(Arc::new(ProjectRuntime::new(
            agents.runtime().clone(),
            sandbox,
            profile.clone(),
            generation,
        )));
        if let (None, Some(lease)) = (&record, self.lease) {
            self.event(serde_json::json!({"event": "project_lease", "profile": profile, "lease": lease.lease.get(), "generation": lease.generation.get()}));
        }
        Ok(())
    }

    async fn step(&mut self, state: TaskState) -> Result<Step, WorkerError> {
        if let Err(why) = self.open_project().await {
            if ProjectRuntime::record(&self.dir, self.attempt).is_ok_and(|r| r.is_none()) {
                return Ok(self.fail(state, None, why).await);
            }
            // Its generation may run: the end is not reported (the lease keeps its slot)
            // until a later life of this driver can reap it.
            tracing::error!(task = %self.task, error = %why, "a project task's generation cannot be reached; its end waits");
            self.event(serde_json::json!({"event": "project_unreachable", "error": why}));
            self.ctx.active.remove(self.task);
            return Ok(Step::Done);
        }
        if let Some(reason) = self.cancel_reason() {
            return Ok(self.cancel_now(state, reason).await);
        }
        match state {
            TaskState::Pending => Ok(Step::Done),
            TaskState::Staging => self.staging().await,
            TaskState::Provisioning => self.provisioning().await,
            TaskState::Ready => self.ready().await,
            TaskState::Running => self.running().await,
            TaskState::Completing => self.completing().await,
            _ => Ok(Step::Done),
        }
    }

    fn event(&self, event: serde_json::Value) {
        let mut e = event;
        if let Some(o) = e.as_object_mut() {
            o.insert("ts_ms".into(), squadron_client::now_ms().into());
            o.insert("attempt".into(), self.attempt.into());
        }
        if let Err(err) = append_event(&self.dir, &e) {
            tracing::warn!(task = %self.task, error = %err, "could not append an event");
        }
    }

    /// The probe `launch.sh` says failed, when it stopped before the provider for one: its
    /// line from the end of stderr (the task's error names the probe).
    fn readiness_failure(&self, code: Option<i32>) -> Option<String> {
        use crate::task::launcher::{READINESS_EXIT_CODE, READINESS_FAILURE_PREFIX};
        let probes = self.spec.startup_profile.as_ref()?.readiness.probes.len();
        if code != Some(READINESS_EXIT_CODE) || probes == 0 {
            return None;
        }
        let tail = crate::task::outbox_reader::tail_text(
            &self.dir,
            crate::task::task_dir::STDERR_LOG,
            READINESS_TAIL_BYTES_MAX,
        )
        .unwrap_or_default();
        let line = tail
            .lines()
            .rev()
            .find(|l| l.starts_with(READINESS_FAILURE_PREFIX))
            .map(|l| l.trim_start_matches("squadron: ").to_string());
        Some(line.unwrap_or_else(|| {
            format!("a readiness probe failed (launch.sh exited {READINESS_EXIT_CODE})")
        }))
    }

    /// The provider CLI's own account of its run (tool calls, tokens, cost, session), read
    /// from its structured stdout once it exited, as a `provider_summary` event.
    async fn note_provider_summary(&self) {
        let provider = self.spec.agent.provider;
        let outbox = self.dir.outbox_beneath();
        let summary = tokio::task::spawn_blocking(move || {
            let stdout = outbox
                .ok()?
                .read(std::path::Path::new(crate::task::task_dir::STDOUT_LOG))
                .ok()?;
            crate::task::provider_stream::summarize(provider, stdout)
        })
        .await
        .ok()
        .flatten();
        if let Some(summary) = summary {
            let mut event = serde_json::json!({"event": "provider_summary", "provider": provider});
            if let (Some(o), Ok(serde_json::Value::Object(fields))) =
                (event.as_object_mut(), serde_json::to_value(&summary))
            {
                o.extend(fields);
            }
            self.event(event);
        }
    }

    fn checkpoint(&self, f: impl FnOnce(&mut TaskCheckpoint)) {
        if let Err(e) = self.try_checkpoint(f) {
            tracing::warn!(task = %self.task, error = %e, "could not write the checkpoint");
        }
    }

    /// The checkpoint updated by `f`, or why it could not be written: for what a restarted
    /// worker must find, where a lost write is not merely a repeated step.
    fn try_checkpoint(&self, f: impl FnOnce(&mut TaskCheckpoint)) -> Result<(), WorkerError> {
        let path = self.dir.state_json();
        let mut c = TaskCheckpoint::load(&path)
            .ok()
            .flatten()
            .unwrap_or_else(|| {
                TaskCheckpoint::fresh(
                    self.task.get(),
                    self.attempt,
                    TaskState::Staging,
                    self.spec.sandbox.runtime,
                )
            });
        if c.attempt != self.attempt {
            c.attempt = self.attempt;
            c.sandbox = None;
            c.started_at_ms = None;
            c.exit_code = None;
            c.credential_lease = None;
        }
        f(&mut c);
        c.updated_at_ms = squadron_client::now_ms();
        std::fs::create_dir_all(self.dir.root())
            .map_err(|e| WorkerError::io("create the task directory", self.dir.root(), e))?;
        c.store(&path)
    }

    fn load_checkpoint(&self) -> Option<TaskCheckpoint> {
        TaskCheckpoint::load(&self.dir.state_json())
            .ok()
            .flatten()
            .filter(|c| c.attempt == self.attempt)
    }

    /// Reports `from → to` and says where to go next.
    async fn report(
        &self,
        from: TaskState,
        to: TaskState,
        detail: TransitionDetail,
    ) -> Result<Step, WorkerError> {
        // One trace id for the report and its resends; the leader's "command applied" line
        // names it too.
        let trace = squadron_api::TraceId::random();
        let answer = self
            .ctx
            .control
            .transition(trace, self.task, self.attempt, from, to, detail)
            .await?;
        match answer {
            ReportAnswer::Recorded(state) => {
                // The seed's transition log line: task_id, from, to.
                tracing::info!(task_id = %self.task, attempt = self.attempt, from = %from, to = %state, trace_id = %trace, "task transition");
                self.event(serde_json::json!({"event": "transition", "from": from, "to": state}));
                self.checkpoint(|c| c.state = state);
                Ok(if state.is_terminal() {
                    Step::Done
                } else {
                    Step::Next(state)
                })
            }
            ReportAnswer::Refused(why) => {
                // The control plane knows better: re-read and continue from its state if
                // the task is still ours, else stop.
                self.event(serde_json::json!({"event": "report_refused", "from": from, "to": to, "reason": why}));
                let task = self.ctx.control.task(self.task).await?;
                let ours = task.attempt == self.attempt
                    && task.worker.as_ref() == Some(&self.ctx.config.id);
                if !ours || task.state.is_terminal() {
                    tracing::info!(task = %self.task, state = %task.state, trace_id = %trace, "the attempt is no longer ours or has ended");
                    if self.is_project_task() {
                        // Nothing of it may run on: its lease is no longer the task's.
                        self.stop_if_running(0).await;
                        self.destroy_sandbox().await;
                    }
                    return Ok(Step::Done);
                }
                if task.state == from {
                    return Err(WorkerError::Control(format!(
                        "transition {from} → {to} refused: {why}"
                    )));
                }
                Ok(Step::Next(task.state))
            }
        }
    }

    fn staging_options(&self) -> StagingOptions {
        StagingOptions {
            backoff_override_ms: self.ctx.config.backoff_override_ms,
            ..StagingOptions::default()
        }
    }

    async fn staging(&mut self) -> Result<Step, WorkerError> {
        self.ctx.active.insert(self.task);
        if let Err(why) = self.ensure_volume().await {
            return Ok(self.fail(TaskState::Staging, None, why).await);
        }
        if self.is_project_task() {
            // Before the checkpoint below names this attempt: a crash in between must not
            // hand an earlier attempt's output to this one.
            let earlier_attempt = TaskCheckpoint::load(&self.dir.state_json())
                .ok()
                .flatten()
                .is_some_and(|c| c.attempt != self.attempt);
            if let Err(e) = self.project_dirs(earlier_attempt) {
                return Ok(self.fail(TaskState::Staging, None, e.to_string()).await);
            }
        }
        self.checkpoint(|c| c.state = TaskState::Staging);
        // Checked here too: a task assigned before the control plane had this policy, or by
        // a control plane that ignored it, still does not run.
        if let Some(refused) = self.ctx.config.policy.refusal(&self.spec) {
            let why = format!(
                "this worker's policy refuses {}: {}",
                refused.field, refused.reason
            );
            return Ok(self.fail(TaskState::Staging, None, why).await);
        }
        if self.is_project_task() {
            // Its work tree is the profile's worktree, made at PROVISIONING: nothing to clone.
            return self
                .report(
                    TaskState::Staging,
                    TaskState::Provisioning,
                    TransitionDetail::default(),
                )
                .await;
        }
        let limit = Duration::from_millis(self.spec.lifecycle.stage_timeout_ms);
        let opts = self.staging_options();
        let staged = tokio::time::timeout(
            limit,
            stage(&self.dir, self.task, self.attempt, &self.spec, &opts),
        )
        .await;
        let report = match staged {
            Err(_) => {
                return Ok(self
                    .fail(
                        TaskState::Staging,
                        None,
                        format!(
                            "stage timeout: staging took longer than {} ms",
                            limit.as_millis()
                        ),
                    )
                    .await)
            }
            Ok(Err(e)) => return Ok(self.fail(TaskState::Staging, None, e.to_string()).await),
            Ok(Ok(r)) => r,
        };
        self.checkpoint(|c| c.workdir = Some(report.workdir.clone()));
        self.report(
            TaskState::Staging,
            TaskState::Provisioning,
            TransitionDetail::default(),
        )
        .await
    }

    /// A project task's own directories: its launch files and its outbox, an earlier
    /// attempt's gone first (they hold that attempt's output).
    fn project_dirs(&self, earlier_attempt: bool) -> Result<(), WorkerError> {
        if earlier_attempt {
            for path in [self.dir.run(), self.dir.outbox()] {
                crate::support::remove_path(&path)?;
            }
        }
        self.dir.make_attempt_dirs()
    }

    /// The launch for this attempt; deterministic, so it is rebuilt after a restart.
    async fn launch_spec(&self) -> Result<LaunchSpec, WorkerError> {
        let workdir = if self.is_project_task() {
            match spec_subpath(&self.spec) {
                subpath if subpath.is_empty() => INBOX_MOUNT.to_string(),
                subpath => format!("{INBOX_MOUNT}/{subpath}"),
            }
        } else {
            let opts = self.staging_options();
            stage(&self.dir, self.task, self.attempt, &self.spec, &opts)
                .await?
                .workdir
        };
        let plan = prepare_launch(
            &self.dir,
            self.attempt,
            &self.spec,
            &workdir,
            &self.ctx.env_allowlist,
        )?;
        let credentials = CredentialSession::of(
            &self.ctx.config.data_dir,
            self.task,
            self.attempt,
            &self.spec,
        );
        let mut env = plan.env;
        if let Some(session) = &credentials {
            env.extend(session.env());
        }
        Ok(LaunchSpec {
            task: self.task,
            attempt: self.attempt,
            dir: self.dir.clone(),
            argv: plan.argv,
            workdir: plan.workdir,
            env,
            limits: SandboxLimits {
                disk_bytes: Some(self.disk_quota_bytes()),
                ..self
                    .ctx
                    .config
                    .sandbox_defaults
                    .limits(self.spec.sandbox.cpus, self.spec.sandbox.memory_bytes)
            },
            network: self.spec.sandbox.network_mode,
            full_control: self.spec.sandbox.full_control,
            global_dir: self.ctx.config.global_dir.clone(),
            credentials,
            egress: None,
            keep_after_exit: self.spec.lifecycle.failure_action == FailureAction::Preserve,
        })
    }

    async fn sandbox(
        &self,
        runtime: &Arc<dyn Runtime>,
    ) -> Result<Option<SandboxHandle>, WorkerError> {
        runtime.adopt(self.task, self.attempt, &self.dir).await
    }

    async fn provisioning(&mut self) -> Result<Step, WorkerError> {
        self.ctx.active.insert(self.task);
        let runtime = self.runtime()?;
        let spec = self.launch_spec().await?;
        if let Some(session) = &spec.credentials {
            session.prepare()?;
        }
        let limit = Duration::from_millis(self.spec.lifecycle.provision_timeout_ms);
        if runtime.runs_agent() {
            self.prepare_agent(&runtime, &spec, limit).await?;
        }
        let pauses = retry::table(
            &self.spec.lifecycle.retries.provision,
            self.ctx.config.backoff_override_ms,
        );
        let provisioned = provision_sandbox(
            runtime.as_ref(),
            &spec,
            limit,
            pauses,
            tokio::time::sleep,
            |retry, error, delay_ms| {
                self.event(serde_json::json!({"event": "provision_retry", "try": retry, "error": error.to_string(), "delay_ms": delay_ms}));
            },
        )
        .await;
        let handle = match provisioned {
            Ok(h) => h,
            Err(ProvisionFailure::Adopt(e)) => return Err(e),
            Err(ProvisionFailure::Failed(e)) => {
                return Ok(self
                    .fail(
                        TaskState::Provisioning,
                        None,
                        format!("provisioning failed: {e}"),
                    )
                    .await)
            }
            Err(ProvisionFailure::TimedOut) => {
                return Ok(self
                    .fail(
                        TaskState::Provisioning,
                        None,
                        format!(
                            "provision timeout: no sandbox after {} ms",
                            limit.as_millis()
                        ),
                    )
                    .await)
            }
        };
        self.checkpoint(|c| c.sandbox = Some(handle.id.clone()));
        self.event(serde_json::json!({"event": "provisioned", "sandbox": handle.id}));
        if runtime.runs_agent() {
            if let Err(why) = self.await_agent(&runtime, &handle, &spec, limit).await {
                return Ok(self.fail(TaskState::Provisioning, None, why).await);
            }
        }
        self.report(
            TaskState::Provisioning,
            TaskState::Ready,
            TransitionDetail::default(),
        )
        .await
    }

    async fn ready(&mut self) -> Result<Step, WorkerError> {
        self.ctx.active.insert(self.task);
        let runtime = self.runtime()?;
        let Some(handle) = self.sandbox(&runtime).await? else {
            return Ok(self
                .fail(
                    TaskState::Ready,
                    None,
                    "the sandbox vanished before the provider started".into(),
                )
                .await);
        };
        // A provider that already started (the worker died right after starting it) is not
        // started a second time. A sandbox agent starts it once RUNNING is committed, so
        // the credentials are in place before that report.
        if runtime.runs_agent() {
            let mut spec = self.launch_spec().await?;
            self.reopen_relay(&runtime, &spec, &handle).await?;
            if self
                .load_checkpoint()
                .and_then(|c| c.started_at_ms)
                .is_none()
            {
                if let Err(why) = self.take_credentials(runtime.as_ref(), &mut spec).await {
                    return Ok(self.fail(TaskState::Ready, None, why).await);
                }
                if let Some(egress) = &spec.egress {
                    if let Err(e) = self.serve_egress(runtime.as_ref(), &handle, egress).await {
                        let why = format!("credentials: serving egress injection: {e}");
                        return Ok(self.fail(TaskState::Ready, None, why).await);
                    }
                }
            }
        } else if runtime.status(&handle).await? == RunStatus::Created {
            let mut spec = self.launch_spec().await?;
            if let Err(why) = self.take_credentials(runtime.as_ref(), &mut spec).await {
                return Ok(self.fail(TaskState::Ready, None, why).await);
            }
            runtime.start(&handle, &spec).await?;
            let now = squadron_client::now_ms();
            self.checkpoint(|c| c.started_at_ms = Some(now));
            self.event(serde_json::json!({"event": "started", "sandbox": handle.id}));
        }
        if self
            .load_checkpoint()
            .and_then(|c| c.started_at_ms)
            .is_none()
        {
            let now = squadron_client::now_ms();
            self.checkpoint(|c| c.started_at_ms = Some(now));
        }
        self.report(
            TaskState::Ready,
            TaskState::Running,
            TransitionDetail::default(),
        )
        .await
    }

    async fn running(&mut self) -> Result<Step, WorkerError> {
        self.ctx.active.insert(self.task);
        let runtime = self.runtime()?;
        let Some(handle) = self.sandbox(&runtime).await? else {
            return Ok(self
                .fail(
                    TaskState::Running,
                    None,
                    "the sandbox vanished while the task ran".into(),
                )
                .await);
        };
        if runtime.runs_agent() {
            self.reopen_relay(&runtime, &self.launch_spec().await?, &handle)
                .await?;
        }
        self.resume_credentials(runtime.as_ref(), &handle).await;
        let started = self
            .load_checkpoint()
            .and_then(|c| c.started_at_ms)
            .unwrap_or_else(squadron_client::now_ms);
        let mut progress = Progress::new(&self.dir);
        let (code, end) = self
            .monitor(&runtime, &handle, started, &mut progress)
            .await?;
        if runtime.runs_agent() {
            self.note_agent_exit(code).await;
        }
        self.note_provider_summary().await;
        progress.last = progress.counter.look();
        if progress.unreported() {
            self.ctx
                .control
                .progress(
                    self.task,
                    self.attempt,
                    progress.last,
                    progress.provider.clone(),
                )
                .await;
        }
        self.checkpoint(|c| c.exit_code = code);
        self.end_run(code, end).await
    }

    /// What a finished run reports: its exit, or the interruption (cancel, timeout, hang,
    /// quota) that ended it.
    async fn end_run(&mut self, code: Option<i32>, end: RunEnd) -> Result<Step, WorkerError> {
        if matches!(end, RunEnd::Exited) {
            if let Some(why) = self.readiness_failure(code) {
                return Ok(self.fail(TaskState::Running, code, why).await);
            }
        }
        // A provider that exits on ENOSPC ends because of the quota: say so, not just its code.
        let end = match end {
            RunEnd::Exited
                if self.volume().exhausted()
                    && !code.is_some_and(|c| self.spec.lifecycle.is_success_exit_code(c)) =>
            {
                RunEnd::Interrupted(Interruption::DiskFull(self.disk_quota_bytes()))
            }
            other => other,
        };
        match end {
            RunEnd::Exited => {
                let detail = TransitionDetail {
                    exit_code: code,
                    ..TransitionDetail::default()
                };
                self.report(TaskState::Running, TaskState::Completing, detail)
                    .await
            }
            RunEnd::Interrupted(Interruption::Cancelled(reason)) => {
                Ok(self.cancel_now(TaskState::Running, reason).await)
            }
            RunEnd::Interrupted(Interruption::TimedOut(ms)) => Ok(self
                .fail(
                    TaskState::Running,
                    code,
                    format!("task timeout: still running after {ms} ms"),
                )
                .await),
            RunEnd::Interrupted(Interruption::Hung(ms)) => Ok(self
                .fail(
                    TaskState::Running,
                    code,
                    format!("hang detected: no output for {ms} ms"),
                )
                .await),
            RunEnd::Interrupted(Interruption::DiskFull(bytes)) => {
                let why = self.disk_full_error(bytes);
                Ok(self.fail(TaskState::Running, code, why).await)
            }
            RunEnd::Vanished => Ok(self
                .fail(
                    TaskState::Running,
                    code,
                    "the sandbox vanished while the task ran".to_string(),
                )
                .await),
        }
    }

    /// Watches the running provider until it exits, vanishes or is interrupted (cancel,
    /// task timeout, hang), sending output counters on the way; an interrupted provider is
    /// terminated with the cancel grace. Returns its exit code, when it has one.
    async fn monitor(
        &mut self,
        runtime: &Arc<dyn Runtime>,
        handle: &SandboxHandle,
        started: u64,
        progress: &mut Progress,
    ) -> Result<(Option<i32>, RunEnd), WorkerError> {
        let lifecycle = self.spec.lifecycle.clone();
        let monitor = Duration::from_millis(self.ctx.config.monitor_interval_ms);
        let mut live = ProviderLive::resume(&self.dir, self.spec.agent.provider, self.attempt);
        loop {
            let now = squadron_client::now_ms();
            self.follow_provider(&mut live, progress, false).await;
            let counts = progress.look(now);
            if progress.due(now, self.ctx.config.progress_interval_ms)
                && self
                    .ctx
                    .control
                    .progress(self.task, self.attempt, counts, progress.provider.clone())
                    .await
            {
                progress.sent(counts, now);
            }
            match runtime.status(handle).await? {
                RunStatus::Exited { code } => {
                    self.follow_provider(&mut live, progress, true).await;
                    return Ok((Some(code), RunEnd::Exited));
                }
                RunStatus::Vanished => {
                    self.follow_provider(&mut live, progress, true).await;
                    return Ok((None, RunEnd::Vanished));
                }
                RunStatus::Created | RunStatus::Running => {}
            }
            let interruption = if let Some(reason) = self.cancel_reason() {
                Some(Interruption::Cancelled(reason))
            } else if now.saturating_sub(started) > lifecycle.timeout_ms {
                Some(Interruption::TimedOut(lifecycle.timeout_ms))
            } else if now.saturating_sub(progress.last_output_ms) > lifecycle.hang_timeout_ms {
                Some(Interruption::Hung(lifecycle.hang_timeout_ms))
            } else if self.volume().exhausted() {
                Some(Interruption::DiskFull(self.disk_quota_bytes()))
            } else {
                None
            };
            if let Some(i) = interruption {
                let grace = Duration::from_millis(lifecycle.cancel_grace_ms);
                self.event(serde_json::json!({"event": "terminating", "why": format!("{i:?}"), "grace_ms": lifecycle.cancel_grace_ms}));
                runtime.terminate(handle, grace).await?;
                let code = match runtime.status(handle).await? {
                    RunStatus::Exited { code } => Some(code),
                    _ => None,
                };
                self.follow_provider(&mut live, progress, true).await;
                return Ok((code, RunEnd::Interrupted(i)));
            }
            tokio::select! {
                _ = tokio::time::sleep(monitor) => {}
                _ = self.cancel.changed() => {}
            }
        }
    }

    /// The tool calls the provider's stream tells since the last look, as events, and its
    /// running account for the next progress report.
    /// With `ended`, the provider exited: the rest of its stream is read.
    async fn follow_provider(
        &self,
        live: &mut Option<ProviderLive>,
        progress: &mut Progress,
        ended: bool,
    ) {
        let Some(mut following) = live.take() else {
            return;
        };
        let dir = self.dir.clone();
        // Reads and parses up to a few MiB and writes the record: off the async threads.
        let looked = tokio::task::spawn_blocking(move || {
            let events = if ended {
                following.drain(&dir)
            } else {
                following.look(&dir)
            };
            (following, events)
        })
        .await;
        let Ok((following, events)) = looked else {
            tracing::warn!(task = %self.task, "following the provider's stream failed; it is not followed further");
            return;
        };
        for event in events {
            self.event(event);
        }
        progress.provider = following.progress();
        *live = Some(following);
    }

    fn run_facts(&self, exit_code: Option<i32>) -> RunFacts {
        let cp = self.load_checkpoint();
        let counts = OutputCounter::new(&self.dir).look();
        let now = squadron_client::now_ms();
        RunFacts {
            attempt: self.attempt,
            exit_code,
            started_at_ms: cp.as_ref().and_then(|c| c.started_at_ms).unwrap_or(now),
            finished_at_ms: now,
            stdout_bytes: counts.stdout_bytes,
            stderr_bytes: counts.stderr_bytes,
            lines: counts.lines,
            events: counts.events,
            runtime: self.spec.sandbox.runtime,
        }
    }

    /// Collects what exists; a failure to collect is recorded, not fatal.
    async fn collect_what_exists(&self, exit_code: Option<i32>) -> (Vec<String>, Option<String>) {
        let source = match self.collect_source() {
            Ok(Some(source)) => source,
            Ok(None) => return (Vec::new(), None),
            Err(e) => return (Vec::new(), Some(format!("artifact collection failed: {e}"))),
        };
        if let Err(why) = self.hold_sandbox_still().await {
            return (
                Vec::new(),
                Some(format!("artifact collection failed: {why}")),
            );
        }
        let facts = self.run_facts(exit_code);
        match collect(&self.dir, self.task, &self.spec, &facts, &source).await {
            Ok(r) => (r.names(), None),
            Err(e) => (Vec::new(), Some(format!("artifact collection failed: {e}"))),
        }
    }

    /// Where the attempt's work lies, if it got as far as having a work tree.
    fn collect_source(&self) -> Result<Option<CollectSource>, WorkerError> {
        if !self.is_project_task() {
            return Ok(self
                .dir
                .inbox()
                .join(".git")
                .exists()
                .then_some(CollectSource::Inbox));
        }
        let (Some(project), Some(run)) = (
            &self.project,
            ProjectRuntime::record(&self.dir, self.attempt)?,
        ) else {
            return Ok(None);
        };
        Ok(Some(CollectSource::ProfileWorktree(
            project.collect_source(&run),
        )))
    }

    /// Nothing in the sandbox may run while the worker reads its files (it could swap one for
    /// a link in between): a sandbox that still runs — a guest whose exit code was its own
    /// word, one resumed for break-glass before a worker restart — is stopped (a guest kept
    /// for break-glass, paused) first, and one whose state is unknown is not read.
    async fn hold_sandbox_still(&self) -> Result<(), String> {
        let Ok(runtime) = self.runtime() else {
            return Ok(());
        };
        let handle = match self.sandbox(&runtime).await {
            Ok(Some(handle)) => handle,
            Ok(None) => return Ok(()),
            // Adoption fails for a sandbox that runs on (its proxy not served again, say).
            Err(e) => return Err(format!("the sandbox's state is unknown: {e}")),
        };
        let state = |s: Result<RunStatus, WorkerError>| match s {
            Ok(RunStatus::Running) => Err("the sandbox still runs".to_string()),
            Ok(_) => Ok(()),
            Err(e) => Err(format!("the sandbox's state is unknown: {e}")),
        };
        if state(runtime.status(&handle).await).is_ok() {
            return Ok(());
        }
        let _ = runtime.terminate(&handle, Duration::ZERO).await;
        state(runtime.status(&handle).await)
            .map_err(|why| format!("{why}; its outputs are not read"))
    }

    async fn completing(&mut self) -> Result<Step, WorkerError> {
        self.ctx.active.remove(self.task);
        let task = self.ctx.control.task(self.task).await?;
        let code = task
            .exit_code
            .or_else(|| self.load_checkpoint().and_then(|c| c.exit_code));
        let (artifacts, collect_error) = self.collect_what_exists(code).await;
        let success = code.is_some_and(|c| self.spec.lifecycle.is_success_exit_code(c));
        if success && collect_error.is_none() {
            if let Some(e) = self.destroy_sandbox().await {
                if self.is_project_task() {
                    return Ok(self.hold_end(e));
                }
            }
            let detail = TransitionDetail {
                exit_code: code,
                error: None,
                artifacts,
            };
            return self
                .report(TaskState::Completing, TaskState::Completed, detail)
                .await;
        }
        let mut why = collect_error.unwrap_or_else(|| match code {
            Some(c) => format!("the provider exited with code {c}"),
            None => "the provider's exit code is unknown".into(),
        });
        if let Some(hit) = self.limits_hit().await {
            why = format!("{why}: {hit}");
        }
        Ok(self
            .finish_failed(TaskState::Completing, code, why, artifacts)
            .await)
    }

    /// Which of the sandbox's limits stopped something, while it still exists.
    async fn limits_hit(&self) -> Option<String> {
        let runtime = self.runtime().ok()?;
        let handle = self.sandbox(&runtime).await.ok().flatten()?;
        runtime.limits_hit(&handle).await
    }

    /// A project task's generation reaped with proof — tried again and again, the pauses
    /// growing to [`PROJECT_REAP_PAUSE_MS_MAX`], for as long as it takes: the task's end, which
    /// releases its lease's slot, waits for it (`end_held` says so after the first tries).
    /// The error only when the generation cannot be reached at all — never "nothing to reap"
    /// unless PROVISIONING never recorded a generation.
    async fn reap_project_generation(&self) -> Option<String> {
        let runtime = match self.runtime() {
            Ok(runtime) => runtime,
            Err(e) => return Some(e.to_string()),
        };
        let handle = match self.sandbox(&runtime).await {
            Ok(Some(handle)) => handle,
            Ok(None) => return None,
            Err(e) => return Some(e.to_string()),
        };
        let mut pause_ms = PROJECT_REAP_PAUSE_MS;
        let mut tried: u32 = 0;
        loop {
            tried = tried.saturating_add(1);
            match runtime.destroy(&handle).await {
                Ok(report) => {
                    self.note_reaped(&report);
                    return None;
                }
                Err(e) if tried <= PROJECT_REAP_TRIES_MAX => {
                    let error = e.to_string();
                    self.event(
                        serde_json::json!({"event": "reap_failed", "error": error, "try": tried}),
                    );
                    if tried == PROJECT_REAP_TRIES_MAX {
                        tracing::error!(task = %self.task, %error, "the generation is not proven quiescent; the task's end waits");
                        self.event(serde_json::json!({"event": "end_held", "error": error}));
                    }
                }
                Err(e) => {
                    tracing::warn!(task = %self.task, error = %e, tried, "the generation is still not proven quiescent");
                }
            }
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            if tried >= PROJECT_REAP_TRIES_MAX {
                pause_ms = (pause_ms * 2).min(PROJECT_REAP_PAUSE_MS_MAX);
            }
        }
    }

    /// A project task's end releases its lease and the slot with it (INV-5): it is not
    /// reported while its generation cannot even be reached. The driver stops here, the task
    /// stays where it is and the lease keeps its slot; a later life of the driver (the
    /// worker's restart) tries again.
    fn hold_end(&self, why: String) -> Step {
        tracing::error!(task = %self.task, error = %why, "the generation cannot be reached; the task's end waits");
        self.event(serde_json::json!({"event": "end_held", "error": why}));
        Step::Done
    }

    fn note_reaped(&self, report: &ReapReport) {
        self.event(serde_json::json!({"event": "reaped", "sandbox": report.sandbox, "populated": report.populated, "observed_at_ms": report.observed_at_ms, "detail": report.detail}));
    }

    async fn destroy_sandbox(&self) -> Option<String> {
        if self.is_project_task() {
            return self.reap_project_generation().await;
        }
        let runtime = self.runtime().ok()?;
        let handle = self.sandbox(&runtime).await.ok().flatten()?;
        match runtime.destroy(&handle).await {
            Ok(report) => {
                self.note_reaped(&report);
                None
            }
            Err(e) => {
                self.event(serde_json::json!({"event": "reap_failed", "error": e.to_string()}));
                Some(e.to_string())
            }
        }
    }

    /// A failure at `from`: terminate what runs, collect what exists, then destroy or
    /// preserve the sandbox as the manifest says. Before RUNNING no provider was started, so
    /// there is no work to let end gracefully: a guest stuck in its boot is powered off at
    /// once instead of after the cancel grace.
    async fn fail(&mut self, from: TaskState, exit_code: Option<i32>, why: String) -> Step {
        let grace_ms = match from {
            TaskState::Provisioning => 0,
            _ => self.spec.lifecycle.cancel_grace_ms,
        };
        self.stop_if_running(grace_ms).await;
        let (artifacts, _) = self.collect_what_exists(exit_code).await;
        self.finish_failed(from, exit_code, why, artifacts).await
    }

    async fn finish_failed(
        &mut self,
        from: TaskState,
        exit_code: Option<i32>,
        why: String,
        artifacts: Vec<String>,
    ) -> Step {
        self.ctx.active.remove(self.task);
        let mut error = why;
        let mut to = TaskState::Failed;
        // A project task's work stays in the profile's worktree anyway; its generation is
        // reaped like any other.
        let preserved = if self.spec.lifecycle.failure_action == FailureAction::Preserve
            && !self.is_project_task()
        {
            match self.runtime() {
                Ok(runtime) => match self.sandbox(&runtime).await {
                    Ok(Some(h)) => {
                        if let Err(e) = runtime.preserved(&h).await {
                            tracing::warn!(task = %self.task, error = %e, "the preserved sandbox could not be resumed");
                        }
                        Some(runtime.break_glass(&h).await)
                    }
                    _ => None,
                },
                Err(_) => None,
            }
        } else {
            None
        };
        match preserved {
            Some(line) => {
                to = TaskState::FailedPreserved;
                error = format!(
                    "{error}; sandbox preserved for debugging — break-glass access: {line}"
                );
                self.event(serde_json::json!({"event": "preserved", "break_glass": line}));
            }
            None => {
                if let Some(e) = self.destroy_sandbox().await {
                    if self.is_project_task() {
                        return self.hold_end(e);
                    }
                    error = format!("{error}; destroying the sandbox failed: {e}");
                }
            }
        }
        self.checkpoint(|c| c.error = Some(truncate(&error)));
        let detail = TransitionDetail {
            exit_code: if from == TaskState::Running {
                exit_code
            } else {
                None
            },
            error: Some(truncate(&error)),
            artifacts,
        };
        match self.report(from, to, detail).await {
            Ok(step) => step,
            Err(e) => {
                tracing::error!(task = %self.task, error = %e, "could not report the failure");
                Step::Done
            }
        }
    }

    /// CANCELLED: SIGTERM, grace, SIGKILL, collect, destroy.
    /// SIGTERM, grace, SIGKILL for the attempt's provider if it still runs; its exit code
    /// when it has one.
    async fn stop_if_running(&self, grace_ms: u64) -> Option<i32> {
        let runtime = self.runtime().ok()?;
        let handle = self.sandbox(&runtime).await.ok().flatten()?;
        if matches!(runtime.status(&handle).await, Ok(RunStatus::Running)) {
            let grace = Duration::from_millis(grace_ms);
            let _ = runtime.terminate(&handle, grace).await;
        }
        match runtime.status(&handle).await {
            Ok(RunStatus::Exited { code }) => Some(code),
            _ => None,
        }
    }

    async fn cancel_now(&mut self, from: TaskState, reason: String) -> Step {
        let code = self
            .stop_if_running(self.spec.lifecycle.cancel_grace_ms)
            .await;
        self.ctx.active.remove(self.task);
        let (artifacts, _) = self.collect_what_exists(code).await;
        let destroy_error = self.destroy_sandbox().await;
        if let (Some(e), true) = (&destroy_error, self.is_project_task()) {
            return self.hold_end(e.clone());
        }
        self.event(serde_json::json!({"event": "cancelled", "reason": reason}));
        let detail = TransitionDetail {
            exit_code: None,
            error: Some(truncate(&match destroy_error {
                None => format!("cancelled: {reason}"),
                Some(e) => format!("cancelled: {reason}; destroying the sandbox failed: {e}"),
            })),
            artifacts,
        };
        match self.report(from, TaskState::Cancelled, detail).await {
            Ok(step) => step,
            Err(e) => {
                tracing::error!(task = %self.task, error = %e, "could not report the cancellation");
                Step::Done
            }
        }
    }
}

fn truncate(s: &str) -> String {
    if s.len() <= ERROR_TEXT_BYTES_MAX {
        return s.to_string();
    }
    let mut end = ERROR_TEXT_BYTES_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
