//! Reading what a sandbox wrote into its outbox — progress logs and artifacts — for the output
//! server. The sandbox owns the outbox, so a link it planted (`stdout.log -> /etc/shadow`,
//! `artifacts -> /`) must never be followed by the worker, which runs as root: every open
//! goes through [`squadron_isolation::beneath`], the roots included.

use std::path::Path;

use squadron_isolation::beneath::{Beneath, BeneathError, EntryKind};

use crate::task::task_dir::{TaskDir, ARTIFACTS};

/// Most directories one artifact listing descends into.
pub(crate) const ARTIFACT_DIRS_MAX: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OutboxError {
    /// Not there (yet).
    #[error("{0}")]
    Missing(String),
    /// A bad name from the caller.
    #[error("{0}")]
    BadName(String),
    /// Something the sandbox put in place of a file: a link, a FIFO, a hard link.
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Io(String),
}

/// One listed artifact: its name beneath `artifacts/` and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListedArtifact {
    pub(crate) name: String,
    pub(crate) size: u64,
}

/// A progress file (`progress/stdout.log`…), `None` while it does not exist yet.
pub(crate) fn open_progress(
    dir: &TaskDir,
    name: &'static str,
) -> Result<Option<tokio::fs::File>, OutboxError> {
    open_beneath(&dir.outbox(), Path::new(name))
}

/// A log `name` beneath `root`, a directory its sandbox can write, opened without following a
/// link (the root included); `None` while it does not exist yet.
pub(crate) fn open_beneath(
    root: &Path,
    name: &Path,
) -> Result<Option<tokio::fs::File>, OutboxError> {
    match Beneath::open(root).and_then(|r| r.read(name)) {
        Ok(f) => Ok(Some(tokio::fs::File::from_std(f))),
        Err(e) if e.is_missing() => Ok(None),
        Err(e) => Err(classify(e, &name.display().to_string())),
    }
}

/// The last `bytes_max` bytes of a progress file as text (lossy), read without following a
/// link; `None` when it cannot be opened.
pub(crate) fn tail_text(dir: &TaskDir, name: &str, bytes_max: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = dir.outbox_beneath().ok()?.read(Path::new(name)).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(bytes_max)))
        .ok()?;
    let mut buf = Vec::new();
    f.take(bytes_max).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// An artifact by the name a caller gave: a relative path of plain components naming a
/// regular file beneath `artifacts/`, with no link anywhere on the way.
pub(crate) fn open_artifact(dir: &TaskDir, name: &str) -> Result<std::fs::File, OutboxError> {
    check_artifact_name(name)?;
    let opened = artifacts_root(dir).and_then(|a| a.read(Path::new(name)));
    opened.map_err(|e| match e {
        BeneathError::Missing(_) => OutboxError::Missing(format!("no artifact named {name:?}")),
        other => classify(other, name),
    })
}

/// Regular files beneath `artifacts/`, sorted by name, at most `files_max`; links, devices
/// and names that are not UTF-8 are left out.
pub(crate) fn list_artifacts(
    dir: &TaskDir,
    files_max: usize,
) -> Result<Vec<ListedArtifact>, OutboxError> {
    let root = match artifacts_root(dir) {
        Ok(root) => root,
        Err(e) if e.is_missing() => return Ok(Vec::new()),
        Err(e) => return Err(classify(e, ARTIFACTS)),
    };
    let mut out = Vec::new();
    // Relative names, not handles: one directory is open at a time however wide the tree.
    let mut pending = vec![String::new()];
    let mut visited = 0usize;
    while let Some(prefix) = pending.pop() {
        visited += 1;
        if visited > ARTIFACT_DIRS_MAX || out.len() >= files_max {
            break;
        }
        // A directory swapped for a link since it was listed is skipped, not followed.
        let here = if prefix.is_empty() {
            root.dir(Path::new("."))
        } else {
            root.dir(Path::new(&prefix))
        };
        let Ok(here) = here else { continue };
        for entry in here.entries().map_err(|e| classify(e, ARTIFACTS))? {
            let Some(name) = entry.name.to_str() else {
                continue;
            };
            let rel = if prefix.is_empty() {
                name.to_string()
            } else {
                format!("{prefix}/{name}")
            };
            match entry.kind {
                EntryKind::Dir => pending.push(rel),
                EntryKind::File if out.len() < files_max => {
                    if let Ok(size) = here.read(Path::new(name)).and_then(|f| size_of(&f)) {
                        out.push(ListedArtifact { name: rel, size });
                    }
                }
                EntryKind::File | EntryKind::Other => {}
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn artifacts_root(dir: &TaskDir) -> Result<Beneath, BeneathError> {
    dir.outbox_beneath()?.dir(Path::new(ARTIFACTS))
}

fn size_of(f: &std::fs::File) -> Result<u64, BeneathError> {
    f.metadata()
        .map(|m| m.len())
        .map_err(|source| BeneathError::Io {
            path: "artifact".into(),
            source,
        })
}

fn check_artifact_name(name: &str) -> Result<(), OutboxError> {
    let bad = |m: &str| Err(OutboxError::BadName(m.to_string()));
    if name.is_empty() || name.starts_with('/') || name.contains('\\') || name.contains('\0') {
        return bad("artifact name must be a relative path");
    }
    if name
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return bad("artifact name must not contain empty, '.' or '..' components");
    }
    Ok(())
}

/// What a caller is told: the name it asked for and why, never the worker's own paths.
fn classify(e: BeneathError, name: &str) -> OutboxError {
    match e {
        BeneathError::Missing(_) => OutboxError::Missing(format!("{name} does not exist")),
        BeneathError::Link(_) => OutboxError::Refused(format!(
            "{name} passes through a symbolic link (or leads outside its directory); not served"
        )),
        BeneathError::NotRegular(_) => {
            OutboxError::Refused(format!("{name} is not a regular file; not served"))
        }
        BeneathError::HardLinked(_) => {
            OutboxError::Refused(format!("{name} has other hard links; not served"))
        }
        BeneathError::NotRelative(_) => OutboxError::BadName(format!("{name:?} is not relative")),
        BeneathError::Io { source, .. } => OutboxError::Io(format!("{name}: {source}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use squadron_core::ids::TaskId;
    use std::io::Read;
    use std::os::unix::fs::symlink;

    fn task_dir(tmp: &tempfile::TempDir) -> TaskDir {
        let dir = TaskDir::new(tmp.path(), TaskId::new(7).unwrap());
        std::fs::create_dir_all(dir.artifacts().join("sub")).unwrap();
        std::fs::create_dir_all(dir.progress()).unwrap();
        std::fs::write(dir.artifacts().join("sub/a.txt"), b"a").unwrap();
        std::fs::write(tmp.path().join("secret"), b"s").unwrap();
        dir
    }

    fn content(mut f: std::fs::File) -> String {
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        s
    }

    #[test]
    fn artifact_names_cannot_leave_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = task_dir(&tmp);
        let root = dir.artifacts();
        symlink(tmp.path().join("secret"), root.join("link")).unwrap();
        symlink(tmp.path(), root.join("dirlink")).unwrap();
        assert_eq!(content(open_artifact(&dir, "sub/a.txt").unwrap()), "a");
        for bad in [
            "../secret",
            "/etc/passwd",
            "sub/../../secret",
            "link",
            "dirlink/secret",
            "",
            "sub//a.txt",
            "./sub/a.txt",
        ] {
            assert!(open_artifact(&dir, bad).is_err(), "{bad:?} must be refused");
        }
        assert!(
            open_artifact(&dir, "sub").is_err(),
            "a directory is not an artifact"
        );
        assert!(matches!(
            open_artifact(&dir, "link"),
            Err(OutboxError::Refused(_))
        ));
        assert!(matches!(
            open_artifact(&dir, "none"),
            Err(OutboxError::Missing(_))
        ));
    }

    #[test]
    fn a_linked_artifacts_directory_lists_and_serves_nothing_of_the_host() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = task_dir(&tmp);
        symlink(tmp.path().join("secret"), dir.artifacts().join("sub/link")).unwrap();
        let listed = list_artifacts(&dir, 100).unwrap();
        let names: Vec<&str> = listed.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["sub/a.txt"], "links are not listed");

        std::fs::remove_dir_all(dir.artifacts()).unwrap();
        symlink("/", dir.artifacts()).unwrap();
        assert!(matches!(
            list_artifacts(&dir, 100),
            Err(OutboxError::Refused(_))
        ));
        assert!(matches!(
            open_artifact(&dir, "etc/passwd"),
            Err(OutboxError::Refused(_))
        ));
    }

    #[test]
    fn a_linked_log_is_refused_and_a_missing_one_is_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = task_dir(&tmp);
        let name = crate::task::task_dir::STDOUT_LOG;
        assert!(open_progress(&dir, name).unwrap().is_none());
        symlink(tmp.path().join("secret"), dir.stdout_log()).unwrap();
        let e = open_progress(&dir, name).unwrap_err();
        assert!(matches!(e, OutboxError::Refused(_)), "{e}");
        assert!(!e.to_string().contains(tmp.path().to_str().unwrap()), "{e}");
        // The progress directory itself replaced by a link.
        std::fs::remove_dir_all(dir.progress()).unwrap();
        symlink(tmp.path(), dir.progress()).unwrap();
        std::fs::write(tmp.path().join("stdout.log"), b"host").unwrap();
        let e = open_progress(&dir, name).unwrap_err();
        assert!(matches!(e, OutboxError::Refused(_)), "{e}");
    }
}
