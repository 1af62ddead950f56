//! Small helpers shared by staging, the collector and the launcher.

use std::io::Write;
use std::path::Path;

use crate::error::WorkerError;

/// Writes `bytes` to a sibling temporary file, syncs it, and renames it over `path`, so a
/// crash leaves either the old content or the new, never a torn mix a recovering worker would
/// have to second-guess.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), WorkerError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        WorkerError::io("writing", path, e)
    })
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
