//! Squadron's worker: it registers with the control plane, watches the tasks assigned to it,
//! and drives each one through the lifecycle of `task-run-lifecycle.txt` — staging, a sandbox
//! from one of its runtimes, the provider run, artifact collection — committing every
//! transition through the control plane before it acts on the next stage (INV-10).
//!
//! Map: `task_dir` (the on-disk layout of a task), `runtime` (the sandbox trait every runtime
//! implements), `process_runtime` (cgroup v2 + bubblewrap, via `squadron-isolation`),
//! `docker_runtime` (bollard), `staging` (clone, TASK.md, progress files), `collector`
//! (patch, untracked list, pattern artifacts, metadata), `launcher` (provider command lines).

pub mod checkpoint;
pub mod config;
pub mod control_link;
pub mod docker_runtime;
pub mod error;
pub mod output_counter;
pub mod output_server;
pub mod runtime;
pub mod runtime_probe;
pub mod task_dir;
pub mod task_driver;
pub mod worker;

pub use error::WorkerError;
pub use runtime::{Runtime, SandboxHandle};
pub use task_dir::TaskDir;
pub use config::WorkerConfig;
pub use runtime_probe::probe_runtimes;
pub use worker::{start, RunningWorker};
