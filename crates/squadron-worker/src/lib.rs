//! Squadron's worker: it registers with the control plane, watches the tasks assigned to it,
//! and drives each one through the lifecycle of `task-run-lifecycle.txt` — staging, a sandbox
//! from one of its runtimes, the provider run, artifact collection — committing every
//! transition through the control plane before it acts on the next stage (INV-10).
//!
//! Map: `task_dir` (the on-disk layout of a task), `runtime` (the sandbox trait every runtime
//! implements), `process_runtime` (cgroup v2 + bubblewrap, via `squadron-isolation`),
//! `docker_runtime` (bollard), `staging` (clone, TASK.md, progress files), `collector`
//! (patch, untracked list, pattern artifacts, metadata; patterns in `artifact_pattern`),
//! `launcher` (provider command lines, `launch.sh`; with `env_allowlist` and `shell_quote`).

pub mod artifact_pattern;
pub mod collector;
pub mod env_allowlist;
pub mod error;
pub mod launcher;
pub mod runtime;
pub mod shell_quote;
pub mod staging;
mod support;
pub mod task_dir;
#[cfg(test)]
mod test_support;

pub use collector::{collect, collect_with_limits, CollectLimits, CollectReport, RunFacts};
pub use env_allowlist::EnvAllowlist;
pub use error::WorkerError;
pub use launcher::{prepare_launch, LaunchPlan};
pub use runtime::{Runtime, SandboxHandle};
pub use staging::{stage, StagingOptions, StagingReport};
pub use task_dir::TaskDir;
