//! One task attempt on this worker, from STAGING to its end: the driver walks the lifecycle,
//! each step built from the files and modules of this room.

pub(crate) mod agent_relay;
pub(crate) mod checkpoint;
pub(crate) mod collector;
pub(crate) mod credential_session;
pub(crate) mod driver;
pub(crate) mod env_allowlist;
pub(crate) mod launcher;
pub(crate) mod outbox_reader;
pub(crate) mod output_counter;
pub(crate) mod output_retention;
pub(crate) mod provider_progress;
pub(crate) mod provider_stream;
pub(crate) mod sandbox_agent;
pub(crate) mod secret_shapes;
pub(crate) mod staging;
pub(crate) mod task_dir;
pub(crate) mod task_usage;
pub(crate) mod task_volume;
