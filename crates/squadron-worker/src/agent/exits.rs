//! Providers that ended without being asked: a normal exit releases the lease; a death by
//! signal (or no recorded exit) leaves it to expire for a crash takeover.

use std::collections::BTreeSet;
use std::time::Duration;

use squadron_core::ids::ProfileId;

use crate::agent::project_sandbox::ProjectVolume;
use crate::agent::registry::{ProjectKey, RunningAttempt};
use crate::agent::supervisor::{blocking, AgentSupervisor};
use crate::runtime::RunStatus;

impl AgentSupervisor {
    /// Looks at every running attempt once (a tick of the supervisor's loop).
    pub(super) async fn check_exits(&self) {
        let running = self.registry().running();
        let mut projects = BTreeSet::new();
        for attempt in running {
            projects.insert(attempt.project.clone());
            self.check_exit(attempt).await;
        }
        for (tenant, project) in projects {
            self.sample_processes(&tenant, &project);
        }
    }

    async fn check_exit(&self, running: RunningAttempt) {
        let RunningAttempt {
            token,
            attempt,
            project,
            ..
        } = running;
        let id = token.profile;
        let a = attempt.clone();
        let status = match blocking(move || a.status()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(profile = %id, error = %e, "cannot read the attempt's status");
                return;
            }
        };
        let code = match status {
            RunStatus::Running | RunStatus::Created => return,
            RunStatus::Exited { code } => Some(code),
            RunStatus::Vanished => None,
        };
        // Another operation may have changed the attempt while the status was read.
        let Some(crashed) = self.registry().provider_ended(token, code) else {
            return;
        };
        tracing::info!(profile = %id, generation = %token.generation, ?code, crashed, "provider ended");
        self.name_a_full_disk(&project, id).await;
        self.inner.broker.unregister_profile(id.get());
        if crashed {
            return;
        }
        match self
            .stop_attempt(&attempt, token.lease, Duration::ZERO)
            .await
        {
            Ok(proof) => {
                if let Err(e) = self.end_lease(token, proof).await {
                    tracing::warn!(profile = %id, error = %e, "lease of an exited provider not ended yet");
                }
            }
            Err(e) => tracing::error!(profile = %id, error = %e, "exited provider not reaped"),
        }
    }
    /// A provider that ended on a project sandbox whose disk quota is used up most likely
    /// ended because of it (its writes met "no space left"): the log says so, naming the
    /// quota, so the operator is not left with a bare exit code.
    async fn name_a_full_disk(&self, project: &ProjectKey, profile: ProfileId) {
        if self.inner.config.project_disk_bytes.is_none() {
            return;
        }
        let volume = ProjectVolume::of(&self.inner.data_dir, &project.0, &project.1);
        // The image's own size: a raised --project-disk applies to new sandboxes only.
        if let Ok(Some(quota)) = blocking(move || Ok(volume.exhausted())).await {
            tracing::warn!(
                %profile,
                tenant = %project.0,
                project = %project.1,
                "the project sandbox's disk quota of {quota} bytes is used up"
            );
        }
    }
}
