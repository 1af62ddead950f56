//! Agent profiles (`placement: project`): the worker's side of the identity runtime
//! (ADR-0011). The supervisor's module documentation gives the order of every step.

pub(crate) mod api;
pub(crate) mod attempt;
pub(crate) mod config;
pub(crate) mod error;
pub(crate) mod fence;
pub(crate) mod project_sandbox;
pub(crate) mod runtime;
pub(crate) mod supervisor;
