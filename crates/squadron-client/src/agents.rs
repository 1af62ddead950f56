//! The agent facade (relayed by a node to the project sandbox's worker) and a project's
//! release evidence.

use reqwest::Method;
use squadron_core::ids::{ProfileId, ProjectId, TenantId};

use crate::{ClientError, Consistency, SquadronClient};
use squadron_api::agents::*;

impl SquadronClient {
    /// Launches the profile's provider in its project's sandbox under a new lease.
    pub async fn agent_launch(
        &self,
        profile: ProfileId,
        req: &LaunchAgent,
    ) -> Result<AgentView, ClientError> {
        self.write(
            Method::POST,
            &format!("/api/v1/profiles/{profile}/agent/launch"),
            Some(req),
            None,
        )
        .await
    }

    /// A graceful or crash takeover of the profile: the next generation, started.
    pub async fn agent_takeover(
        &self,
        profile: ProfileId,
        req: &TakeoverAgent,
    ) -> Result<AgentView, ClientError> {
        self.write(
            Method::POST,
            &format!("/api/v1/profiles/{profile}/agent/takeover"),
            Some(req),
            None,
        )
        .await
    }

    /// Stops the profile's provider (SIGTERM, grace, SIGKILL), reaps it and ends its lease.
    pub async fn agent_stop(
        &self,
        profile: ProfileId,
        req: &StopAgent,
    ) -> Result<AgentView, ClientError> {
        self.write(
            Method::POST,
            &format!("/api/v1/profiles/{profile}/agent/stop"),
            Some(req),
            None,
        )
        .await
    }

    /// Reaps the profile's last generation (kill, `populated 0`) and records the evidence,
    /// freeing the slot of a fenced or expired lease.
    pub async fn agent_reap(&self, profile: ProfileId) -> Result<ReplacedGeneration, ClientError> {
        self.write::<_, ()>(
            Method::POST,
            &format!("/api/v1/profiles/{profile}/agent/reap"),
            None,
            None,
        )
        .await
    }

    /// The profile's provider attempt as its worker sees it.
    pub async fn agent_view(&self, profile: ProfileId) -> Result<AgentView, ClientError> {
        self.get(
            &format!("/api/v1/profiles/{profile}/agent"),
            Consistency::Linearizable,
        )
        .await
    }

    /// The release evidence of a project, from this node and the sandbox's worker.
    pub async fn project_evidence(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
    ) -> Result<ProjectEvidence, ClientError> {
        self.get(
            &format!("/api/v1/projects/{tenant}/{project}/evidence"),
            Consistency::Linearizable,
        )
        .await
    }
}
