//! Squadron's Jepsen-style chaos suite: a harness that drives real `squadron server`
//! processes under faults and records a history, and checkers that judge it (a WGL
//! linearizability search per key, and the design's invariants).

pub mod anomaly;
pub mod checker;
pub mod event;
pub mod history;
pub mod invariants;
pub mod model;
pub mod model_capsule;
pub mod model_cas;
pub mod model_lease;
pub mod node_final;
pub mod operation;
pub mod results;
pub mod wgl;

#[cfg(test)]
mod tests;
