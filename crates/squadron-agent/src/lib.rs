//! `squadron agent`: the process inside every sandbox (DESIGN §1, §5).
//!
//! 0. In a warm sandbox (the worker's pool), waits for the launch file the worker writes
//!    once it claimed the container for a task (`pooled_launch`).
//! 1. Reads its environment file (`agent_env`) and scrubs the one-time token from it.
//! 2. Enrolls through the worker's REST relay for `spiffe://squadron.local/agent/task-{id}`
//!    (`enrollment`), retried on the task's agent connect table while the relay or the
//!    control plane does not answer.
//! 3. Registers over gRPC (`control_session`): READY is the worker's report once this
//!    registration is committed.
//! 4. Heartbeats every `SQUADRON_HEARTBEAT_MS` (30 s by default) with what the sandbox uses
//!    (`sandbox_usage`), and renews its certificate a third before it ends, for as long as
//!    the task runs (`cert_renewal`).
//! 5. Waits until the task is RUNNING, then runs the provider launcher (`provider_run`) and
//!    exits with its exit code, which the runtime reads as the run's.
//!
//! Map: `agent_env` (the file), `cert_renewal`, `channel_bridge` and `virtio_port` (a VM's relay over its
//! virtio-serial port), `enrollment` (token → certificate), `control_session` (the
//! gRPC calls and their retries), `sandbox_usage` (heartbeat figures), `provider_run` (the
//! launcher and stops), `error`.

pub mod agent_env;
pub mod cert_renewal;
pub mod channel_bridge;
pub mod control_session;
pub mod enrollment;
pub mod error;
pub mod pooled_launch;
pub mod provider_run;
pub mod sandbox_usage;
pub mod virtio_port;

use std::path::PathBuf;
use std::time::Duration;

use backon::Retryable;
use squadron_pki::ClusterTrust;
use tokio::signal::unix::{signal, SignalKind};

pub use agent_env::AgentEnv;
pub use control_session::{ControlSession, RunOrder};
pub use error::AgentError;
pub use provider_run::Launch;

/// Largest CA certificate file read.
pub const CA_FILE_BYTES_MAX: u64 = 64 * 1024;
/// The longest the agent spends reporting the launcher's exit code before it exits itself.
pub const EXIT_REPORT_MS_MAX: u64 = 5_000;
/// The exit code of an agent stopped by SIGTERM before the provider started.
pub const STOPPED_EXIT_CODE: i32 = 143;

/// What `squadron agent` was asked to do.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub env_file: PathBuf,
    /// The provider launcher and its arguments.
    pub launch: Vec<String>,
    /// A warm sandbox's: the agent waits for this file, which names the launch instead.
    pub launch_file: Option<PathBuf>,
}

/// Runs the agent to the end; the answer is the exit code the process should end with.
pub async fn run(options: AgentOptions) -> Result<i32, AgentError> {
    let launch = match (&options.launch_file, options.launch.is_empty()) {
        (None, false) => Launch::CommandLine(options.launch.clone()),
        (Some(file), true) => match pooled_launch::wait(file).await? {
            Some(pooled) => Launch::Pooled(pooled),
            None => {
                tracing::info!("SIGTERM while waiting for a task");
                return Ok(STOPPED_EXIT_CODE);
            }
        },
        (None, true) => {
            return Err(AgentError::Launch(
                "no launcher given: squadron agent --env-file FILE -- PROGRAM [ARGS…]".into(),
            ))
        }
        (Some(_), false) => {
            return Err(AgentError::Launch(
                "--launch-file names the launcher: give no PROGRAM after --".into(),
            ))
        }
    };
    // rustix reads these from /proc/self/auxv once, which an undumpable process may not
    // open: read them first (the heartbeat's figures need both).
    let _ = (
        rustix::param::clock_ticks_per_second(),
        rustix::param::page_size(),
    );
    // The token and the key live in this process's memory only; code of the same user the
    // sandbox runs later (the provider) may not read it through /proc or ptrace.
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        tracing::warn!(error = %e, "could not make the agent undumpable");
    }
    let env = AgentEnv::take(&options.env_file)?;
    // In a VM: the relay sockets are this process's own, carried over the port.
    let bridge = match &env.channel {
        Some(port) => Some(channel_bridge::ChannelBridge::start(
            port.clone(),
            &env.rest_socket,
            &env.grpc_socket,
        )?),
        None => None,
    };
    let ca_pem = agent_env::read_bounded(&env.ca_file, CA_FILE_BYTES_MAX)?;
    let trust = ClusterTrust::from_ca_pem(&ca_pem)?;
    let cert = enroll_with_retries(&env, &trust).await?;
    tracing::info!(task = %env.task, attempt = env.attempt, "enrolled");
    let session = ControlSession::new(&env, &trust, &cert)?;
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|e| AgentError::Launch(e.to_string()))?;
    let reply = session.register().await?;
    tracing::info!(task = %env.task, state = %reply.state, "registered");
    if let Some(bridge) = &bridge {
        bridge.close_rest();
    }
    let heartbeats = tokio::spawn(heartbeat_loop(
        session.clone(),
        Duration::from_millis(env.heartbeat_ms),
        env.disk_paths.clone(),
    ));
    // Ends with the agent: the process exits once the provider has.
    tokio::spawn(cert_renewal::renewal_loop(
        session.clone(),
        enrollment::identity(&env),
        cert,
    ));
    let order = tokio::select! {
        order = session.wait_for_run() => order,
        _ = terminate.recv() => {
            heartbeats.abort();
            tracing::info!("SIGTERM before the provider started");
            return Ok(STOPPED_EXIT_CODE);
        }
    };
    drop(terminate);
    let code = match order? {
        RunOrder::Run => provider_run::run(&launch).await?,
        RunOrder::Ended { state } => {
            heartbeats.abort();
            tracing::info!(%state, "the task ended before it ran; nothing to start");
            return Ok(0);
        }
    };
    heartbeats.abort();
    // The runtime may not see the code itself (a VM): the control plane keeps it. A refusal
    // (the task ended meanwhile) changes nothing about this exit.
    // It never holds the exit up for long: the sandbox ends when the agent does.
    let usage = sandbox_usage::measure(&env.disk_paths);
    let report = session.report_exit(usage, code);
    match tokio::time::timeout(Duration::from_millis(EXIT_REPORT_MS_MAX), report).await {
        Ok(Ok(_)) => tracing::info!(code, "the provider exited; reported"),
        Ok(Err(e)) => tracing::warn!(code, error = %e, "the provider exited; the report failed"),
        Err(_) => tracing::warn!(code, "the provider exited; the report took too long"),
    }
    Ok(code)
}

/// Enrollment on the connect table: a relay or node that does not answer is asked again; a
/// refused token is final.
async fn enroll_with_retries(
    env: &AgentEnv,
    trust: &ClusterTrust,
) -> Result<squadron_pki::IssuedCert, AgentError> {
    (|| enrollment::enroll(env, trust))
        .retry(env.connect_pauses.clone().into_iter())
        .when(|e| matches!(e, AgentError::Io { .. }))
        .notify(
            |e, pause| tracing::info!(error = %e, ?pause, "enrollment not answered; asking again"),
        )
        .await
}

async fn heartbeat_loop(session: ControlSession, every: Duration, disk_paths: Vec<PathBuf>) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let usage = sandbox_usage::measure(&disk_paths);
        match session.heartbeat(usage).await {
            Ok(reply) => tracing::debug!(state = %reply.state, "heartbeat"),
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
    }
}
