//! Generated gRPC code for Squadron's services, and the conversions of its typed messages to
//! the core's types (`task_spec`, `worker_policy`; both refuse with a [`ConversionError`];
//! `provider_progress`);
//! `WorkerControl`, whose messages are the API's serde types in JSON (`json_codec`).

#[allow(
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations,
    unreachable_pub
)]
pub mod v1 {
    tonic::include_proto!("squadron.v1");
    // `WorkerControl` (build.rs: generated without a .proto file, JSON-encoded).
    include!(concat!(env!("OUT_DIR"), "/squadron.v1.WorkerControl.rs"));
}

pub mod json_codec;

mod conversion_error;
mod provider_progress;
mod task_spec;
mod worker_policy;

pub use conversion_error::ConversionError;
