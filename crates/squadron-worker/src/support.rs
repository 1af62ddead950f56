//! Small helpers shared across the worker's rooms: the durable file write, path removal,
//! the clock and text truncation.

use std::io::Write;
use std::path::Path;

use atomic_write_file::AtomicWriteFile;

use crate::error::WorkerError;

/// Replaces `path` with `bytes` durably: a temporary file beside it is written and synced,
/// renamed over `path`, and the directory synced, so a crash leaves either the old content or
/// the new, never a torn mix a recovering worker would have to second-guess
/// (`atomic-write-file`, as the store and the isolation crate use it).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), WorkerError> {
    let written = (|| {
        let mut file = AtomicWriteFile::open(path)?;
        file.write_all(bytes)?;
        file.commit()
    })();
    written.map_err(|e| WorkerError::io("writing", path, e))
}

/// Removes a file, symlink or directory tree (without following symlinks), if present.
pub(crate) fn remove_path(path: &Path) -> Result<(), WorkerError> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    result.map_err(|e| WorkerError::io("removing", path, e))
}

/// The `host:port` of a control endpoint given as a URL (`https://h:p/…`) or bare.
pub(crate) fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest)
}

/// Milliseconds since the Unix epoch, for event lines and metadata (the client's clock helper).
pub(crate) use squadron_client::now_ms;

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub(crate) fn truncate_at_char(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Reads `path` whole when it holds at most `bytes_max` bytes; a larger file is an
/// `InvalidData` error, read no further than the bound.
pub(crate) fn read_bounded(path: &Path, bytes_max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(bytes_max.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > bytes_max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} holds more than {bytes_max} bytes", path.display()),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replace_the_whole_file_and_leave_no_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f.json");
        write_atomic(&path, b"first, longer content").unwrap();
        write_atomic(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
        let err = write_atomic(&tmp.path().join("missing/f"), b"x").unwrap_err();
        assert!(err.to_string().contains("missing/f"), "{err}");
    }

    #[test]
    fn truncation_respects_character_boundaries() {
        assert_eq!(truncate_at_char("héllo", 2), "h");
        assert_eq!(truncate_at_char("héllo", 3), "hé");
        assert_eq!(truncate_at_char("abc", 10), "abc");
        assert_eq!(truncate_at_char("", 0), "");
    }
}
