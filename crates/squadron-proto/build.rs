//! Compiles proto/ with protox (a pure-Rust protobuf compiler: the machine has no protoc).

use std::path::PathBuf;

// CARGO_MANIFEST_DIR is read at run time: the build directory is shared between clones at
// different paths, and a compiled-in path would point at whichever clone built it first.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        "squadron/v1/common.proto",
        "squadron/v1/raft.proto",
        "squadron/v1/worker.proto",
        "squadron/v1/agent.proto",
    ];
    let paths: Vec<PathBuf> = files.iter().map(|f| root.join(f)).collect();
    for p in &paths {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let fds = protox::compile(&paths, [&root])?;
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
