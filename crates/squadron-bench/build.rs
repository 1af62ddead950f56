//! Compiles the benchmark's slice of etcd's v3 gRPC API with protox (a pure-Rust protobuf
//! compiler: the machine has no protoc); clients only.

use std::path::PathBuf;

// CARGO_MANIFEST_DIR is read at run time: the build directory is shared between clones at
// different paths, and a compiled-in path would point at whichever clone built it first.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    println!("cargo:rerun-if-changed=proto/etcd_v3.proto");
    let fds = protox::compile([root.join("etcd_v3.proto")], [&root])?;
    tonic_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
