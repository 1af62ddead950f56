//! Project sandboxes no longer attached to this worker (`DetachSandbox`, or attached to
//! another worker since): the worker removes each once it has been seen detached for
//! `detached_sandbox_retention_ms` (`--detached-sandbox-retention`), so neither its disk nor
//! its directory outlives the project's use of this worker. Until then a launch that attaches
//! the project here again from the same repository and branch finds its worktrees as they
//! were; one from another origin is refused naming the field (the worktrees may hold unpushed
//! work, so a launch never replaces them).
//!
//! The sweep runs in its own loop every `detached_sweep_interval_ms`, reading each local
//! sandbox's project. When one has been detached long enough it takes the supervisor's
//! operation lock — only if free, so it never queues behind a launch's clone or a stop's
//! grace — reads the project once more, checks that nothing of the project runs here (an
//! attempt running, stopping or owing its reap evidence; a populated project cgroup), and
//! takes the sandbox away (`project_sandbox::take_away`); the deletion of its files follows
//! without the lock. When the project was first seen detached is kept on disk, so a restart
//! does not start the retention over.

use std::path::PathBuf;

use squadron_core::ids::{ProjectId, TenantId};
use squadron_core::project::Project;

use crate::agent::error::AgentError;
use crate::agent::project_sandbox::{
    delete_left_aside, delete_taken, detached_since, forget_detached, local_sandboxes, take_away,
};
use crate::agent::runtime::leaf_populated;
use crate::agent::supervisor::{blocking, AgentSupervisor};
use crate::control_link::CallError;
use crate::error::WorkerError;
use crate::support::now_ms;

/// Whether a sandbox detached since `since` is due for removal at `now`.
fn retention_over(since: u64, now: u64, retention_ms: u64) -> bool {
    now.saturating_sub(since) >= retention_ms
}

impl AgentSupervisor {
    /// One sweep over this worker's project sandboxes.
    pub(super) async fn sweep_detached(&self) {
        let data_dir = self.inner.data_dir.clone();
        let local = blocking(move || {
            delete_left_aside(&data_dir)?;
            Ok(local_sandboxes(&data_dir))
        });
        let local = match local.await {
            Ok(local) => local,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the project sandboxes");
                return;
            }
        };
        for (tenant, project) in local {
            if let Err(e) = self.look_at(&tenant, &project).await {
                tracing::warn!(%tenant, %project, error = %e, "a project sandbox not attached here was kept; tried again next sweep");
            }
        }
    }

    /// Forgets a sandbox attached here, counts one detached, removes one detached long
    /// enough.
    async fn look_at(&self, tenant: &TenantId, project: &ProjectId) -> Result<(), AgentError> {
        let (data_dir, t, p) = (self.inner.data_dir.clone(), tenant.clone(), project.clone());
        if self.is_here(&self.read_project(tenant, project).await?) {
            return blocking(move || forget_detached(&data_dir, &t, &p)).await;
        }
        let now = now_ms();
        let since = blocking(move || detached_since(&data_dir, &t, &p, now)).await?;
        if !retention_over(since, now, self.inner.config.detached_sandbox_retention_ms) {
            return Ok(());
        }
        let Ok(op) = self.inner.ops.try_lock() else {
            return Ok(());
        };
        // Read again under the lock: a launch may have attached it meanwhile.
        let read = self.read_project(tenant, project).await?;
        if self.is_here(&read) {
            return Ok(());
        }
        let aside = self.take_away_detached(tenant, project).await?;
        // The profiles' socket directories go with the sandbox, while the lock still keeps a
        // launch from making them afresh: nothing of the project runs here.
        let sockets: Vec<PathBuf> = read
            .profiles
            .iter()
            .map(|id| self.broker_dir(*id))
            .collect();
        blocking(move || delete_socket_dirs(&sockets)).await?;
        drop(op);
        blocking(move || delete_taken(aside.as_deref())).await?;
        tracing::info!(%tenant, %project, "removed the project's sandbox: no longer attached to this worker");
        Ok(())
    }

    /// The project as the control plane has it. A refusal (a project it does not know) is an
    /// error like any other: the sandbox stays.
    async fn read_project(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
    ) -> Result<Project, AgentError> {
        self.inner
            .control
            .get_project(tenant, project)
            .await
            .map_err(|e: CallError| AgentError::from(e).context("reading the project"))
    }

    /// Whether the project's sandbox is attached to this worker.
    fn is_here(&self, project: &Project) -> bool {
        project
            .sandbox
            .as_ref()
            .is_some_and(|s| s.worker == self.inner.worker)
    }

    /// Takes the project's sandbox away here; the caller holds the operation lock and knows
    /// the project is not attached here. Refused while anything of the project runs here.
    async fn take_away_detached(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
    ) -> Result<Option<PathBuf>, AgentError> {
        let key = (tenant.clone(), project.clone());
        let cgroup = self.inner.runtime.project_cgroup_path(tenant, project);
        let populated = blocking(move || leaf_populated(&cgroup)).await?;
        if populated || self.registry().project_busy(&key) {
            return Err(AgentError::precondition(format!(
                "project {tenant}/{project} still has a generation on worker {}; its sandbox \
                 stays until it is reaped",
                self.inner.worker
            )));
        }
        let (data_dir, t, p) = (self.inner.data_dir.clone(), tenant.clone(), project.clone());
        let aside = blocking(move || take_away(&data_dir, &t, &p)).await?;
        self.registry().forget_sandbox(&key);
        Ok(aside)
    }
}

/// Removes each profile's socket directory (`agent-sockets/p{id}`); one never made is fine.
fn delete_socket_dirs(dirs: &[PathBuf]) -> Result<(), WorkerError> {
    for dir in dirs {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(WorkerError::io("removing", dir, e))
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_goes_once_its_retention_is_over() {
        assert!(!retention_over(2_000, 2_999, 1_000));
        assert!(retention_over(2_000, 3_000, 1_000));
        assert!(retention_over(10, 10, 0), "no retention: at once");
        // A clock that went back never counts as over, nor wraps.
        assert!(!retention_over(5_000, 1_000, 1));
    }
}
