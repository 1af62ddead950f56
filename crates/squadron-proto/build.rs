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
    Ok(())
}
