//! The REST bodies, re-exported from `squadron-api` (where the server decodes the same types),
//! and the client's own query filters. Domain values — `Outcome`, `Task`, `AgentProfile`,
//! `RuntimeLease`, … — come from `squadron-core`.

pub use squadron_api::agents::*;
pub use squadron_api::leases::*;
pub use squadron_api::{
    AddLearner, ArtifactEntry, AttachSandbox, ClusterStatus, CreateProfile, CreateProject,
    Decommission, McpDecision, MemberView, MembershipChanged, ProjectSummary, PromoteVoter,
    RegisterWorker, ReportProgress, ReportTransition, SetCapabilities, TaskPage,
};

use squadron_core::task::TaskState;

// --- tasks -----------------------------------------------------------------------------------

/// Filters of `GET /api/v1/tasks`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskQuery {
    pub state: Option<TaskState>,
    pub after: Option<u64>,
    pub limit: Option<usize>,
}
