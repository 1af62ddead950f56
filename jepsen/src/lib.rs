//! Squadron's Jepsen-style chaos suite: a harness that drives real `squadron server`
//! processes under faults and records a history, and checkers that judge it (a WGL
//! linearizability search per key, and the design's invariants).

pub mod anomaly;
pub mod checker;
pub mod child;
pub mod client_capsule;
pub mod client_cas;
pub mod client_expiry;
pub mod client_keyed;
pub mod client_lease;
pub mod client_takeover;
pub mod client_task;
pub mod clock_check;
pub mod cluster;
pub mod digest_sampler;
pub mod driver;
pub mod event;
pub mod fault;
pub mod history;
pub mod invariants;
pub mod late_writer;
pub mod lazyfs;
pub mod model;
pub mod model_capsule;
pub mod model_cas;
pub mod model_expiry;
pub mod model_lease;
pub mod model_project;
pub mod model_takeover;
pub mod model_task;
pub mod nemesis;
pub mod netns;
pub mod node;
pub mod node_final;
pub mod operation;
pub mod outcome;
pub mod packet_delay;
pub mod recorder;
pub mod recovery;
pub mod report;
pub mod results;
pub mod runner;
pub mod takeover_evidence;
pub mod verdict;
pub mod wgl;
pub mod worker_process;
pub mod workload;
pub mod workload_context;

#[cfg(test)]
mod tests;
