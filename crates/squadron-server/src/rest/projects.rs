//! Projects, their sandbox, profiles, capability manifests and MCP authorization.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{delete, get, post, put};
use axum::Json;
use squadron_core::command as cmd;
use squadron_core::ids::{McpServerId, ProfileId, ProjectId, TenantId};
use squadron_core::profile::AgentProfile;
use squadron_core::project::Project;
use squadron_core::roster::RosterSnapshot;
use squadron_core::{Command, Outcome};

use super::{
    body, json, parse_id, query, read, write, AppState, ConsistencyQuery, Input, JsonBody,
    QueryParams, RouteBook,
};
use crate::authz::Caller;
use crate::error::ApiError;
use crate::mcp_denials::McpDenials;
use squadron_api::{
    Access, AttachSandbox, CreateProfile, CreateProject, McpDecision, ProjectSummary, Scope,
    SetCapabilities,
};

pub fn routes(book: RouteBook) -> RouteBook {
    profile_routes(project_routes(book))
}

/// Projects, their single sandbox and their roster.
fn project_routes(book: RouteBook) -> RouteBook {
    book.add(
        "POST",
        "/api/v1/projects",
        "Create a project",
        body::<squadron_api::CreateProject>(),
        json::<Outcome>(),
        Access::operator(Scope::Body),
        post(create_project),
    )
    .add(
        "GET",
        "/api/v1/projects",
        "List projects",
        query::<ConsistencyQuery>(),
        json::<Vec<ProjectSummary>>(),
        Access::viewer(Scope::Unbound).and_workers(),
        get(list_projects),
    )
    .add(
        "GET",
        "/api/v1/projects/:tenant/:project",
        "Get a project with its sandbox, slots and stats",
        query::<ConsistencyQuery>(),
        json::<Project>(),
        Access::viewer(Scope::Project).and_workers(),
        get(get_project),
    )
    .add(
        "POST",
        "/api/v1/projects/:tenant/:project/sandbox",
        "Attach the project's single sandbox (INV-1)",
        body::<squadron_api::AttachSandbox>(),
        json::<Outcome>(),
        Access::operator(Scope::Project).and_workers(),
        post(attach_sandbox),
    )
    .add(
        "DELETE",
        "/api/v1/projects/:tenant/:project/sandbox/:sandbox_ref",
        "Detach the sandbox (refused while slots are held)",
        Input::NONE,
        json::<Outcome>(),
        Access::operator(Scope::Project),
        delete(detach_sandbox),
    )
    .add(
        "GET",
        "/api/v1/projects/:tenant/:project/roster",
        "The project's roster snapshot",
        query::<ConsistencyQuery>(),
        json::<RosterSnapshot>(),
        Access::viewer(Scope::Project).and_workers(),
        get(roster),
    )
}

/// Agent profiles, their capability manifests and MCP authorization.
fn profile_routes(book: RouteBook) -> RouteBook {
    book.add(
        "POST",
        "/api/v1/projects/:tenant/:project/profiles",
        "Create an agent profile",
        body::<squadron_api::CreateProfile>(),
        json::<Outcome>(),
        Access::operator(Scope::Project),
        post(create_profile),
    )
    .add(
        "GET",
        "/api/v1/projects/:tenant/:project/profiles",
        "List the project's profiles",
        query::<ConsistencyQuery>(),
        json::<Vec<AgentProfile>>(),
        Access::viewer(Scope::Project).and_workers(),
        get(list_profiles),
    )
    .add(
        "GET",
        "/api/v1/profiles/:id",
        "Get a profile: generation, live lease, capsule head, capabilities",
        query::<ConsistencyQuery>(),
        json::<AgentProfile>(),
        Access::viewer(Scope::Profile).and_workers().and_agents(),
        get(get_profile),
    )
    .add(
        "PUT",
        "/api/v1/profiles/:id/capabilities",
        "Replace the capability manifest (compare-and-swap on its version)",
        body::<squadron_api::SetCapabilities>(),
        json::<Outcome>(),
        Access::operator(Scope::Profile),
        put(set_capabilities),
    )
    .add(
        "PUT",
        "/api/v1/profiles/:id/mcp/:server",
        "Grant the profile mcp_server:use on a server",
        Input::NONE,
        json::<Outcome>(),
        Access::admin(),
        put(grant_mcp),
    )
    .add(
        "DELETE",
        "/api/v1/profiles/:id/mcp/:server",
        "Revoke mcp_server:use",
        Input::NONE,
        json::<Outcome>(),
        Access::admin(),
        delete(revoke_mcp),
    )
    .add(
        "GET",
        "/api/v1/profiles/:id/mcp/:server",
        "Check mcp_server:use for the profile subject: 200 or 403 (INV-14)",
        query::<ConsistencyQuery>(),
        json::<McpDecision>(),
        Access::viewer(Scope::Profile).and_workers().and_agents(),
        get(check_mcp),
    )
}

async fn create_project(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(b): JsonBody<CreateProject>,
) -> Result<Json<Outcome>, ApiError> {
    caller.require_project(Some((&b.tenant, &b.project)))?;
    write(
        &node,
        &caller,
        &headers,
        Command::CreateProject(cmd::CreateProject {
            tenant: b.tenant,
            project: b.project,
            max_profiles: b.max_profiles,
            max_active: b.max_active,
        }),
    )
    .await
}

pub(super) fn project_key(tenant: &str, project: &str) -> Result<(TenantId, ProjectId), ApiError> {
    Ok((parse_id("tenant", tenant)?, parse_id("project", project)?))
}

pub(crate) fn find_project<'a>(
    state: &'a squadron_core::State,
    key: &(TenantId, ProjectId),
) -> Result<&'a Project, ApiError> {
    state
        .project(&key.0, &key.1)
        .ok_or_else(|| ApiError::not_found(format!("project {}/{} not found", key.0, key.1)))
}

async fn list_projects(
    State(node): State<AppState>,
    caller: Caller,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<Vec<ProjectSummary>>, ApiError> {
    read(&node, q.consistency, |s| {
        Ok(Json(
            s.projects()
                .filter(|p| caller.sees(Some((&p.tenant, &p.project))))
                .map(|p| ProjectSummary {
                    tenant: p.tenant.clone(),
                    project: p.project.clone(),
                    profiles: p.profiles.len(),
                    slots_held: p.slots_held,
                    max_active: p.max_active,
                    sandbox: p.sandbox.as_ref().map(|s| s.sandbox_ref.clone()),
                })
                .collect(),
        ))
    })
    .await
}

async fn get_project(
    State(node): State<AppState>,
    Path((tenant, project)): Path<(String, String)>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<Project>, ApiError> {
    let key = project_key(&tenant, &project)?;
    read(&node, q.consistency, |s| {
        find_project(s, &key).cloned().map(Json)
    })
    .await
}

async fn attach_sandbox(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((tenant, project)): Path<(String, String)>,
    JsonBody(b): JsonBody<AttachSandbox>,
) -> Result<Json<Outcome>, ApiError> {
    let (tenant, project) = project_key(&tenant, &project)?;
    let command = attach_command(tenant, project, b);
    write(&node, &caller, &headers, command).await
}

pub(crate) fn attach_command(tenant: TenantId, project: ProjectId, b: AttachSandbox) -> Command {
    Command::AttachSandbox(cmd::AttachSandbox {
        tenant,
        project,
        worker: b.worker,
        runtime: b.runtime,
        sandbox_ref: b.sandbox_ref,
    })
}

async fn detach_sandbox(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((tenant, project, sandbox_ref)): Path<(String, String, String)>,
) -> Result<Json<Outcome>, ApiError> {
    let (tenant, project) = project_key(&tenant, &project)?;
    write(
        &node,
        &caller,
        &headers,
        Command::DetachSandbox(cmd::DetachSandbox {
            tenant,
            project,
            sandbox_ref,
        }),
    )
    .await
}

async fn roster(
    State(node): State<AppState>,
    Path((tenant, project)): Path<(String, String)>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<RosterSnapshot>, ApiError> {
    let key = project_key(&tenant, &project)?;
    read(&node, q.consistency, |s| {
        find_project(s, &key).map(|p| Json(p.roster.snapshot()))
    })
    .await
}

async fn create_profile(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((tenant, project)): Path<(String, String)>,
    JsonBody(b): JsonBody<CreateProfile>,
) -> Result<Json<Outcome>, ApiError> {
    let (tenant, project) = project_key(&tenant, &project)?;
    write(
        &node,
        &caller,
        &headers,
        Command::CreateProfile(cmd::CreateProfile {
            tenant,
            project,
            key: b.key,
            providers: b.providers,
            context_ref: b.context_ref,
        }),
    )
    .await
}

async fn list_profiles(
    State(node): State<AppState>,
    Path((tenant, project)): Path<(String, String)>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<Vec<AgentProfile>>, ApiError> {
    let key = project_key(&tenant, &project)?;
    read(&node, q.consistency, |s| {
        let p = find_project(s, &key)?;
        Ok(Json(
            p.profiles
                .iter()
                .filter_map(|id| s.profile(*id).cloned())
                .collect(),
        ))
    })
    .await
}

pub(super) fn profile_id(raw: &str) -> Result<ProfileId, ApiError> {
    parse_id("profile_id", raw)
}

async fn get_profile(
    State(node): State<AppState>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<AgentProfile>, ApiError> {
    let id = profile_id(&id)?;
    read(&node, q.consistency, |s| profile_of(s, id).map(Json)).await
}

async fn set_capabilities(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<SetCapabilities>,
) -> Result<Json<Outcome>, ApiError> {
    let profile = profile_id(&id)?;
    write(
        &node,
        &caller,
        &headers,
        Command::SetCapabilityManifest(cmd::SetCapabilityManifest {
            profile,
            expected_version: b.expected_version,
            required_skills: b.required_skills,
            mcp_servers: b.mcp_servers,
        }),
    )
    .await
}

fn mcp_params(id: &str, server: &str) -> Result<(ProfileId, McpServerId), ApiError> {
    Ok((profile_id(id)?, parse_id("server", server)?))
}

async fn grant_mcp(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((id, server)): Path<(String, String)>,
) -> Result<Json<Outcome>, ApiError> {
    let (profile, server) = mcp_params(&id, &server)?;
    write(
        &node,
        &caller,
        &headers,
        Command::GrantMcpUse(cmd::GrantMcpUse { profile, server }),
    )
    .await
}

async fn revoke_mcp(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((id, server)): Path<(String, String)>,
) -> Result<Json<Outcome>, ApiError> {
    let (profile, server) = mcp_params(&id, &server)?;
    write(
        &node,
        &caller,
        &headers,
        Command::RevokeMcpUse(cmd::RevokeMcpUse { profile, server }),
    )
    .await
}

async fn check_mcp(
    State(node): State<AppState>,
    Path((id, server)): Path<(String, String)>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<McpDecision>, ApiError> {
    let (profile, server) = mcp_params(&id, &server)?;
    let denials = &node.counters.mcp_denials;
    read(&node, q.consistency, |s| {
        mcp_decision(denials, s, profile, server).map(Json)
    })
    .await
}

/// INV-14's decision on one use of an MCP server, for REST, the agent service and the
/// workers' MCP gateways alike: allowed only with the profile's own relation tuple; a refusal
/// is counted for `squadron evidence`.
pub(crate) fn mcp_decision(
    denials: &McpDenials,
    s: &squadron_core::State,
    profile: ProfileId,
    server: McpServerId,
) -> Result<McpDecision, ApiError> {
    let p = s
        .profile(profile)
        .ok_or_else(|| ApiError::not_found(format!("profile {profile} not found")))?;
    if !s.mcp_use_allowed(profile, &server) {
        denials.record(&p.tenant, &p.project);
        return Err(squadron_core::Rejection::PermissionDenied {
            reason: format!("{} has no mcp_server:use relation to {server}", p.subject),
        }
        .into());
    }
    Ok(McpDecision {
        subject: p.subject.clone(),
        server,
        allowed: true,
    })
}

pub(crate) fn profile_of(
    s: &squadron_core::State,
    id: ProfileId,
) -> Result<AgentProfile, ApiError> {
    s.profile(id)
        .cloned()
        .ok_or_else(|| ApiError::not_found(format!("profile {id} not found")))
}
