//! The worker process: registers, heartbeats, serves output, watches its assignments on the
//! leader and runs one [`TaskDriver`] per assigned attempt. A restarted worker gets every
//! assigned, unfinished task replayed on the stream and resumes each from its confirmed state.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, Retryable};
use squadron_core::ids::{Generation, LeaseId, TaskId};
use squadron_core::manifest::TaskSpec;
use squadron_core::task::TaskState;
use squadron_proto::v1 as pb;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::agent::runtime::AgentRuntime;
use crate::agent::supervisor::AgentSupervisor;
use crate::config::WorkerConfig;
use crate::control_link::ControlLink;
use crate::error::WorkerError;
use crate::output_server::{self, ActiveTasks};
use crate::retry;
use crate::runtime::probe::RuntimeSet;
use crate::runtime::process::ProcessRuntimeConfig;
use crate::task::agent_relay::AgentRelays;
use crate::task::driver::{DriverContext, TaskDriver, TaskLease};
use crate::task::env_allowlist::EnvAllowlist;
use squadron_pki::{serve_tls, server_config, ClientAuth, NodesOnly};

/// Pause before reopening a broken assignment stream (and between adoption attempts);
/// doubled up to the max.
pub(crate) const WATCH_RETRY_MS_MIN: u64 = 200;
pub(crate) const WATCH_RETRY_MS_MAX: u64 = 5_000;
/// Pause between registration attempts at start-up.
pub(crate) const REGISTER_RETRY_MS: u64 = 500;
/// Most drivers tracked at once (assigned attempts, including finished ones not yet pruned).
pub(crate) const DRIVERS_MAX: usize = 4_096;
/// Largest task spec accepted on the stream, as encoded. A larger one is ignored like an
/// unreadable one (rather than left to the stream's decoding limit, which would break the
/// stream, and the replay after the reconnect would break it again).
pub(crate) const SPEC_BYTES_MAX: usize = 1024 * 1024;

struct DriverSlot {
    attempt: u32,
    cancel: watch::Sender<Option<String>>,
    handle: JoinHandle<()>,
}

/// A running worker; dropping it does not stop it, [`RunningWorker::shutdown`] does.
#[derive(Debug)]
pub struct RunningWorker {
    pub url: String,
    tasks: Vec<JoinHandle<()>>,
    runtimes: RuntimeSet,
}

/// The longest a stop waits for the runtimes to remove what no task holds.
const STOP_DRAIN_MS_MAX: u64 = 15_000;

impl RunningWorker {
    /// Stops the worker's loops. Sandboxes keep running; a restarted worker adopts them.
    pub fn shutdown(self) {
        for t in self.tasks {
            t.abort();
        }
    }

    /// A stop on a signal: the loops end, then each runtime removes what holds no task (the
    /// Docker runtime's idle warm containers), within `STOP_DRAIN_MS_MAX`. Sandboxes of tasks
    /// keep running, as after `shutdown`.
    pub async fn stop(self) {
        let runtimes = self.runtimes.clone();
        self.shutdown();
        let drains = runtimes.kinds().filter_map(|k| runtimes.get(k).cloned());
        let drained = futures_util::future::join_all(drains.map(|r| async move {
            if let Err(e) = r.drain_idle().await {
                tracing::warn!(runtime = ?r.kind(), error = %e, "idle sandboxes not removed at stop");
            }
        }));
        if tokio::time::timeout(Duration::from_millis(STOP_DRAIN_MS_MAX), drained)
            .await
            .is_err()
        {
            tracing::warn!(
                "idle sandboxes not all removed within {STOP_DRAIN_MS_MAX} ms of the stop"
            );
        }
    }
}

/// Starts a worker with the given runtimes: binds its output server, registers (retrying
/// until a control node answers), and spawns the heartbeat and assignment loops.
pub async fn start(
    config: WorkerConfig,
    runtimes: RuntimeSet,
) -> Result<RunningWorker, WorkerError> {
    config.validate()?;
    // The release evidence names this binary's digest: hashed now, off the runtime.
    tokio::task::spawn_blocking(squadron_pki::own_binary_sha256);
    let mut config = config;
    config.runtimes = runtimes.kinds().collect();
    if config.runtimes.is_empty() {
        return Err(WorkerError::Invalid {
            field: "runtimes".into(),
            message: "no runtime is available on this host".into(),
        });
    }
    let tls = config.tls.clone().ok_or_else(|| WorkerError::Invalid {
        field: "tls".into(),
        message: "a worker needs its certificate and the cluster CA (--cert-dir)".into(),
    })?;
    prepare_data_dir(&config).await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| WorkerError::io("binding the output server", config.data_dir.clone(), e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| WorkerError::io("reading the bound address", config.data_dir.clone(), e))?;
    config.listen = bound;
    let active = ActiveTasks::default();
    let redactions = crate::task::credential_session::LiveRedactions::default();
    let control = ControlLink::new(config.clone(), tls.clone())?;
    let agents = agent_supervisor(&config, &control);
    let mut app = output_server::router(
        config.data_dir.clone(),
        active.clone(),
        redactions.clone(),
        runtimes.clone(),
        agents.clone(),
    );
    if let Some(s) = &agents {
        app = app.merge(crate::agent::api::router(s.clone(), runtimes.clone()));
    }
    let server_config =
        server_config(&tls.trust, &tls.cert, ClientAuth::Required).map_err(|e| {
            WorkerError::Invalid {
                field: "tls".into(),
                message: e.to_string(),
            }
        })?;
    // Only control nodes (which relay for operators) may read output or drive agents.
    let server = tokio::spawn(serve_tls(
        listener,
        server_config,
        NodesOnly::new(app),
        std::future::pending(),
        Default::default(),
    ));

    let env_allowlist = EnvAllowlist::new(config.env_allowlist.iter().cloned())?;
    (|| control.register())
        .retry(retry::constant(REGISTER_RETRY_MS, None))
        .notify(|e, _| tracing::warn!(error = %e, "registration failed; retrying"))
        .await?;
    tracing::info!(worker = %config.id, url = %config.advertised_url(), runtimes = ?config.runtimes, "worker registered");
    let url = config.advertised_url();
    let ctx_runtimes = runtimes.clone();
    let ctx = Arc::new(DriverContext {
        config: config.clone(),
        control: control.clone(),
        runtimes,
        active,
        redactions,
        env_allowlist,
        relays: AgentRelays::for_link(control.clone(), &config.control),
        agents: agents.clone(),
    });
    let heartbeat = tokio::spawn(heartbeat_loop(
        control.clone(),
        config.heartbeat_interval_ms,
    ));
    let watcher = tokio::spawn(watch_loop(ctx));
    let renewal = tokio::spawn(crate::cert_renewal::renewal_loop(
        config.id.clone(),
        tls.clone(),
        control.clone(),
        config.advertised_host().into_iter().collect(),
    ));
    let retention = tokio::spawn(output_retention_loop(
        config.data_dir.clone(),
        config.output_retention.clone(),
    ));
    let mut tasks = vec![server, heartbeat, watcher, renewal, retention];
    if let Some(s) = agents {
        tasks.push(tokio::spawn(adopt_agents(s.clone())));
        tasks.extend(s.spawn_loops());
    }
    Ok(RunningWorker {
        url,
        tasks,
        runtimes: ctx_runtimes,
    })
}

/// The data directory before anything runs: made, with what an earlier life left cleaned up
/// (credential values, loop mounts of ended tasks), and the disk quota's precondition checked.
async fn prepare_data_dir(config: &WorkerConfig) -> Result<(), WorkerError> {
    std::fs::create_dir_all(config.data_dir.join("tasks"))
        .map_err(|e| WorkerError::io("creating the data directory", &config.data_dir, e))?;
    if config.disk_quota && !crate::task::task_volume::may_mount() {
        return Err(WorkerError::Invalid {
            field: "disk_quota".into(),
            message: "task disk quotas loop-mount an image per task, which needs root: run the \
                      worker as root, or pass --no-disk-quota to run tasks without one"
                .into(),
        });
    }
    let data_dir = config.data_dir.clone();
    let (wiped, retired) = tokio::task::spawn_blocking(move || {
        // Credential values never outlive the worker life that was handed them (INV-13).
        let wiped = crate::task::credential_session::CredentialSession::sweep(&data_dir);
        // Ended tasks hold no loop device past the life that ran them.
        let retired = crate::task::task_volume::TaskVolume::sweep(&data_dir);
        // Project sandboxes' files are where the output server looks for them.
        crate::agent::project_sandbox::ProjectVolume::remount_all(&data_dir);
        // Every ended task's files age from here on, whether or not its driver said so.
        let recorded = crate::task::output_retention::record_unrecorded(&data_dir);
        if !recorded.is_empty() {
            tracing::info!(tasks = ?recorded, "recorded the retention of ended tasks a driver left unrecorded");
        }
        (wiped, retired)
    })
    .await
    .map_err(|e| WorkerError::DiskQuota(format!("the start-up sweep failed: {e}")))?;
    if !wiped.is_empty() {
        tracing::info!(?wiped, "wiped credential sessions left by an earlier run");
    }
    if !retired.is_empty() {
        tracing::info!(?retired, "retired task volumes left by an earlier run");
    }
    Ok(())
}

/// The agent supervisor, when agents are configured and this host can run the process
/// runtime; otherwise the reason is logged and the worker runs tasks only.
fn agent_supervisor(config: &WorkerConfig, control: &ControlLink) -> Option<AgentSupervisor> {
    let mut agents = config.agents.clone()?;
    agents.repository_sources = config.policy.repository_sources.clone();
    agents.project_disk_bytes = config
        .disk_quota
        .then_some(config.sandbox_defaults.project_disk_bytes);
    agents.egress_ca = config.egress_ca.clone();
    // Checked when the worker started (the task drivers use the same list).
    if let Ok(allowed) = EnvAllowlist::new(config.env_allowlist.iter().cloned()) {
        agents.inherited_env = allowed.resolve();
    }
    let made = ProcessRuntimeConfig::for_worker(config)
        .and_then(AgentRuntime::new)
        .and_then(|runtime| {
            AgentSupervisor::new(
                config.id.clone(),
                config.data_dir.clone(),
                agents,
                config.sandbox_defaults,
                runtime,
                control.clone(),
            )
        });
    match made {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "agent profiles cannot run on this worker");
            None
        }
    }
}

/// Adopts the attempts of the leases this worker holds, retrying until the control plane
/// answers.
async fn adopt_agents(supervisor: AgentSupervisor) {
    let adopted = (|| supervisor.adopt_all())
        .retry(retry::doubling(
            WATCH_RETRY_MS_MIN,
            WATCH_RETRY_MS_MAX,
            None,
        ))
        .notify(|e, _| tracing::warn!(error = %e, "cannot adopt agent attempts yet"))
        .await;
    match adopted {
        Ok(0) => {}
        Ok(n) => tracing::info!(adopted = n, "agent attempts adopted after restart"),
        // Unreachable: the pauses never run out.
        Err(e) => tracing::error!(error = %e, "agent attempts not adopted"),
    }
}

/// Removes ended tasks' files as their retention classes' ages run out.
async fn output_retention_loop(data_dir: PathBuf, retention: crate::OutputRetention) {
    let mut tick = tokio::time::interval(Duration::from_millis(retention.sweep_interval_ms()));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (dir, r) = (data_dir.clone(), retention.clone());
        let swept = tokio::task::spawn_blocking(move || {
            crate::task::output_retention::sweep(&dir, &r, crate::support::now_ms())
        })
        .await;
        match swept {
            Ok(removed) if !removed.is_empty() => {
                tracing::info!(tasks = ?removed, "removed the files of ended tasks whose retention ran out")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "the output retention sweep failed"),
        }
    }
}

async fn heartbeat_loop(control: ControlLink, interval_ms: u64) {
    let mut tick = tokio::time::interval(Duration::from_millis(interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = control.heartbeat().await {
            tracing::warn!(error = %e, "heartbeat failed");
        }
    }
}

async fn watch_loop(ctx: Arc<DriverContext>) {
    let mut drivers: BTreeMap<TaskId, DriverSlot> = BTreeMap::new();
    let reconnect = || retry::doubling(WATCH_RETRY_MS_MIN, WATCH_RETRY_MS_MAX, None).build();
    let mut pauses = reconnect();
    loop {
        match ctx.control.watch().await {
            Ok(mut stream) => {
                pauses = reconnect();
                loop {
                    match stream.message().await {
                        Ok(Some(event)) => on_event(&ctx, &mut drivers, event),
                        Ok(None) => break,
                        Err(status) => {
                            tracing::info!(error = %status, "assignment stream broke");
                            break;
                        }
                    }
                }
                ctx.control.reset().await;
            }
            Err(e) => tracing::warn!(error = %e, "cannot open the assignment stream"),
        }
        drivers.retain(|_, d| !d.handle.is_finished());
        let pause = pauses
            .next()
            .unwrap_or(Duration::from_millis(WATCH_RETRY_MS_MAX));
        tokio::time::sleep(pause).await;
    }
}

fn on_event(
    ctx: &Arc<DriverContext>,
    drivers: &mut BTreeMap<TaskId, DriverSlot>,
    e: pb::AssignmentEvent,
) {
    let Ok(task) = TaskId::new(e.task) else {
        tracing::warn!(task = e.task, "assignment with an invalid task id ignored");
        return;
    };
    let cancel = (!e.cancel_requested.is_empty()).then(|| e.cancel_requested.clone());
    if let Some(slot) = drivers.get(&task) {
        if slot.attempt == e.attempt && !slot.handle.is_finished() {
            if cancel.is_some() {
                let _ = slot.cancel.send(cancel);
            }
            return;
        }
        if slot.attempt == e.attempt {
            // The driver ended and the control plane still lists the attempt: it ended
            // without a committed terminal state (a report was lost); run it again from the
            // confirmed state, which every step tolerates.
            tracing::info!(%task, attempt = e.attempt, "resuming an attempt whose driver ended");
        }
    }
    let state = match TaskState::parse("state", &e.state) {
        Ok(s) => s,
        Err(err) => {
            tracing::warn!(%task, error = %err, "assignment with an unknown state ignored");
            return;
        }
    };
    let lease = task_lease(&e);
    let Some(spec) = assigned_spec(task, e.spec) else {
        return;
    };
    if drivers.len() >= DRIVERS_MAX {
        drivers.retain(|_, d| !d.handle.is_finished());
    }
    let (tx, rx) = watch::channel(cancel);
    let driver = TaskDriver::new(ctx.clone(), task, e.attempt, spec, lease, rx);
    tracing::info!(%task, attempt = e.attempt, %state, "driving task");
    let handle = tokio::spawn(driver.run(state));
    drivers.insert(
        task,
        DriverSlot {
            attempt: e.attempt,
            cancel: tx,
            handle,
        },
    );
}

/// A `placement: project` task's lease, when the assignment carries one (0 is neither a
/// lease id nor a granted generation).
fn task_lease(e: &pb::AssignmentEvent) -> Option<TaskLease> {
    let lease = LeaseId::new(e.lease).ok()?;
    (e.generation != 0).then(|| TaskLease {
        lease,
        generation: Generation::new(e.generation),
    })
}

/// The task spec of an assignment, or `None` (logged) when it is absent, too large or not a
/// spec the core accepts: such an assignment is ignored.
fn assigned_spec(task: TaskId, spec: Option<pb::TaskSpec>) -> Option<TaskSpec> {
    let Some(spec) = spec else {
        tracing::warn!(%task, "assignment without a spec; ignored");
        return None;
    };
    if prost::Message::encoded_len(&spec) > SPEC_BYTES_MAX {
        tracing::warn!(%task, "assignment spec too large; ignored");
        return None;
    }
    match TaskSpec::try_from(spec) {
        Ok(s) => Some(s),
        Err(err) => {
            tracing::warn!(%task, error = %err, "assignment spec unreadable; ignored");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TaskSpec {
        squadron_core::manifest::parse_manifest_yaml(
            "version: \"1\"\nkind: Task\nmetadata: {name: t}\nrepository: {url: https://example.invalid/r.git}\nagent: {provider: script, prompt: p, script: 'true'}\n",
        )
        .unwrap()
    }

    #[test]
    fn an_assignment_is_driven_only_with_a_spec_the_core_accepts() {
        let task = TaskId::new(1).unwrap();
        assert_eq!(
            assigned_spec(task, Some(pb::TaskSpec::from(&spec()))),
            Some(spec())
        );
        assert_eq!(assigned_spec(task, None), None, "no spec");
        let mut bad = pb::TaskSpec::from(&spec());
        bad.sandbox.as_mut().unwrap().runtime = "lxc".into();
        assert_eq!(assigned_spec(task, Some(bad)), None, "an unknown runtime");
        let mut big = pb::TaskSpec::from(&spec());
        big.agent.as_mut().unwrap().prompt = "x".repeat(SPEC_BYTES_MAX);
        assert_eq!(assigned_spec(task, Some(big)), None, "too large");
    }
}
