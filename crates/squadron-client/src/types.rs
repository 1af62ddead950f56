//! The REST bodies and query strings, re-exported from `squadron-api` (where the server
//! decodes the same types). Domain values — `Outcome`, `Task`, `AgentProfile`,
//! `RuntimeLease`, … — come from `squadron-core`.

pub use squadron_api::agents::*;
pub use squadron_api::leases::*;
pub use squadron_api::{
    AddLearner, ArtifactEntry, AttachSandbox, ClusterStatus, CreateProfile, CreateProject,
    Decommission, McpDecision, MemberView, MembershipChanged, ProjectSummary, PromoteVoter,
    RegisterWorker, ReportProgress, ReportTransition, SetCapabilities, TaskListQuery, TaskOrder,
    TaskPage,
};
