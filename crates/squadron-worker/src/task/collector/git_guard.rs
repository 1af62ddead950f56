//! The agent's `.git`, opened only as the clone it should be: the redirections an agent
//! could plant to make the worker read the host's repositories or files are refused.

use std::path::Path;

use git2::Repository;

/// Entries of `.git/objects` (loose objects included) inspected for symbolic links; a
/// repository with more is not read at all.
const GIT_OBJECT_ENTRIES_CHECKED_MAX: usize = 200_000;

/// Opens the clone in `inbox` as git sees it, refusing the redirections an agent could plant
/// to make the worker read the host's repositories or files: a `.git` that is a link or a
/// gitfile, a `commondir`, linked object directories, alternates. The work tree is pinned to
/// `inbox` whatever `core.worktree` says.
pub(super) fn open_worktree_repo(
    inbox: &Path,
    notes: &mut Vec<String>,
) -> Result<Repository, String> {
    let git_dir = inbox.join(".git");
    let is_real_dir = |path: &Path| {
        std::fs::symlink_metadata(path)
            .map(|m| m.is_dir())
            .unwrap_or(false)
    };
    if !is_real_dir(&git_dir) {
        return Err(".git is missing or not a plain directory".into());
    }
    for name in ["commondir", "gitdir"] {
        if std::fs::symlink_metadata(git_dir.join(name)).is_ok() {
            return Err(format!(".git/{name} exists; it would point git elsewhere"));
        }
    }
    for name in ["HEAD", "config", "index", "packed-refs", "refs", "objects"] {
        if let Ok(meta) = std::fs::symlink_metadata(git_dir.join(name)) {
            if meta.file_type().is_symlink() {
                return Err(format!(".git/{name} is a symbolic link"));
            }
        }
    }
    // Objects are read through links, so a linked loose object or pack would let the agent
    // name a blob of some other repository on the host and read it back in the patch.
    let objects = git_dir.join("objects");
    let mut checked = 0usize;
    let mut dirs = vec![objects.clone()];
    while let Some(dir) = dirs.pop() {
        let Ok(iter) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in iter {
            checked += 1;
            if checked > GIT_OBJECT_ENTRIES_CHECKED_MAX {
                return Err(format!(
                    ".git/objects holds more than {GIT_OBJECT_ENTRIES_CHECKED_MAX} entries"
                ));
            }
            let entry = entry.map_err(|e| format!("cannot list .git/objects: {e}"))?;
            let kind = entry
                .file_type()
                .map_err(|e| format!("cannot inspect .git/objects: {e}"))?;
            if kind.is_symlink() {
                return Err(format!(
                    ".git/objects holds the symbolic link {:?}",
                    entry.file_name()
                ));
            }
            // Objects live one level down (fan-out, pack, info); deeper is not git's.
            if kind.is_dir() && dir == objects {
                dirs.push(entry.path());
            }
        }
    }
    for name in ["alternates", "http-alternates"] {
        let path = objects.join("info").join(name);
        if std::fs::symlink_metadata(&path).is_ok() {
            std::fs::remove_file(&path).map_err(|e| format!("cannot remove {name}: {e}"))?;
            notes.push(format!(
                "removed .git/objects/info/{name}: objects are read from the clone only"
            ));
        }
    }
    let repo = Repository::open(&git_dir)
        .map_err(|e| format!("cannot open the repository: {}", e.message()))?;
    repo.set_workdir(inbox, false)
        .map_err(|e| format!("cannot pin the work tree: {}", e.message()))?;
    Ok(repo)
}
