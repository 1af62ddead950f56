//! The unprivileged user sandboxed code runs as (issue 14 item 2), and what the worker does
//! so that user can work in the directories it is given.
//!
//! Why a host uid switched to by `setpriv` and not a user namespace: bubblewrap run by root
//! with `--unshare-user` maps the uid inside to the caller's uid outside, which is root, so a
//! file only root may read on the host would still be readable by its owner inside. Mapping
//! to another host uid needs `newuidmap` and subordinate id ranges; `setpriv --reuid` needs
//! nothing the worker does not already require, and the kernel then checks every access as
//! that uid.
//!
//! Why the work trees' top directories stay the worker's: libgit2, which the worker uses to
//! collect patches and to commit for agents, refuses a work tree, gitfile or git directory
//! owned by another user unless `safe.directory` in the worker's global Git configuration
//! lists it, and the only ways to change that from code are process-wide `unsafe` calls (the
//! workspace forbids `unsafe`). So a work tree is shared, not handed over: its top directory
//! and `.git` keep their owner and gain group access for the sandbox's gid, and everything
//! below them is the sandbox user's. Git inside the sandbox, running as that user, would in
//! turn refuse those worker-owned directories: `git_env` lists every directory as safe
//! there, through Git's command-line configuration variables (a protected scope, which
//! `safe.directory` requires). Inside a sandbox every repository is the sandbox's own.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::error::WorkerError;

/// nobody:nogroup. Present in the passwd and group files of every base image and host, so
/// programs that look their user up (Git's committer fallback, ssh, Python's `getpass`) work;
/// and no file of the worker's is owned by it.
pub(crate) const SANDBOX_UID_DEFAULT: u32 = 65534;
pub(crate) const SANDBOX_GID_DEFAULT: u32 = 65534;
/// Most entries walked when handing a directory tree to the sandbox user.
pub(crate) const CHOWN_ENTRIES_MAX: usize = 2_000_000;
/// The name of a work tree's Git entry (a directory in a clone, a file in a linked worktree).
const GIT_ENTRY: &str = ".git";
/// Git's command-line configuration (`git -c`), as environment variables.
const GIT_CONFIG_COUNT_ENV: &str = "GIT_CONFIG_COUNT";

/// A non-root (uid, gid) on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SandboxUser {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

impl Default for SandboxUser {
    fn default() -> Self {
        SandboxUser {
            uid: SANDBOX_UID_DEFAULT,
            gid: SANDBOX_GID_DEFAULT,
        }
    }
}

impl SandboxUser {
    pub(crate) fn pair(self) -> (u32, u32) {
        (self.uid, self.gid)
    }

    /// Gives `dir` and everything below it to the user, without following symlinks.
    pub(crate) fn hand_over(self, dir: &Path) -> Result<(), WorkerError> {
        self.chown_below(dir, true)
    }

    /// Shares a Git work tree with the user (see the module documentation): everything
    /// below `dir` is the user's, except that `dir` itself and its `.git` keep their owner
    /// and get the user's group with read, write and search for it. A `.git` that is a
    /// symbolic link is left alone (the collector refuses it anyway).
    pub(crate) fn share_work_tree(self, dir: &Path) -> Result<(), WorkerError> {
        self.share_dir(dir)?;
        let entries = fs::read_dir(dir).map_err(|e| WorkerError::io("list", dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| WorkerError::io("list", dir, e))?;
            let path = entry.path();
            if entry.file_name() != GIT_ENTRY {
                self.chown_below(&path, true)?;
                continue;
            }
            let meta =
                fs::symlink_metadata(&path).map_err(|e| WorkerError::io("inspect", &path, e))?;
            if meta.is_dir() {
                self.share_dir(&path)?;
                self.chown_below(&path, false)?;
            }
        }
        Ok(())
    }

    /// Lets Git inside the sandbox work in directories the worker owns, unless the launch
    /// already uses Git's command-line configuration variables (then they are the caller's).
    pub(crate) fn git_env(env: &mut BTreeMap<String, String>) {
        if env.contains_key(GIT_CONFIG_COUNT_ENV) {
            return;
        }
        env.insert(GIT_CONFIG_COUNT_ENV.to_owned(), "1".to_owned());
        env.insert("GIT_CONFIG_KEY_0".to_owned(), "safe.directory".to_owned());
        env.insert("GIT_CONFIG_VALUE_0".to_owned(), "*".to_owned());
    }

    /// `dir` keeps its owner; its group becomes the user's, with rwx for the group.
    fn share_dir(self, dir: &Path) -> Result<(), WorkerError> {
        let meta = fs::symlink_metadata(dir).map_err(|e| WorkerError::io("inspect", dir, e))?;
        if !meta.is_dir() {
            return Err(WorkerError::Invalid {
                field: "work tree".to_owned(),
                message: format!("{} is not a directory", dir.display()),
            });
        }
        std::os::unix::fs::lchown(dir, None, Some(self.gid))
            .map_err(|e| WorkerError::io("share with the sandbox user", dir, e))?;
        let mode = meta.permissions().mode() & 0o7777 | 0o070;
        fs::set_permissions(dir, fs::Permissions::from_mode(mode))
            .map_err(|e| WorkerError::io("share with the sandbox user", dir, e))
    }

    /// Hands the entries below `top` (and `top` itself when `include_top`) to the user.
    fn chown_below(self, top: &Path, include_top: bool) -> Result<(), WorkerError> {
        let mut pending = vec![(top.to_path_buf(), include_top)];
        let mut seen = 0usize;
        while let Some((path, chown)) = pending.pop() {
            seen += 1;
            if seen > CHOWN_ENTRIES_MAX {
                return Err(WorkerError::Invalid {
                    field: "sandbox directory".to_owned(),
                    message: format!(
                        "{} holds more than {CHOWN_ENTRIES_MAX} entries",
                        top.display()
                    ),
                });
            }
            if chown {
                std::os::unix::fs::lchown(&path, Some(self.uid), Some(self.gid))
                    .map_err(|e| WorkerError::io("hand to the sandbox user", &path, e))?;
            }
            let meta =
                fs::symlink_metadata(&path).map_err(|e| WorkerError::io("inspect", &path, e))?;
            if meta.is_dir() {
                let entries = fs::read_dir(&path).map_err(|e| WorkerError::io("list", &path, e))?;
                for entry in entries {
                    let entry = entry.map_err(|e| WorkerError::io("list", &path, e))?;
                    pending.push((entry.path(), true));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn a_work_tree_is_shared_and_its_contents_handed_over() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = tmp.path().join("inbox");
        fs::create_dir_all(tree.join(".git/objects")).unwrap();
        fs::create_dir_all(tree.join("src")).unwrap();
        fs::write(tree.join("src/lib.rs"), "x").unwrap();
        fs::write(tree.join(".git/HEAD"), "ref").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", tree.join("link")).unwrap();
        let user = SandboxUser {
            uid: 4242,
            gid: 4343,
        };
        user.share_work_tree(&tree).unwrap();
        let owner = fs::metadata(tmp.path()).unwrap().uid();
        for kept in [&tree, &tree.join(".git")] {
            let meta = fs::symlink_metadata(kept).unwrap();
            assert_eq!(
                (meta.uid(), meta.gid()),
                (owner, 4343),
                "{}",
                kept.display()
            );
            assert_eq!(meta.mode() & 0o070, 0o070, "{}", kept.display());
        }
        for handed in ["src", "src/lib.rs", ".git/HEAD", ".git/objects", "link"] {
            let meta = fs::symlink_metadata(tree.join(handed)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (4242, 4343), "{handed}");
        }
        // The link itself changed owner, not what it names.
        assert_eq!(fs::metadata("/etc/shadow").unwrap().uid(), 0);
    }

    #[test]
    fn git_env_marks_every_directory_safe_unless_the_caller_configures_git() {
        let mut env = BTreeMap::new();
        SandboxUser::git_env(&mut env);
        assert_eq!(env["GIT_CONFIG_COUNT"], "1");
        assert_eq!(env["GIT_CONFIG_KEY_0"], "safe.directory");
        assert_eq!(env["GIT_CONFIG_VALUE_0"], "*");
        let mut own = BTreeMap::from([("GIT_CONFIG_COUNT".to_owned(), "0".to_owned())]);
        SandboxUser::git_env(&mut own);
        assert_eq!(own.len(), 1);
    }
}
