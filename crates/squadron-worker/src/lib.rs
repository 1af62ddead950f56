//! Squadron's worker: it registers with the control plane, watches the tasks assigned to it,
//! and drives each one through the lifecycle of `task-run-lifecycle.txt` — staging, a sandbox
//! from one of its runtimes, the provider run, artifact collection — committing every
//! transition through the control plane before it acts on the next stage (INV-10). For
//! `placement: project` it also runs agent profiles' providers under runtime leases.
//!
//! Map, by room:
//! - `worker` (start, the heartbeat and assignment loops), `control_link` (the worker's side
//!   of the control plane protocol: keyed reports, reads, the assignment stream),
//!   `output_server` (logs, artifacts, live stream), `config`, `retry` (the pauses of every
//!   retry, through `backon`), `support` (the durable atomic write, path removal).
//! - `task/`: one task attempt — `driver` (the lifecycle steps; `driver/provision` the
//!   provisioning retries), `staging/` (clone, checkout, TASK.md, URL redaction, progress
//!   files), `collector/` (patch, untracked list, pattern artifacts with `artifact_pattern`,
//!   the `.git` guard, metadata), `launcher` (provider command lines, `launch.sh`),
//!   `task_dir` (the on-disk layout), `checkpoint` (`state.json`), `output_counter`,
//!   `env_allowlist`.
//! - `agent/`: agent profiles — `supervisor` (the supervisor and its loops) over `registry`
//!   (its state behind one lock) and `state` (its own `AgentState`, `ReapProof`), with one
//!   file per step: `launch`, `takeover` (graceful and crash, one tail), `stop`,
//!   `lease_end`, `renewal` (a pure decide step), `exits`, `mailbox`, `adoption`,
//!   `evidence`; `attempt` (one provider attempt in its own cgroup leaf and boundary),
//!   `project_sandbox/` (one clone, a worktree per profile, start and reap records),
//!   `runtime` (where attempts' leaves live), `fence` (the Git broker's fence), `api` (the
//!   HTTP edge, where `AgentState` becomes `AgentView`), `config`, `error`, and
//!   `watchdog.sh` (the self-fencing watchdog, included at build time).
//! - `runtime/`: the `Runtime` trait and its implementations, `process` (cgroup v2 +
//!   bubblewrap, via `squadron-isolation`) and `docker` (bollard); `probe` says which this
//!   host offers. KVM comes later.
//!
//! Public: [`start`], the configuration ([`WorkerConfig`], [`AgentConfig`]), the runtime
//! probe, and [`ControlFence`] for a Git broker checked against the control plane.

pub(crate) mod agent;
mod cert_renewal;
pub(crate) mod config;
pub(crate) mod control_link;
pub(crate) mod egress;
pub(crate) mod error;
pub(crate) mod http1_server;
pub(crate) mod output_server;
pub(crate) mod retry;
pub(crate) mod runtime;
pub(crate) mod support;
pub(crate) mod task;
#[cfg(test)]
mod test_support;
pub(crate) mod worker;
pub(crate) mod worker_metrics;

pub use agent::config::{
    AgentConfig, ProviderLauncher, AGENT_LEASE_TTL_MS_DEFAULT, AGENT_STOP_GRACE_MS_DEFAULT,
    AGENT_STOP_GRACE_MS_MAX, DETACHED_SANDBOX_RETENTION_MS_DEFAULT,
    DETACHED_SWEEP_INTERVAL_MS_DEFAULT, SELF_FENCE_MARGIN_MS_DEFAULT,
};
pub use agent::fence::ControlFence;
pub use agent::mcp_gateway::{parse_mcp_server, MCP_ANSWER_BYTES_MAX, MCP_MESSAGE_BYTES_MAX};
pub use config::{
    host_of_url, SandboxDefaults, VmConfig, WorkerConfig, CAPACITY_DEFAULT, CAPACITY_MAX,
    DOCKER_IMAGE_DEFAULT, HEARTBEAT_INTERVAL_MS_DEFAULT, HEARTBEAT_INTERVAL_MS_MIN,
    MONITOR_INTERVAL_MS_DEFAULT, PROGRESS_INTERVAL_MS_DEFAULT, SANDBOX_CPUS_DEFAULT,
    SANDBOX_MEMORY_BYTES_DEFAULT, SANDBOX_PIDS_DEFAULT,
};
pub use error::WorkerError;
pub use runtime::probe::{probe_runtimes, RuntimeSet};
pub use task::output_retention::{
    OutputRetention, OUTPUT_RETENTION_MS_MAX, OUTPUT_RETENTION_MS_MIN,
};
pub use worker::{start, RunningWorker};
