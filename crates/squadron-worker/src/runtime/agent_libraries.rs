//! The shared libraries of the worker's own `squadron` binary, which Docker containers and VM
//! guests run as their agent: whatever the build links beyond the C runtime the images carry
//! (libvirt and its dependencies in a build with the KVM runtime), copied from this host into
//! a directory the sandbox gets read-only at `AGENT_LIBRARY_DIR`, with `LD_LIBRARY_PATH`
//! naming it for the agent only (the agent drops it before it starts the provider).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub(crate) use squadron_api::agent_channel::AGENT_LIBRARY_DIR;

use crate::error::WorkerError;

/// The most libraries copied for the agent binary.
const AGENT_LIBRARIES_MAX: usize = 256;

/// Fills `dir` with the libraries `binary` links, each copied unless it is there already.
pub(crate) fn prepare(binary: &Path, dir: &Path) -> Result<(), WorkerError> {
    std::fs::create_dir_all(dir).map_err(|e| WorkerError::io("create", dir, e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| WorkerError::io("set the mode of", dir, e))?;
    for library in linked_libraries(binary)? {
        let Some(name) = library.file_name() else {
            continue;
        };
        replace_with_copy(&library, &dir.join(name))?;
    }
    Ok(())
}

/// The shared libraries `binary` loads, as this host's loader resolves them (`ldd`).
fn linked_libraries(binary: &Path) -> Result<Vec<PathBuf>, WorkerError> {
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| WorkerError::io("run ldd on", binary, e))?;
    if !out.status.success() {
        return Err(WorkerError::runtime(
            "agent",
            format!(
                "ldd {} failed: {}",
                binary.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let libraries: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split_once("=> ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter(|path| path.starts_with('/'))
        .map(PathBuf::from)
        .collect();
    if libraries.len() > AGENT_LIBRARIES_MAX {
        return Err(WorkerError::runtime(
            "agent",
            format!(
                "{} links more than {AGENT_LIBRARIES_MAX} libraries",
                binary.display()
            ),
        ));
    }
    Ok(libraries)
}

/// Copies `source` over `dest` unless it is there already with the same size and mtime.
pub(crate) fn replace_with_copy(source: &Path, dest: &Path) -> Result<(), WorkerError> {
    let same = |a: &std::fs::Metadata, b: &std::fs::Metadata| {
        a.len() == b.len() && a.modified().ok() == b.modified().ok()
    };
    let src_meta = std::fs::metadata(source).map_err(|e| WorkerError::io("inspect", source, e))?;
    if std::fs::metadata(dest).is_ok_and(|d| same(&src_meta, &d)) {
        return Ok(());
    }
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(|e| WorkerError::io("create", parent, e))?;
    }
    let staged = dest.with_extension("new");
    std::fs::copy(source, &staged)
        .map_err(|e| WorkerError::io("copy the VM image to", &staged, e))?;
    let file = std::fs::File::options()
        .write(true)
        .open(&staged)
        .map_err(|e| WorkerError::io("open", &staged, e))?;
    if let Ok(modified) = src_meta.modified() {
        file.set_modified(modified)
            .map_err(|e| WorkerError::io("set the mtime of", &staged, e))?;
    }
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| WorkerError::io("set the mode of", &staged, e))?;
    std::fs::rename(&staged, dest).map_err(|e| WorkerError::io("rename into", dest, e))
}
