//! What a profile's generation uses, for the agent view: its cgroup leaf by the host's
//! accounting (the generation's provider runs directly in it, with no agent inside to report),
//! and the bytes of the profile's worktree and state directory.

use squadron_core::agent_session::SandboxUsage;
use squadron_isolation::LeafUsage;

use crate::agent::error::AgentError;
use crate::agent::runtime::{isolation, AgentRuntime};
use crate::agent::state::AgentState;
use crate::agent::supervisor::{blocking, AgentSupervisor};
use crate::task::task_usage::with_disk;

impl AgentSupervisor {
    /// The generation's usage now; `None` once its leaf is gone, or when it cannot be read
    /// (a view is still worth answering without it).
    pub(crate) async fn usage_of(&self, agent: &AgentState) -> Option<SandboxUsage> {
        match self.measure(agent).await {
            Ok(usage) => usage,
            Err(e) => {
                tracing::warn!(profile = %agent.profile, generation = %agent.generation, error = %e,
                    "the generation's usage could not be measured");
                None
            }
        }
    }

    async fn measure(&self, agent: &AgentState) -> Result<Option<SandboxUsage>, AgentError> {
        let rt = self.inner.runtime.clone();
        let (tenant, project, key, generation) = (
            agent.tenant.clone(),
            agent.project.clone(),
            agent.key.clone(),
            agent.generation,
        );
        let leaf = blocking(move || {
            // Under the cgroup lock no prune runs, and opening the project's cgroups only
            // creates them when they are missing: looked for first, so a view of a generation
            // already gone leaves no empty directory behind.
            let _guard = rt.lock_cgroups();
            if !rt.leaf_path(&tenant, &project, &key, generation).exists() {
                return Ok(None);
            }
            let cgroups = rt.project_cgroups(&tenant, &project)?;
            let leaf = cgroups
                .project
                .leaf(&AgentRuntime::leaf_name(&key, generation))
                .map_err(isolation)?;
            LeafUsage::of(&leaf).map_err(isolation)
        })
        .await?;
        let Some(leaf) = leaf else {
            return Ok(None);
        };
        let paths = self
            .sandbox_of_project(&agent.tenant, &agent.project)?
            .profile_paths(&agent.key);
        Ok(Some(
            with_disk(leaf, vec![paths.worktree, paths.state]).await?,
        ))
    }
}
