//! Generated gRPC code for Squadron's services, and the conversions of its typed messages to
//! the core's types (`task_spec`).

#[allow(
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations,
    unreachable_pub
)]
pub mod v1 {
    tonic::include_proto!("squadron.v1");
}

mod task_spec;

pub use task_spec::SpecError;
