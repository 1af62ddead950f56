//! Stop and reap: a provider is stopped (SIGTERM, grace, SIGKILL), its leaf proved empty,
//! and the proof kept for the control plane.

use std::sync::Arc;
use std::time::Duration;

use squadron_client::StopAgent;
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{Generation, LeaseId, ProfileId};
use squadron_core::lease::LeaseState;
use squadron_core::profile::AgentProfile;
use squadron_isolation::ReapEvidence;

use crate::agent::attempt::AgentAttempt;
use crate::agent::config::AGENT_STOP_GRACE_MS_MAX;
use crate::agent::error::AgentError;
use crate::agent::project_sandbox::ProjectSandbox;
use crate::agent::state::{AgentState, AttemptStatus, ReapProof};
use crate::agent::supervisor::{blocking, AgentSupervisor};
use crate::runtime::RunStatus;

impl AgentSupervisor {
    /// Stops the profile's provider, reaps it and ends its lease (released if still the
    /// profile's writer, else ended by the evidence).
    pub(crate) async fn stop(
        &self,
        id: ProfileId,
        req: StopAgent,
    ) -> Result<AgentState, AgentError> {
        let _op = self.inner.ops.lock().await;
        let grace = match req.grace_ms {
            Some(ms) if ms > AGENT_STOP_GRACE_MS_MAX => {
                return Err(AgentError::invalid(
                    "grace_ms",
                    format!("must be at most {AGENT_STOP_GRACE_MS_MAX}, got {ms}"),
                ))
            }
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_millis(self.inner.config.stop_grace_ms),
        };
        let Some((attempt, token, status)) = self.registry().attempt(id) else {
            return Err(AgentError::not_found(format!(
                "profile {id} has no provider attempt on worker {}",
                self.inner.worker
            )));
        };
        let running = status == AttemptStatus::Running;
        let proof = self
            .stop_with_grace(id, &attempt, token.lease, grace, running)
            .await
            .map_err(|e| e.context("stopping the provider"))?;
        self.end_lease(token, proof).await?;
        self.state(id)
    }

    /// Stops an attempt with `grace`; a `running` one passes through `Stopping` to
    /// `Stopped`. One not proved gone is left self-fenced: no longer renewed, so its lease
    /// expires and nothing but evidence can move past it.
    pub(super) async fn stop_with_grace(
        &self,
        id: ProfileId,
        attempt: &AgentAttempt,
        lease: LeaseId,
        grace: Duration,
        running: bool,
    ) -> Result<ReapProof, AgentError> {
        if running {
            self.registry().set_status(id, AttemptStatus::Stopping);
        }
        let stopped = self.stop_attempt(attempt, lease, grace).await;
        let next = match &stopped {
            Ok(_) => running.then_some(AttemptStatus::Stopped),
            Err(_) => Some(AttemptStatus::SelfFenced),
        };
        if let Some(status) = next {
            self.registry().set_status(id, status);
        }
        stopped
    }

    /// Reaps the profile's current generation if it runs here and is not renewed (crashed,
    /// self-fenced, adopted dead), and records the evidence: a fenced or expired lease
    /// frees its slot.
    pub(crate) async fn reap(&self, id: ProfileId) -> Result<ReapProof, AgentError> {
        let _op = self.inner.ops.lock().await;
        let profile = self.profile(id).await?;
        if let Some(generation) = self.registry().running_generation(id) {
            return Err(AgentError::precondition(format!(
                "generation {generation} of profile {id} is running; stop it instead"
            )));
        }
        let old = self.takeover_target(&profile).await?;
        if old.holder.worker != self.inner.worker {
            return Err(AgentError::precondition(format!(
                "generation {} of profile {id} ran on worker {}; only that worker can reap it",
                old.generation, old.holder.worker
            )));
        }
        // INV-9: nothing of a generation whose lease the leader still holds active is
        // killed; its expiry is confirmed by the leader's sweep fencing it.
        if old.state == LeaseState::Active {
            return Err(AgentError::precondition(format!(
                "lease {} of generation {} is active (expires at {} ms by the leader's clock); \
                 stop the provider, or reap once the lease has expired and been fenced",
                old.id, old.generation, old.expires_at_ms
            )));
        }
        let sandbox = self.sandbox_of(&profile.tenant, &profile.project).await?;
        let proof = self
            .reap_generation(&sandbox, &profile, old.generation)
            .await?;
        self.inner
            .control
            .record_evidence(proof.record(&old.token()))
            .await
            .map_err(|e| AgentError::from(e).context("recording the reap evidence"))?;
        self.registry().reaped(id);
        self.inner.broker.unregister_profile(id.get());
        Ok(proof)
    }

    /// SIGTERM, `grace`, SIGKILL, then freeze → kill → `populated 0`. Only evidence that
    /// proves the leaf empty is returned.
    pub(super) async fn stop_attempt(
        &self,
        attempt: &AgentAttempt,
        lease: LeaseId,
        grace: Duration,
    ) -> Result<ReapProof, AgentError> {
        let a = attempt.clone();
        let evidence = blocking(move || {
            if matches!(a.status()?, RunStatus::Running) {
                a.terminate(grace)?;
            }
            a.reap()
        })
        .await;
        // Whatever the outcome, the generation is served nothing more: a process that
        // survived a failed stop keeps no broker, gateway or egress proxy until its lease
        // runs out.
        self.registry().close_sockets_of(lease);
        let evidence = evidence?;
        if evidence.populated {
            return Err(AgentError::new(
                ErrorCode::Internal,
                format!(
                    "{} is still populated after the kill; nothing was changed on the \
                     control plane ({})",
                    evidence.cgroup,
                    evidence.steps.join("; ")
                ),
            ));
        }
        Ok(ReapProof {
            lease,
            generation: attempt.generation(),
            cgroup: evidence.cgroup,
            observed_at_ms: evidence.observed_at_ms,
        })
    }

    /// Reaps generation `generation` of the profile here, or returns its recorded evidence.
    pub(super) async fn reap_generation(
        &self,
        sandbox: &Arc<ProjectSandbox>,
        profile: &AgentProfile,
        generation: Generation,
    ) -> Result<ReapProof, AgentError> {
        let (rt, sb, key) = (
            self.inner.runtime.clone(),
            sandbox.clone(),
            profile.key.clone(),
        );
        let lease = self.lease_of_generation(profile, generation).await?;
        let never_started = rt
            .leaf_path(sb.tenant(), sb.project(), &key, generation)
            .display()
            .to_string();
        let evidence = blocking(move || {
            if let Some(attempt) = AgentAttempt::adopt(&rt, &sb, &key, generation)? {
                if attempt.leaf().exists() {
                    return attempt.reap().map(Some);
                }
            }
            if let Some(recorded) = sb.reap_evidence(&key, generation)? {
                return Ok(Some(recorded));
            }
            // No start record and no leaf: the worker's own durable record says this
            // generation never ran here (a grant whose start was never reached), so its
            // leaf is empty by construction.
            if sb.started(&key, generation)?.is_none() {
                return Ok(Some(ReapEvidence {
                    cgroup: never_started,
                    populated: false,
                    observed_at_ms: squadron_client::now_ms(),
                    steps: vec!["never started: no start record, no leaf".into()],
                }));
            }
            Ok(None)
        })
        .await?;
        match evidence {
            Some(ev) if !ev.populated => Ok(ReapProof {
                lease,
                generation,
                cgroup: ev.cgroup,
                observed_at_ms: ev.observed_at_ms,
            }),
            Some(ev) => Err(AgentError::new(
                ErrorCode::Internal,
                format!("{} is still populated after the kill", ev.cgroup),
            )),
            None => Err(AgentError::precondition(format!(
                "generation {generation} of profile {} never started on worker {}: no \
                 cgroup to reap",
                profile.id, self.inner.worker
            ))),
        }
    }

    async fn lease_of_generation(
        &self,
        profile: &AgentProfile,
        generation: Generation,
    ) -> Result<LeaseId, AgentError> {
        let candidates = profile
            .live_lease
            .into_iter()
            .chain(profile.fenced_unreaped.iter().copied());
        for id in candidates {
            let lease = self.inner.control.get_lease(id).await?;
            if lease.generation == generation {
                return Ok(id);
            }
        }
        Err(AgentError::precondition(format!(
            "profile {} has no unreaped lease of generation {generation}",
            profile.id
        )))
    }
}
