//! Commands on projects, their sandbox, agent profiles and MCP relation tuples.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::{McpServerId, ProfileId, ProfileKey, ProjectId, SkillId, TenantId, WorkerId};
use crate::manifest::RuntimeKind;
use crate::provider::Provider;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CreateProject {
    pub tenant: TenantId,
    pub project: ProjectId,
    pub max_profiles: Option<u32>,
    pub max_active: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AttachSandbox {
    pub tenant: TenantId,
    pub project: ProjectId,
    pub worker: WorkerId,
    pub runtime: RuntimeKind,
    pub sandbox_ref: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DetachSandbox {
    pub tenant: TenantId,
    pub project: ProjectId,
    pub sandbox_ref: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CreateProfile {
    pub tenant: TenantId,
    pub project: ProjectId,
    pub key: ProfileKey,
    pub providers: Vec<Provider>,
    pub context_ref: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SetCapabilityManifest {
    pub profile: ProfileId,
    pub expected_version: u64,
    pub required_skills: Vec<SkillId>,
    pub mcp_servers: Vec<McpServerId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GrantMcpUse {
    pub profile: ProfileId,
    pub server: McpServerId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RevokeMcpUse {
    pub profile: ProfileId,
    pub server: McpServerId,
}
