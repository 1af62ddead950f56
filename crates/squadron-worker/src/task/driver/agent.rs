//! The sandbox agent's part of PROVISIONING (runtimes that run `squadron agent`): its token,
//! files and relay before the sandbox starts, then the wait for its registration — READY is
//! reported only once the agent of this attempt has registered with the control plane.

use std::sync::Arc;
use std::time::Duration;

use squadron_core::limits::{AGENT_TOKEN_TTL_MS_MAX, BOOTSTRAP_TOKEN_TTL_MS_MIN};

use super::TaskDriver;
use crate::error::WorkerError;
use crate::runtime::{LaunchSpec, RunStatus, Runtime, SandboxHandle};
use crate::task::agent_relay::Target;
use crate::task::sandbox_agent::AgentFiles;

/// How often the registration is looked for.
const REGISTRATION_POLL_MS: u64 = 100;

impl TaskDriver {
    /// Before the sandbox exists: mints the agent's one-time token and writes its files. A
    /// sandbox an earlier life already made keeps the files it has (its agent scrubbed the
    /// token), so no second token is put where the provider could read it. The relay is
    /// opened either way (its REST socket only until the agent registered).
    pub(super) async fn prepare_agent(
        &self,
        runtime: &Arc<dyn Runtime>,
        spec: &LaunchSpec,
        limit: Duration,
    ) -> Result<(), WorkerError> {
        let owner = runtime.sandbox_owner(spec)?;
        if runtime
            .adopt(self.task, self.attempt, &self.dir)
            .await?
            .is_none()
        {
            let ttl_ms = (limit.as_millis() as u64)
                .clamp(BOOTSTRAP_TOKEN_TTL_MS_MIN, AGENT_TOKEN_TTL_MS_MAX);
            let minted = self
                .ctx
                .control
                .mint_agent_token(self.task, ttl_ms)
                .await
                .map_err(|e| {
                    WorkerError::runtime("agent", format!("mint the agent's token: {e}"))
                })?;
            let tls = self.ctx.config.tls.as_ref().ok_or_else(|| {
                WorkerError::runtime("agent", "the worker has no TLS identity to hand on")
            })?;
            AgentFiles {
                task: self.task,
                attempt: self.attempt,
                token: &minted.token,
                ca_pem: tls.trust.ca_pem(),
                heartbeat_ms: self.ctx.config.agent_heartbeat_ms,
                connect_pauses: crate::retry::table(
                    &self.spec.lifecycle.retries.agent_connect,
                    self.ctx.config.backoff_override_ms,
                )
                .collect(),
                over_channel: runtime.agent_over_channel(),
            }
            .write(&self.dir.agent(), owner)?;
            self.event(serde_json::json!({"event": "agent_token_minted", "token": minted.id.to_string(), "expires_at_ms": minted.expires_at_ms}));
        }
        if runtime.agent_over_channel() {
            // The channel exists once the sandbox runs (`await_agent`).
            return Ok(());
        }
        let targets = self.relay_targets().await;
        self.ctx
            .relays
            .open(self.task, &self.dir.agent(), owner, targets)
    }

    /// REST (enrollment) only until the agent of this attempt registered.
    async fn relay_targets(&self) -> &'static [Target] {
        let registered = self
            .ctx
            .control
            .agent_session(self.task)
            .await
            .is_ok_and(|s| s.is_some_and(|s| s.attempt == self.attempt));
        if registered {
            &[Target::Grpc]
        } else {
            &[Target::Rest, Target::Grpc]
        }
    }

    /// After a restart in READY or RUNNING: the agent's gRPC relay again.
    pub(super) async fn reopen_relay(
        &self,
        runtime: &Arc<dyn Runtime>,
        spec: &LaunchSpec,
        handle: &SandboxHandle,
    ) -> Result<(), WorkerError> {
        if !runtime.runs_agent() {
            return Ok(());
        }
        if runtime.agent_over_channel() {
            match runtime.agent_channel(handle).await? {
                Some(socket) => self
                    .ctx
                    .relays
                    .open_channel(self.task, socket, &[Target::Grpc]),
                None => {
                    tracing::warn!(task = %self.task, "the sandbox has no agent channel (not running?)")
                }
            }
            return Ok(());
        }
        let owner = runtime.sandbox_owner(spec)?;
        self.ctx
            .relays
            .open(self.task, &self.dir.agent(), owner, &[Target::Grpc])
    }

    /// A VM's channel, once the started domain has one, relayed to `targets`.
    async fn open_channel(
        &self,
        runtime: &Arc<dyn Runtime>,
        handle: &SandboxHandle,
        deadline: tokio::time::Instant,
    ) -> Result<(), String> {
        loop {
            match runtime.agent_channel(handle).await {
                Ok(Some(socket)) => {
                    let targets = self.relay_targets().await;
                    self.ctx.relays.open_channel(self.task, socket, targets);
                    return Ok(());
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(task = %self.task, error = %e, "looking for the agent's channel failed")
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(
                    "provision timeout: the sandbox never offered its agent channel".into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(REGISTRATION_POLL_MS)).await;
        }
    }

    /// Starts the sandbox (the agent only: the provider waits for RUNNING) and waits until
    /// the agent of this attempt has registered, or `limit` passes, or the agent exits. The
    /// error is the task's failure reason.
    pub(super) async fn await_agent(
        &self,
        runtime: &Arc<dyn Runtime>,
        handle: &SandboxHandle,
        spec: &LaunchSpec,
        limit: Duration,
    ) -> Result<(), String> {
        runtime
            .start(handle, spec)
            .await
            .map_err(|e| format!("start the agent: {e}"))?;
        let deadline = tokio::time::Instant::now() + limit;
        if runtime.agent_over_channel() {
            self.open_channel(runtime, handle, deadline).await?;
        }
        loop {
            match self.ctx.control.agent_session(self.task).await {
                Ok(Some(s)) if s.attempt == self.attempt => {
                    // Enrollment is over: nothing run later in the sandbox reaches REST.
                    self.ctx
                        .relays
                        .close(self.task, Some(Target::Rest), &self.dir.agent());
                    self.event(serde_json::json!({"event": "agent_registered", "registered_at_ms": s.registered_at_ms}));
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(task = %self.task, error = %e, "reading the agent's registration failed")
                }
            }
            match runtime.status(handle).await {
                Ok(RunStatus::Exited { code }) => {
                    return Err(format!(
                        "the agent exited with code {code} before it registered"
                    ))
                }
                Ok(RunStatus::Vanished) => {
                    return Err("the sandbox vanished before its agent registered".into())
                }
                _ => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "provision timeout: the agent did not register within {} ms",
                    limit.as_millis()
                ));
            }
            tokio::time::sleep(Duration::from_millis(REGISTRATION_POLL_MS)).await;
        }
    }

    /// The exit code the agent reported beside the runtime's own, in the task's events (a
    /// runtime that sees none, a VM, will go by the agent's).
    pub(super) async fn note_agent_exit(&self, runtime_code: Option<i32>) {
        let reported = match self.ctx.control.agent_session(self.task).await {
            Ok(s) => s
                .filter(|s| s.attempt == self.attempt)
                .and_then(|s| s.exit_code),
            Err(e) => {
                tracing::warn!(task = %self.task, error = %e, "reading the agent's exit report failed");
                None
            }
        };
        if reported.is_some() && reported != runtime_code {
            tracing::warn!(task = %self.task, ?reported, ?runtime_code, "the agent and the runtime disagree on the exit code");
        }
        self.event(serde_json::json!({"event": "agent_exit", "reported": reported, "runtime": runtime_code}));
    }
}
