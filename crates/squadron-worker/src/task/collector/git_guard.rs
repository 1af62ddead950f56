//! The agent's `.git`, opened only as the clone it should be: the redirections an agent
//! could plant to make the worker read the host's repositories or files are refused.

use std::path::Path;

use git2::Repository;

/// Entries of `.git/objects` (loose objects included) inspected for symbolic links; a
/// repository with more is not read at all.
const GIT_OBJECT_ENTRIES_CHECKED_MAX: usize = 200_000;
/// Entries of the work tree looked at for FIFOs, sockets and device nodes; a tree with more
/// is not read by git at all.
const SPECIAL_FILE_WALK_ENTRIES_MAX: usize = 1_000_000;
/// The most of `.git/config` read to look for includes.
const GIT_CONFIG_BYTES_MAX: u64 = 1 << 20;

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
    remove_special_files(inbox, notes)?;
    for name in ["commondir", "gitdir"] {
        if std::fs::symlink_metadata(git_dir.join(name)).is_ok() {
            return Err(format!(".git/{name} exists; it would point git elsewhere"));
        }
    }
    // git reads these by path: each must be what git writes there, never a link (to a host
    // file) or a FIFO (an open that never returns).
    for (name, dir) in [
        ("HEAD", false),
        ("config", false),
        ("index", false),
        ("packed-refs", false),
        ("info/exclude", false),
        ("info/attributes", false),
        ("refs", true),
        ("objects", true),
    ] {
        if let Ok(meta) = std::fs::symlink_metadata(git_dir.join(name)) {
            if meta.file_type().is_symlink() {
                return Err(format!(".git/{name} is a symbolic link"));
            }
            if (dir && !meta.is_dir()) || (!dir && !meta.is_file()) {
                return Err(format!(".git/{name} is not a plain {}", kind_name(dir)));
            }
        }
    }
    refuse_config_includes(&git_dir.join("config"))?;
    // Read at the open itself when the config turns it on, includes and all.
    if std::fs::symlink_metadata(git_dir.join("config.worktree")).is_ok() {
        return Err(".git/config.worktree exists; git would read it, includes and all".into());
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
    refuse_path_settings(&repo)?;
    Ok(repo)
}

fn kind_name(dir: bool) -> &'static str {
    if dir {
        "directory"
    } else {
        "file"
    }
}

/// Removes the FIFOs, sockets and device nodes of the work tree (`.git` included) before git
/// reads it: git stores none of them, and git opens what it reads (`.gitignore`,
/// `.gitattributes`, its own files) with a blocking open, which a FIFO would hold forever.
/// Links are not followed; a tree of more than [`SPECIAL_FILE_WALK_ENTRIES_MAX`] entries is
/// not read.
pub(super) fn remove_special_files(inbox: &Path, notes: &mut Vec<String>) -> Result<(), String> {
    let mut removed = 0usize;
    let walk = walkdir::WalkDir::new(inbox)
        .follow_links(false)
        .same_file_system(true);
    for (seen, entry) in walk.into_iter().enumerate() {
        if seen >= SPECIAL_FILE_WALK_ENTRIES_MAX {
            return Err(format!(
                "the work tree holds more than {SPECIAL_FILE_WALK_ENTRIES_MAX} entries"
            ));
        }
        let entry = entry.map_err(|e| format!("cannot walk the work tree: {e}"))?;
        let kind = entry.file_type();
        if kind.is_symlink() {
            refuse_git_link(inbox, entry.path())?;
            continue;
        }
        if kind.is_file() || kind.is_dir() {
            continue;
        }
        std::fs::remove_file(entry.path())
            .map_err(|e| format!("cannot remove {}: {e}", entry.path().display()))?;
        removed += 1;
    }
    if removed > 0 {
        notes.push(format!(
            "removed {removed} FIFOs, sockets or device nodes from the work tree: git stores \
             none, and reading one would hang the collection"
        ));
    }
    Ok(())
}

/// git reads what it finds in `.git`, and the work tree's `.gitignore`, `.gitattributes` and
/// `.gitmodules`,
/// by path and follows links (libgit2 does; git itself stopped for the latter two in 2.32):
/// any such link — a ref, `info/`, `shallow`, an ignore file pointing at a host FIFO or file —
/// keeps git out of the work tree.
fn refuse_git_link(inbox: &Path, link: &Path) -> Result<(), String> {
    let relative = link.strip_prefix(inbox).unwrap_or(link);
    // Hooks are linked in by setup scripts, and libgit2 runs and reads none.
    let in_git_dir = relative.starts_with(".git") && !relative.starts_with(".git/hooks");
    let read_by_git = matches!(
        link.file_name().and_then(|n| n.to_str()),
        Some(".gitignore" | ".gitattributes" | ".gitmodules")
    );
    if in_git_dir || read_by_git {
        return Err(format!(
            "{} is a symbolic link, which git would follow",
            relative.display()
        ));
    }
    Ok(())
}

/// Refuses a `.git/config` that includes other files (`[include]`, `[includeIf …]`): git
/// would read them by path, as root, wherever they point.
fn refuse_config_includes(config: &Path) -> Result<(), String> {
    use std::io::Read;
    let Ok(file) = std::fs::File::open(config) else {
        return Ok(());
    };
    let mut text = String::new();
    file.take(GIT_CONFIG_BYTES_MAX)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read .git/config: {e}"))?;
    // git skips a byte order mark at the start, so the check does too.
    let includes = text.trim_start_matches('\u{feff}').lines().any(|l| {
        let bare: String = l.chars().filter(|c| !c.is_whitespace()).collect();
        bare.to_ascii_lowercase().starts_with("[include")
    });
    if includes {
        return Err(".git/config includes other files".into());
    }
    Ok(())
}

/// Settings of the clone's own config that name other files for git to read, as root,
/// wherever they point: refused, as includes are.
const PATH_SETTINGS: [&str; 3] = [
    "core.excludesfile",
    "core.attributesfile",
    "extensions.worktreeconfig",
];

fn refuse_path_settings(repo: &Repository) -> Result<(), String> {
    let local = repo
        .config()
        .and_then(|c| c.open_level(git2::ConfigLevel::Local))
        .map_err(|e| format!("cannot read .git/config: {}", e.message()))?;
    for name in PATH_SETTINGS {
        if local.get_entry(name).is_ok() {
            return Err(format!(".git/config sets {name}"));
        }
    }
    Ok(())
}
