//! Squadron's worker: it registers with the control plane, watches the tasks assigned to it,
//! and drives each one through the lifecycle of `task-run-lifecycle.txt` — staging, a sandbox
//! from one of its runtimes, the provider run, artifact collection — committing every
//! transition through the control plane before it acts on the next stage (INV-10).
//!
//! Map: `task_dir` (the on-disk layout of a task), `runtime` (the sandbox trait every runtime
//! implements), `process_runtime` (cgroup v2 + bubblewrap, via `squadron-isolation`),
//! `docker_runtime` (bollard), `staging` (clone, TASK.md, progress files), `collector`
//! (patch, untracked list, pattern artifacts, metadata; patterns in `artifact_pattern`),
//! `launcher` (provider command lines, `launch.sh`; with `env_allowlist`);
//! for `placement: project`, `project_sandbox` (one clone, a worktree per profile),
//! `agent_runtime` (where attempts' cgroup leaves live) and `agent_attempt` (one provider
//! attempt of a profile generation in its own leaf and boundary), `agent_supervisor` (leases,
//! renewals, self-fencing, takeovers, mailbox delivery) behind `agent_api`.

pub mod agent_api;
pub mod agent_attempt;
pub mod agent_config;
pub mod agent_error;
pub mod agent_runtime;
pub mod agent_supervisor;
pub mod artifact_pattern;
pub mod checkpoint;
pub mod collector;
pub mod config;
pub mod control_fence;
pub mod control_link;
pub mod docker_runtime;
pub mod env_allowlist;
pub mod error;
pub mod launcher;
pub mod output_counter;
pub mod output_server;
pub mod process_runtime;
pub mod project_sandbox;
pub mod runtime;
pub mod runtime_probe;
pub mod staging;
mod support;
pub mod task_dir;
pub mod task_driver;
#[cfg(test)]
mod test_support;
pub mod worker;

pub use agent_attempt::{AgentAttempt, AgentLaunch};
pub use agent_config::{AgentConfig, ProviderLauncher};
pub use agent_error::AgentError;
pub use agent_runtime::AgentRuntime;
pub use agent_supervisor::AgentSupervisor;
pub use collector::{collect, collect_with_limits, CollectLimits, CollectReport, RunFacts};
pub use config::WorkerConfig;
pub use env_allowlist::EnvAllowlist;
pub use error::WorkerError;
pub use launcher::{prepare_launch, LaunchPlan};
pub use process_runtime::{ProcessRuntime, ProcessRuntimeConfig};
pub use project_sandbox::{ProfilePaths, ProjectSandbox};
pub use runtime::{Runtime, SandboxHandle};
pub use runtime_probe::probe_runtimes;
pub use staging::{stage, StagingOptions, StagingReport};
pub use task_dir::TaskDir;
pub use worker::{start, RunningWorker};
