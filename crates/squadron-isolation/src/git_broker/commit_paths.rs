//! The path set of a commit: the syntax every path must have, and the reading of one path
//! from the worktree into what the index gets — without following a symlink out of it.
//!
//! The worktree is writable by the provider process while the broker reads it, so a file is
//! opened beneath the worktree's own handle with no symbolic link resolved on the way
//! (`Beneath`: `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), without blocking (a
//! FIFO swapped in cannot hang the broker), and its `fstat` must be a regular file with one
//! link: a parent directory swapped for a link to `/etc` between any check and the open is
//! refused by the kernel at the open itself, not by a path check that a rename race passes.
//!
//! Content is committed byte for byte: no clean or smudge filter runs, because a filter is
//! a command named by `.gitattributes`, which the provider process can write.

use std::fs::{self, File, Metadata};
use std::io::{ErrorKind, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use git2::{IndexEntry, IndexTime, Oid};

use crate::beneath::Beneath;

/// A path, in bytes.
pub const PATH_BYTES_MAX: usize = 4096;
/// One component of a path, in bytes (the Linux `NAME_MAX`).
pub const PATH_COMPONENT_BYTES_MAX: usize = 255;
/// One file staged by the broker.
pub const STAGED_FILE_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// All files of one commit together (they are held in memory until the commit is made).
pub const STAGED_BYTES_PER_COMMIT_MAX: u64 = 256 * 1024 * 1024;

const MODE_FILE: u32 = 0o100_644;
const MODE_EXECUTABLE: u32 = 0o100_755;
const MODE_SYMLINK: u32 = 0o120_000;

/// What one listed path does to the commit.
#[derive(Debug)]
pub(crate) enum PathChange {
    /// Present in the worktree: the entry (stat data and mode filled, id to be computed)
    /// and the content to store as its blob (the link text for a symlink).
    Upsert { entry: IndexEntry, content: Vec<u8> },
    /// Absent from the worktree: remove it from the index.
    Delete,
}

/// The syntax every listed path must have; the error is the message for its field.
pub(crate) fn check_path_syntax(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("empty path".into());
    }
    if path.len() > PATH_BYTES_MAX {
        return Err(format!("longer than {PATH_BYTES_MAX} bytes"));
    }
    if path.contains('\0') {
        return Err("contains a NUL byte".into());
    }
    if path.starts_with('/') {
        return Err(format!(
            "{path:?} is absolute; give a path relative to the worktree"
        ));
    }
    if path.ends_with('/') {
        return Err(format!("{path:?} names a directory; list the files"));
    }
    for component in path.split('/') {
        if component.is_empty() {
            return Err(format!("{path:?} has an empty component"));
        }
        if component == "." || component == ".." {
            return Err(format!("{path:?} has a {component:?} component"));
        }
        // Case-insensitively, as git itself does on the filesystems that fold case.
        if component.eq_ignore_ascii_case(".git") {
            return Err(format!(
                "{path:?} is under .git; Git metadata is the broker's"
            ));
        }
        if component.len() > PATH_COMPONENT_BYTES_MAX {
            return Err(format!(
                "{path:?} has a component longer than {PATH_COMPONENT_BYTES_MAX} bytes"
            ));
        }
    }
    Ok(())
}

/// Reads `relative` (syntax already checked) from the canonical `worktree`.
pub(crate) fn read_change(worktree: &Path, relative: &str) -> Result<PathChange, String> {
    let components: Vec<&str> = relative.split('/').collect();
    let mut prefix = worktree.to_path_buf();
    for (depth, component) in components.iter().enumerate() {
        prefix.push(component);
        let is_last = depth + 1 == components.len();
        let meta = match fs::symlink_metadata(&prefix) {
            Ok(meta) => meta,
            // A missing path, or a missing parent: the listed path is deleted.
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(PathChange::Delete),
            Err(e) => {
                return Err(format!(
                    "cannot stat {}: {e}",
                    components[..=depth].join("/")
                ))
            }
        };
        let kind = meta.file_type();
        if !is_last {
            if kind.is_symlink() {
                return Err(format!(
                    "{relative:?} passes through the symlink {:?}",
                    components[..=depth].join("/")
                ));
            }
            if !kind.is_dir() {
                // A file where a directory would be: nothing exists at the listed path.
                return Ok(PathChange::Delete);
            }
            continue;
        }
        if kind.is_symlink() {
            // Committed as a link, as git does; the target is never read.
            let target = fs::read_link(&prefix)
                .map_err(|e| format!("cannot read the symlink {relative:?}: {e}"))?;
            let content = target.as_os_str().as_bytes().to_vec();
            let entry = index_entry(relative, &meta, MODE_SYMLINK, content.len());
            return Ok(PathChange::Upsert { entry, content });
        }
        if kind.is_dir() {
            return Err(format!("{relative:?} is a directory; list the files in it"));
        }
        if !kind.is_file() {
            return Err(format!("{relative:?} is not a regular file or a symlink"));
        }
    }
    read_regular_file(worktree, relative)
}

fn read_regular_file(worktree: &Path, relative: &str) -> Result<PathChange, String> {
    let file = Beneath::open(worktree)
        .and_then(|top| top.read(Path::new(relative)))
        .map_err(|e| format!("cannot open {relative:?}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat {relative:?}: {e}"))?;
    if meta.len() > STAGED_FILE_BYTES_MAX {
        return Err(format!(
            "{relative:?} is larger than {STAGED_FILE_BYTES_MAX} bytes"
        ));
    }
    let content = read_bounded(file, relative)?;
    let mode = if meta.mode() & 0o111 != 0 {
        MODE_EXECUTABLE
    } else {
        MODE_FILE
    };
    let entry = index_entry(relative, &meta, mode, content.len());
    Ok(PathChange::Upsert { entry, content })
}

fn read_bounded(file: File, relative: &str) -> Result<Vec<u8>, String> {
    let mut content = Vec::new();
    file.take(STAGED_FILE_BYTES_MAX + 1)
        .read_to_end(&mut content)
        .map_err(|e| format!("cannot read {relative:?}: {e}"))?;
    if content.len() as u64 > STAGED_FILE_BYTES_MAX {
        return Err(format!(
            "{relative:?} grew past {STAGED_FILE_BYTES_MAX} bytes"
        ));
    }
    Ok(content)
}

/// The index keeps 32-bit stat fields; truncation is git's own rule.
fn index_entry(relative: &str, meta: &Metadata, mode: u32, size: usize) -> IndexEntry {
    IndexEntry {
        ctime: IndexTime::new(meta.ctime() as i32, meta.ctime_nsec() as u32),
        mtime: IndexTime::new(meta.mtime() as i32, meta.mtime_nsec() as u32),
        dev: meta.dev() as u32,
        ino: meta.ino() as u32,
        mode,
        uid: meta.uid(),
        gid: meta.gid(),
        file_size: size as u32,
        id: Oid::zero(),
        flags: 0,
        flags_extended: 0,
        path: relative.as_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_refuses_escapes() {
        for bad in [
            "",
            "/etc/passwd",
            "a/../b",
            "..",
            "./a",
            "a//b",
            "a/",
            ".git/config",
            "x/.GIT/HEAD",
            ".git",
            "a\0b",
        ] {
            assert!(check_path_syntax(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(check_path_syntax(&"x".repeat(PATH_COMPONENT_BYTES_MAX + 1)).is_err());
        for good in ["a", "src/main.rs", ".gitignore", "dir/.github/x", "a b/c"] {
            assert!(check_path_syntax(good).is_ok(), "{good:?} was refused");
        }
    }

    #[test]
    fn reading_classifies_and_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("secret"), "s").unwrap();
        fs::write(root.join("file"), "content").unwrap();
        fs::create_dir(root.join("dir")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("escape")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("link")).unwrap();

        match read_change(&root, "file").unwrap() {
            PathChange::Upsert { entry, content } => {
                assert_eq!(content, b"content");
                assert_eq!(entry.mode, MODE_FILE);
            }
            PathChange::Delete => panic!("file read as deleted"),
        }
        match read_change(&root, "link").unwrap() {
            PathChange::Upsert { entry, content } => {
                assert_eq!(content, b"/etc/hostname");
                assert_eq!(entry.mode, MODE_SYMLINK);
            }
            PathChange::Delete => panic!("link read as deleted"),
        }
        assert!(matches!(
            read_change(&root, "gone").unwrap(),
            PathChange::Delete
        ));
        assert!(matches!(
            read_change(&root, "nodir/gone").unwrap(),
            PathChange::Delete
        ));
        assert!(read_change(&root, "dir").unwrap_err().contains("directory"));
        assert!(read_change(&root, "escape/secret")
            .unwrap_err()
            .contains("symlink"));
        // Past the name checks (a directory swapped for a link after them), the open itself
        // refuses: nothing outside the worktree is read.
        let err = read_regular_file(&root, "escape/secret").unwrap_err();
        assert!(err.contains("cannot open"), "{err}");
        // A second name for a file is refused too (it may be a host file's).
        fs::hard_link(root.join("file"), root.join("twin")).unwrap();
        assert!(read_regular_file(&root, "twin").is_err());
    }
}
