//! Who may call a route or a gRPC method (DESIGN §5). Every REST route and every gRPC method
//! has exactly one [`Access`]: the server's router is built from the rows that carry them,
//! the OpenAPI document publishes them (`x-squadron-access`), and the table-driven test walks
//! them. A caller without a credential on a non-public row gets 401; a caller whose
//! credential the row does not admit gets 403.

use schemars::JsonSchema;
use serde::Serialize;
use squadron_core::access::Role;

/// Where the object a call touches is found, so a scoped token, a worker or an agent can be
/// held to its own objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// No object: cluster-wide (membership, workers, tokens). A token scoped to projects
    /// cannot use it.
    Cluster,
    /// The path names it: `:tenant/:project`.
    Project,
    /// The path's `:id` is a profile; its project decides.
    Profile,
    /// The path's `:id` is a lease; its profile's project decides.
    Lease,
    /// The path's `:id` is a task; its placement's project decides (a dedicated task belongs
    /// to no project, so only an unscoped token reaches it). An agent reaches its own task
    /// and the children it submitted.
    Task,
    /// Any token of the role, whatever its scope: a listing the handler filters to what the
    /// scope covers, or a route that shows nothing of any project (cluster status, workers).
    Unbound,
    /// The body names the project (creation, submission): the handler checks it once parsed.
    Body,
    /// The path's `:id` is a worker: a worker certificate reaches only its own.
    Worker,
}

/// The rule of one route or method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, JsonSchema)]
pub struct Access {
    /// Anyone may call it, without a credential.
    pub public: bool,
    /// The least role a bearer token needs; `None`: no bearer token may call it.
    pub role: Option<Role>,
    /// A worker certificate may call it. The core then holds the worker to itself: its own
    /// registration, its own tasks' reports, its own leases' renewals and evidence.
    pub worker: bool,
    /// An agent certificate may call it, for its own objects (its task and that task's
    /// children, or its own profile).
    pub agent: bool,
    pub scope: Scope,
}

impl Access {
    /// Health, readiness, the API document, the dashboard's page.
    pub const PUBLIC: Access = Access {
        public: true,
        role: None,
        worker: false,
        agent: false,
        scope: Scope::Cluster,
    };

    /// Reads: a viewer's token or better, in scope.
    pub const fn viewer(scope: Scope) -> Access {
        Access::bearer(Role::Viewer, scope)
    }

    /// Changes to projects, profiles, agents, leases and tasks: an operator's token or an
    /// admin's, in scope.
    pub const fn operator(scope: Scope) -> Access {
        Access::bearer(Role::Operator, scope)
    }

    /// Membership, tokens, credentials, decommission, MCP grants, the audit record.
    pub const fn admin() -> Access {
        Access::bearer(Role::Admin, Scope::Cluster)
    }

    /// Reports only a worker sends (registration, heartbeats, transitions, renewals).
    pub const fn worker_only(scope: Scope) -> Access {
        Access {
            public: false,
            role: None,
            worker: true,
            agent: false,
            scope,
        }
    }

    const fn bearer(role: Role, scope: Scope) -> Access {
        Access {
            public: false,
            role: Some(role),
            worker: false,
            agent: false,
            scope,
        }
    }

    /// Workers may call it too: the calls a worker makes while running agent profiles.
    pub const fn and_workers(self) -> Access {
        Access {
            worker: true,
            ..self
        }
    }

    /// Agents may call it too, for their own objects.
    pub const fn and_agents(self) -> Access {
        Access {
            agent: true,
            ..self
        }
    }
}

/// Every gRPC method on the API listener with its rule (the peer listener's Raft service
/// admits node certificates only and is not listed). Paths are `/{package}.{service}/{method}`.
/// A gRPC call has no path parameters, so the worker's methods are `Body` where their REST
/// routes say `Worker`: the same rule, a worker's certificate only and for its own id, held by
/// the core (`require_worker`) against the worker the request names.
pub const GRPC_METHODS: &[(&str, Access)] = &[
    (
        "/squadron.v1.WorkerService/Register",
        Access::worker_only(Scope::Body),
    ),
    (
        "/squadron.v1.WorkerService/SetWorkerPolicy",
        Access::worker_only(Scope::Body),
    ),
    (
        "/squadron.v1.WorkerService/Heartbeat",
        Access::worker_only(Scope::Body),
    ),
    (
        "/squadron.v1.WorkerService/WatchAssignments",
        Access::worker_only(Scope::Body),
    ),
    (
        "/squadron.v1.WorkerService/ReportTransition",
        Access::worker_only(Scope::Body),
    ),
    (
        "/squadron.v1.WorkerService/ReportProgress",
        Access::worker_only(Scope::Body),
    ),
    (
        "/squadron.v1.WorkerService/RenewLeases",
        Access::worker_only(Scope::Body),
    ),
    (
        "/squadron.v1.WorkerService/RecordReapEvidence",
        Access::worker_only(Scope::Body),
    ),
    ("/squadron.v1.AgentService/AcquireLease", AGENT_ONLY),
    ("/squadron.v1.AgentService/RenewLease", AGENT_ONLY),
    ("/squadron.v1.AgentService/ReleaseLease", AGENT_ONLY),
    ("/squadron.v1.AgentService/CommitCapsule", AGENT_ONLY),
    ("/squadron.v1.AgentService/CheckMcpUse", AGENT_ONLY),
    ("/squadron.v1.AgentService/Register", AGENT_ONLY),
    ("/squadron.v1.AgentService/Heartbeat", AGENT_ONLY),
    ("/squadron.v1.AgentService/AwaitRun", AGENT_ONLY),
    ("/squadron.v1.AgentService/RenewCertificate", AGENT_ONLY),
    ("/squadron.v1.WorkerControl/AcquireLease", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/ReleaseLease", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/Takeover", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/CommitCapsule", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/AckMessages", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/AttachSandbox", WORKER_CONTROL),
    (
        "/squadron.v1.WorkerControl/GrantCredentialLease",
        WORKER_CONTROL,
    ),
    (
        "/squadron.v1.WorkerControl/RenewCertificate",
        WORKER_CONTROL,
    ),
    ("/squadron.v1.WorkerControl/CheckFence", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/GetProfile", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/GetLease", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/ListCapsules", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/GetProject", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/GetRoster", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/ReadMailbox", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/GetTask", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/HeldLeases", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/MintAgentToken", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/GetAgentSession", WORKER_CONTROL),
    (
        "/squadron.v1.WorkerControl/GrantAgentCredentialLease",
        WORKER_CONTROL,
    ),
    (
        "/squadron.v1.WorkerControl/GetProfileCredentials",
        WORKER_CONTROL,
    ),
    ("/squadron.v1.WorkerControl/CheckMcpUse", WORKER_CONTROL),
    ("/squadron.v1.WorkerControl/McpGrants", WORKER_CONTROL),
    (
        "/squadron.v1.WorkerControl/GetCredentialLease",
        WORKER_CONTROL,
    ),
    (
        "/squadron.v1.WorkerControl/GetAgentCredentialLease",
        WORKER_CONTROL,
    ),
];

/// The worker's calls that REST serves too (`worker_control`): a worker's certificate only.
/// The REST routes also admit workers for any profile, lease or task; the one call a worker
/// makes for itself alone, its certificate's renewal, is held to its own id by the handler.
const WORKER_CONTROL: Access = Access::worker_only(Scope::Body);

/// The agent service: an agent certificate, for its own profile or task (checked by each
/// method).
const AGENT_ONLY: Access = Access {
    public: false,
    role: None,
    worker: false,
    agent: true,
    scope: Scope::Body,
};

/// The rule of a gRPC method, if the table has one.
pub fn grpc_access(path: &str) -> Option<Access> {
    GRPC_METHODS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, access)| *access)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_methods_are_listed_once() {
        let mut paths: Vec<&str> = GRPC_METHODS.iter().map(|(p, _)| *p).collect();
        paths.sort_unstable();
        let before = paths.len();
        paths.dedup();
        assert_eq!(paths.len(), before, "a method listed twice");
        assert!(grpc_access("/squadron.v1.RaftService/Vote").is_none());
        assert!(grpc_access("/squadron.v1.WorkerService/ReportTransition")
            .is_some_and(|a| a.worker && a.role.is_none()));
    }

    #[test]
    fn the_rule_serializes_for_the_document() {
        let v = serde_json::to_value(Access::viewer(Scope::Profile).and_workers()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"public": false, "role": "viewer", "worker": true, "agent": false, "scope": "profile"})
        );
    }
}
