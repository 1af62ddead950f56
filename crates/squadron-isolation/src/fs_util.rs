//! Small file helpers that turn io errors into errors naming the path.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use crate::error::IsolationError;

pub(crate) fn read_to_string(path: &Path, what: &'static str) -> Result<String, IsolationError> {
    fs::read_to_string(path).map_err(|e| IsolationError::io(what, path, e))
}

/// Writes a control value into a cgroup file. cgroupfs wants one write(2) per value, which
/// `fs::write` does for the short strings used here.
pub(crate) fn write_control(
    path: &Path,
    value: &str,
    what: &'static str,
) -> Result<(), IsolationError> {
    fs::write(path, value).map_err(|e| IsolationError::io(what, path, e))
}

/// `mkdir`, treating an existing directory as success.
pub(crate) fn create_dir(path: &Path, what: &'static str) -> Result<(), IsolationError> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(IsolationError::io(what, path, e)),
    }
}

/// `rmdir`, treating a missing directory as success.
pub(crate) fn remove_dir(path: &Path, what: &'static str) -> Result<(), IsolationError> {
    match fs::remove_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(IsolationError::io(what, path, e)),
    }
}
