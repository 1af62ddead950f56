//! Agent profiles (`placement: project`): the worker's side of the identity runtime
//! (ADR-0011). The supervisor's module documentation gives the order of every step; each
//! step has a file of its own.

pub(crate) mod adoption;
pub(crate) mod agent_logs;
pub(crate) mod agent_usage;
pub(crate) mod api;
pub(crate) mod attempt;
pub(crate) mod catch_up;
pub(crate) mod config;
pub(crate) mod credentials;
pub(crate) mod detached;
pub(crate) mod error;
pub(crate) mod evidence;
pub(crate) mod evidence_ledger;
pub(crate) mod exits;
pub(crate) mod fence;
pub(crate) mod launch;
pub(crate) mod lease_end;
pub(crate) mod mailbox;
pub(crate) mod mcp_access;
pub(crate) mod mcp_gateway;
pub(crate) mod native_session;
pub(crate) mod project_sandbox;
pub(crate) mod registry;
pub(crate) mod renewal;
pub(crate) mod runtime;
pub(crate) mod state;
pub(crate) mod stop;
pub(crate) mod stream_capsule;
pub(crate) mod supervisor;
pub(crate) mod takeover;
