//! The one place a caller is held to a route's [`Access`]: allowed, 401 or 403.

use squadron_api::{Access, Scope};
use squadron_core::access::{AgentIdentity, ProjectScope, Role};
use squadron_core::ids::{ProfileId, ProjectId, TaskId, TenantId, WorkerId};
use squadron_core::State;

use super::{AuthError, Caller};

/// The object a call touches, as the path names it and the state resolves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Nothing to resolve: a cluster-wide route.
    Cluster,
    /// The handler filters or checks once it has parsed the request (listings, bodies).
    Deferred,
    /// The path names an object that does not exist or cannot be parsed: the handler answers
    /// 404 or 400, and a scope has nothing to say about it.
    Missing,
    Project(TenantId, ProjectId),
    Profile {
        id: ProfileId,
        tenant: TenantId,
        project: ProjectId,
    },
    Task {
        id: TaskId,
        /// `None`: a dedicated task, outside any project.
        project: Option<(TenantId, ProjectId)>,
        parent: Option<TaskId>,
    },
    Worker(WorkerId),
}

impl Target {
    /// Resolves what the path parameters name under the route's scope.
    pub fn resolve(scope: Scope, state: &State, param: impl Fn(&str) -> Option<String>) -> Target {
        let id = || param("id");
        match scope {
            Scope::Cluster => Target::Cluster,
            Scope::Unbound | Scope::Body => Target::Deferred,
            Scope::Project => match (param("tenant"), param("project")) {
                (Some(t), Some(p)) => match (TenantId::new(t), ProjectId::new(p)) {
                    (Ok(t), Ok(p)) => Target::Project(t, p),
                    _ => Target::Missing,
                },
                _ => Target::Missing,
            },
            Scope::Profile => number(id())
                .and_then(|n| ProfileId::new(n).ok())
                .and_then(|p| state.profile(p))
                .map_or(Target::Missing, |p| Target::Profile {
                    id: p.id,
                    tenant: p.tenant.clone(),
                    project: p.project.clone(),
                }),
            Scope::Lease => number(id())
                .and_then(|n| squadron_core::ids::LeaseId::new(n).ok())
                .and_then(|l| state.lease(l))
                .map_or(Target::Missing, |l| Target::Profile {
                    id: l.profile,
                    tenant: l.tenant.clone(),
                    project: l.project.clone(),
                }),
            Scope::Task => number(id())
                .and_then(|n| TaskId::new(n).ok())
                .and_then(|t| state.task(t))
                .map_or(Target::Missing, |t| Target::Task {
                    id: t.id,
                    project: t.spec.placement.project(),
                    parent: state.lineage().parent(t.id),
                }),
            Scope::Worker => id()
                .and_then(|w| WorkerId::new(w).ok())
                .map_or(Target::Missing, Target::Worker),
        }
    }
}

fn number(raw: Option<String>) -> Option<u64> {
    raw?.parse().ok()
}

/// Allowed, or why not.
pub fn decide(access: &Access, caller: &Caller, target: &Target) -> Result<(), AuthError> {
    if access.public {
        return Ok(());
    }
    match caller {
        Caller::Anonymous => Err(AuthError::Unauthenticated(
            "this route needs a bearer token or a client certificate".into(),
        )),
        Caller::Operator { role, scope, .. } => operator(access, *role, scope, target),
        Caller::Worker(w) => worker(access, w, target),
        Caller::Agent(a) => agent(access, a, target),
        Caller::Node(id) => Err(AuthError::forbidden(format!(
            "node {id}'s certificate speaks for no caller on this listener"
        ))),
    }
}

fn operator(
    access: &Access,
    role: Role,
    scope: &[ProjectScope],
    target: &Target,
) -> Result<(), AuthError> {
    let Some(needed) = access.role else {
        return Err(AuthError::forbidden(
            "only a worker's or an agent's certificate may call this, not a bearer token",
        ));
    };
    if !role.grants(needed) {
        return Err(AuthError::forbidden(format!(
            "this needs the {} role; the token has {}",
            needed.as_str(),
            role.as_str()
        )));
    }
    if scope.is_empty() {
        return Ok(());
    }
    let covers = |t: &TenantId, p: &ProjectId| scope_covers(scope, t, p);
    match target {
        Target::Deferred | Target::Missing => Ok(()),
        Target::Project(t, p)
        | Target::Profile {
            tenant: t,
            project: p,
            ..
        } if covers(t, p) => Ok(()),
        Target::Task {
            project: Some((t, p)),
            ..
        } if covers(t, p) => Ok(()),
        Target::Task {
            project: None, id, ..
        } => Err(AuthError::forbidden(format!(
            "task {id} is a dedicated task outside any project; a token scoped to projects \
             cannot reach it"
        ))),
        Target::Cluster | Target::Worker(_) => Err(AuthError::forbidden(
            "a token scoped to projects cannot use a cluster-wide route",
        )),
        _ => Err(AuthError::forbidden("outside the token's scope")),
    }
}

fn worker(access: &Access, me: &WorkerId, target: &Target) -> Result<(), AuthError> {
    if !access.worker {
        return Err(AuthError::forbidden(format!(
            "a worker's certificate (worker {me}) may not call this"
        )));
    }
    match target {
        Target::Worker(w) if w != me => Err(AuthError::forbidden(format!(
            "worker {me} may not act for worker {w}"
        ))),
        _ => Ok(()),
    }
}

fn agent(access: &Access, me: &AgentIdentity, target: &Target) -> Result<(), AuthError> {
    let refuse = || AuthError::forbidden(format!("agent {me} may reach only its own objects"));
    if !access.agent {
        return Err(AuthError::forbidden(format!(
            "an agent's certificate (agent {me}) may not call this"
        )));
    }
    match (me, target) {
        (_, Target::Deferred | Target::Missing) => Ok(()),
        (AgentIdentity::Task(mine), Target::Task { id, parent, .. })
            if id == mine || parent.as_ref() == Some(mine) =>
        {
            Ok(())
        }
        (AgentIdentity::ProfileGeneration { profile, .. }, Target::Profile { id, .. })
            if id == profile =>
        {
            Ok(())
        }
        _ => Err(refuse()),
    }
}

/// Whether an operator's scope (empty: everywhere) covers a project; listings use it.
pub fn scope_covers(scope: &[ProjectScope], tenant: &TenantId, project: &ProjectId) -> bool {
    scope.is_empty() || scope.iter().any(|s| s.covers(tenant, Some(project)))
}
