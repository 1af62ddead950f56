//! After a restart: the attempts of every active lease this worker holds are adopted —
//! renewed again when their leaf is populated, reported crashed when not. A fenced lease's
//! process runs without authority: it is adopted to be stopped.

use squadron_core::lease::{LeaseState, RuntimeLease};

use crate::agent::attempt::AgentAttempt;
use crate::agent::error::AgentError;
use crate::agent::mcp_access::McpAccess;
use crate::agent::registry::AgentEntry;
use crate::agent::state::{AgentState, AttemptStatus};
use crate::agent::supervisor::{blocking, AgentSupervisor};
use crate::runtime::RunStatus;

impl AgentSupervisor {
    /// Adopts what this worker's leases left running; the number of attempts adopted.
    pub(crate) async fn adopt_all(&self) -> Result<usize, AgentError> {
        let _op = self.inner.ops.lock().await;
        let mut adopted = 0;
        for lease in self.inner.control.held_leases().await? {
            if self.adopt_lease(lease).await? {
                adopted += 1;
            }
        }
        Ok(adopted)
    }

    /// Adopts the attempt of one lease; `false` when it is known already or has no attempt
    /// here (its lease will expire).
    async fn adopt_lease(&self, lease: RuntimeLease) -> Result<bool, AgentError> {
        if self.registry().knows(lease.profile) {
            return Ok(false);
        }
        let profile = self.profile(lease.profile).await?;
        let sandbox = self.sandbox_of(&profile.tenant, &profile.project).await?;
        let (rt, sb, key, generation) = (
            self.inner.runtime.clone(),
            sandbox.clone(),
            profile.key.clone(),
            lease.generation,
        );
        let Some(attempt) =
            blocking(move || AgentAttempt::adopt(&rt, &sb, &key, generation)).await?
        else {
            tracing::warn!(profile = %lease.profile, generation = %lease.generation, "active lease without an attempt here; it will expire");
            return Ok(false);
        };
        let running = matches!(attempt.status()?, RunStatus::Running);
        // A fenced lease's process runs without authority: no socket is served for it.
        let sockets = if running && lease.state == LeaseState::Active {
            // The gateway admits the token the generation was started with; without one
            // (started before the gateway existed) a fresh token nobody holds keeps it shut.
            let run_dir = sandbox
                .profile_paths(&profile.key)
                .generation_run_dir(lease.generation);
            let token = McpAccess::adopted_token(&run_dir)
                .unwrap_or_else(|| McpAccess::new(Vec::new()).token);
            let mut sockets = self.serve_sockets(&sandbox, &profile, &token)?;
            sockets.egress = self.resume_egress(&attempt, &run_dir, lease.token()).await;
            Some(sockets)
        } else {
            None
        };
        let state = AgentState {
            profile: profile.id,
            key: profile.key.clone(),
            tenant: profile.tenant.clone(),
            project: profile.project.clone(),
            provider: lease.provider,
            lease: lease.id,
            generation: lease.generation,
            status: if running {
                AttemptStatus::Running
            } else {
                AttemptStatus::Crashed
            },
            cgroup: attempt.cgroup_path().display().to_string(),
            exit_code: None,
            capsule_sequence: profile.capsule_head.map(|h| h.sequence),
            mailbox_delivered_through: 0,
        };
        tracing::info!(profile = %profile.id, generation = %lease.generation, running, state = lease.state.name(), "agent attempt adopted");
        self.registry().insert(AgentEntry {
            state,
            attempt,
            sandbox: sandbox.clone(),
            sockets,
            // The old deadline file stands; the next renewal moves it.
            deadline_ms: lease.expires_at_ms,
            pending_evidence: None,
        });
        if lease.state != LeaseState::Active {
            if running {
                self.self_fence(lease.token(), "adopted with a fenced lease")
                    .await;
            } else if let Ok(proof) = self
                .reap_generation(&sandbox, &profile, lease.generation)
                .await
            {
                self.registry().queue_evidence(profile.id, proof);
            }
        }
        Ok(true)
    }
}
