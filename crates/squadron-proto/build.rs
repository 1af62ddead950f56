//! Compiles proto/ with protox (a pure-Rust protobuf compiler: the machine has no protoc).

use std::path::PathBuf;

// CARGO_MANIFEST_DIR is read at run time: the build directory is shared between clones at
// different paths, and a compiled-in path would point at whichever clone built it first.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        "squadron/v1/common.proto",
        "squadron/v1/raft.proto",
        "squadron/v1/task_spec.proto",
        "squadron/v1/worker.proto",
        "squadron/v1/agent.proto",
    ];
    let paths: Vec<PathBuf> = files.iter().map(|f| root.join(f)).collect();
    // Relative to the package (cargo's rule for relative paths), so a clone at another path
    // does not look changed and rebuild everything that depends on the generated code.
    for f in &files {
        println!("cargo:rerun-if-changed=../../proto/{f}");
    }
    let fds = protox::compile(&paths, [&root])?;
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    tonic_build::manual::Builder::new().compile(&[worker_control()]);
    Ok(())
}

/// `squadron.v1.WorkerControl`: the worker's calls that REST serves too, in the API's own
/// types, JSON-encoded (`src/json_codec.rs`, `squadron_api::worker_control`). Each row:
/// method, request, answer.
fn worker_control() -> tonic_build::manual::Service {
    const API: &str = "squadron_api";
    const CORE: &str = "squadron_core";
    let rows: [(&str, String, String); 25] = [
        (
            "AcquireLease",
            addressed("ids::ProfileId", "leases::AcquireLease"),
            outcome(),
        ),
        (
            "ReleaseLease",
            addressed("ids::LeaseId", "leases::LeaseFence"),
            outcome(),
        ),
        (
            "Takeover",
            addressed("ids::ProfileId", "leases::Takeover"),
            outcome(),
        ),
        (
            "CommitCapsule",
            addressed("ids::ProfileId", "leases::CommitCapsule"),
            outcome(),
        ),
        (
            "AckMessages",
            addressed("ids::ProfileId", "leases::AckMessages"),
            outcome(),
        ),
        (
            "AttachSandbox",
            format!("{API}::Addressed<{API}::ProjectRef, {API}::AttachSandbox>"),
            outcome(),
        ),
        (
            "GrantCredentialLease",
            addressed("ids::TaskId", "GrantCredentialLease"),
            format!("{API}::CredentialLeaseGrant"),
        ),
        (
            "RenewCertificate",
            addressed("ids::WorkerId", "RenewCertificate"),
            format!("{API}::Enrolled"),
        ),
        (
            "CheckFence",
            format!("{CORE}::lease::FencingToken"),
            format!("{API}::CurrentWriter"),
        ),
        (
            "GetProfile",
            format!("{CORE}::ids::ProfileId"),
            format!("{CORE}::profile::AgentProfile"),
        ),
        (
            "GetLease",
            format!("{CORE}::ids::LeaseId"),
            format!("{CORE}::lease::RuntimeLease"),
        ),
        (
            "ListCapsules",
            format!("{CORE}::ids::ProfileId"),
            format!("Vec<{CORE}::capsule::ContinuityCapsule>"),
        ),
        (
            "GetProject",
            format!("{API}::ProjectRef"),
            format!("{CORE}::project::Project"),
        ),
        (
            "GetRoster",
            format!("{API}::ProjectRef"),
            format!("{CORE}::roster::RosterSnapshot"),
        ),
        (
            "ReadMailbox",
            format!("{CORE}::ids::ProfileId"),
            format!("{CORE}::mailbox::Mailbox"),
        ),
        (
            "GetTask",
            format!("{CORE}::ids::TaskId"),
            format!("{CORE}::task::Task"),
        ),
        (
            "HeldLeases",
            format!("{CORE}::ids::WorkerId"),
            format!("Vec<{CORE}::lease::RuntimeLease>"),
        ),
        (
            "MintAgentToken",
            addressed("ids::TaskId", "MintAgentToken"),
            format!("{API}::MintedAgentToken"),
        ),
        (
            "GetAgentSession",
            format!("{CORE}::ids::TaskId"),
            format!("Option<{CORE}::agent_session::AgentSession>"),
        ),
        (
            "GrantAgentCredentialLease",
            addressed("ids::ProfileId", "GrantAgentCredentialLease"),
            format!("{API}::CredentialLeaseGrant"),
        ),
        (
            "GetProfileCredentials",
            format!("{CORE}::ids::ProfileId"),
            format!("Vec<{CORE}::manifest::CredentialRef>"),
        ),
        (
            "CheckMcpUse",
            addressed("ids::ProfileId", "McpUse"),
            format!("{API}::McpDecision"),
        ),
        (
            "GetCredentialLease",
            format!("{CORE}::ids::CredentialLeaseId"),
            format!("{API}::CredentialLeaseView"),
        ),
        (
            "GetAgentCredentialLease",
            format!("{CORE}::ids::CredentialLeaseId"),
            format!("{API}::AgentCredentialLeaseView"),
        ),
        (
            "McpGrants",
            format!("{CORE}::ids::ProfileId"),
            format!("Vec<{CORE}::ids::McpServerId>"),
        ),
    ];
    rows.into_iter()
        .fold(
            tonic_build::manual::Service::builder()
                .name("WorkerControl")
                .package("squadron.v1"),
            |service, (name, input, output)| {
                service.method(
                    tonic_build::manual::Method::builder()
                        .name(snake_case(name))
                        .route_name(name)
                        .input_type(input)
                        .output_type(output)
                        .codec_path("crate::json_codec::JsonCodec")
                        .build(),
                )
            },
        )
        .build()
}

/// `Addressed<core id, api body>`: an id from the core, a body from the API crate.
fn addressed(id: &str, body: &str) -> String {
    format!("squadron_api::Addressed<squadron_core::{id}, squadron_api::{body}>")
}

fn outcome() -> String {
    "squadron_core::Outcome".into()
}

fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}
