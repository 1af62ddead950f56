//! Projects, their sandbox and roster; profiles, capability manifests and MCP authorization.

use reqwest::Method;
use squadron_core::ids::{IdempotencyKey, McpServerId, ProfileId, ProjectId, TenantId};
use squadron_core::Outcome;

use crate::http::segment;
use crate::types::*;
use crate::{ClientError, Consistency, SquadronClient};
use squadron_core::profile::AgentProfile;
use squadron_core::project::Project;
use squadron_core::roster::RosterSnapshot;

impl SquadronClient {
    pub async fn create_project(
        &self,
        req: &CreateProject,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post("/api/v1/projects", req, key).await
    }

    pub async fn list_projects(&self, c: Consistency) -> Result<Vec<ProjectSummary>, ClientError> {
        self.get("/api/v1/projects", c).await
    }

    pub async fn get_project(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        c: Consistency,
    ) -> Result<Project, ClientError> {
        self.get(&format!("/api/v1/projects/{tenant}/{project}"), c)
            .await
    }

    pub async fn attach_sandbox(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        req: &AttachSandbox,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(
            &format!("/api/v1/projects/{tenant}/{project}/sandbox"),
            req,
            key,
        )
        .await
    }

    pub async fn detach_sandbox(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        sandbox_ref: &str,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        let path = format!(
            "/api/v1/projects/{tenant}/{project}/sandbox/{}",
            segment(sandbox_ref)
        );
        self.send_empty(Method::DELETE, &path, key).await
    }

    pub async fn roster(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        c: Consistency,
    ) -> Result<RosterSnapshot, ClientError> {
        self.get(&format!("/api/v1/projects/{tenant}/{project}/roster"), c)
            .await
    }

    pub async fn create_profile(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        req: &CreateProfile,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(
            &format!("/api/v1/projects/{tenant}/{project}/profiles"),
            req,
            key,
        )
        .await
    }

    pub async fn list_profiles(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        c: Consistency,
    ) -> Result<Vec<AgentProfile>, ClientError> {
        self.get(&format!("/api/v1/projects/{tenant}/{project}/profiles"), c)
            .await
    }

    pub async fn get_profile(
        &self,
        profile: ProfileId,
        c: Consistency,
    ) -> Result<AgentProfile, ClientError> {
        self.get(&format!("/api/v1/profiles/{profile}"), c).await
    }

    pub async fn set_capabilities(
        &self,
        profile: ProfileId,
        req: &SetCapabilities,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.write(
            Method::PUT,
            &format!("/api/v1/profiles/{profile}/capabilities"),
            Some(req),
            key,
        )
        .await
    }

    pub async fn grant_mcp(
        &self,
        profile: ProfileId,
        server: &McpServerId,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.send_empty(
            Method::PUT,
            &format!("/api/v1/profiles/{profile}/mcp/{server}"),
            key,
        )
        .await
    }

    pub async fn revoke_mcp(
        &self,
        profile: ProfileId,
        server: &McpServerId,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.send_empty(
            Method::DELETE,
            &format!("/api/v1/profiles/{profile}/mcp/{server}"),
            key,
        )
        .await
    }

    /// Whether the profile may use the MCP server: `Ok` when it may, a `permission_denied`
    /// error when it may not (INV-14).
    pub async fn check_mcp(
        &self,
        profile: ProfileId,
        server: &McpServerId,
        c: Consistency,
    ) -> Result<McpDecision, ClientError> {
        self.get(&format!("/api/v1/profiles/{profile}/mcp/{server}"), c)
            .await
    }
}
