//! Generated gRPC code for Squadron's services.

#[allow(
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations,
    unreachable_pub
)]
pub mod v1 {
    tonic::include_proto!("squadron.v1");
}
