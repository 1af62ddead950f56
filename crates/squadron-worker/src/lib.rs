//! Squadron's worker: it registers with the control plane, watches the tasks assigned to it,
//! and drives each one through the lifecycle of `task-run-lifecycle.txt` — staging, a sandbox
//! from one of its runtimes, the provider run, artifact collection — committing every
//! transition through the control plane before it acts on the next stage (INV-10).
//!
//! Map: `task_dir` (the on-disk layout of a task), `runtime` (the sandbox trait every runtime
//! implements), `process_runtime` (cgroup v2 + bubblewrap, via `squadron-isolation`),
//! `docker_runtime` (bollard), `staging` (clone, TASK.md, progress files), `collector`
//! (patch, untracked list, pattern artifacts, metadata), `launcher` (provider command lines).

pub mod error;
pub mod process_runtime;
pub mod runtime;
pub mod task_dir;

pub use error::WorkerError;
pub use process_runtime::{ProcessRuntime, ProcessRuntimeConfig};
pub use runtime::{Runtime, SandboxHandle};
pub use task_dir::TaskDir;
