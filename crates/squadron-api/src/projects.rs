//! Projects and agent profiles: creation, the sandbox, capability manifests, MCP decisions.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use squadron_core::ids::{McpServerId, ProfileKey, ProjectId, SkillId, TenantId, WorkerId};
use squadron_core::manifest::RuntimeKind;
use squadron_core::provider::Provider;

/// `POST /api/v1/projects`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProject {
    pub tenant: TenantId,
    pub project: ProjectId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_profiles: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active: Option<u32>,
}

/// One row of `GET /api/v1/projects`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProjectSummary {
    pub tenant: TenantId,
    pub project: ProjectId,
    pub profiles: usize,
    pub slots_held: u32,
    pub max_active: u32,
    pub sandbox: Option<String>,
}

/// `POST /api/v1/projects/{tenant}/{project}/sandbox`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AttachSandbox {
    pub worker: WorkerId,
    pub runtime: RuntimeKind,
    pub sandbox_ref: String,
}

/// `POST /api/v1/projects/{tenant}/{project}/profiles`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProfile {
    pub key: ProfileKey,
    pub providers: Vec<Provider>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_ref: Option<String>,
}

/// `PUT /api/v1/profiles/{id}/capabilities`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetCapabilities {
    pub expected_version: u64,
    #[serde(default)]
    pub required_skills: Vec<SkillId>,
    #[serde(default)]
    pub mcp_servers: Vec<McpServerId>,
}

/// A worker's MCP gateway asks whether the profile may use `server` now (INV-14); a refusal
/// is counted for `squadron evidence` as the REST check's is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpUse {
    pub server: McpServerId,
}

/// The answer of `GET /api/v1/profiles/{id}/mcp/{server}` when the use is allowed (a refusal
/// is a `permission_denied` error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct McpDecision {
    pub subject: String,
    pub server: McpServerId,
    pub allowed: bool,
}
