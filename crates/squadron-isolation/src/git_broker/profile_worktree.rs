//! One registered profile worktree and the Git work the broker does in it: read HEAD, and
//! commit exactly a listed path set with git2.
//!
//! The broker writes objects, the worktree's index and its HEAD ref — never the files of
//! the worktree (no checkout, no reset, no clean): resetting a worktree is a decision for
//! the caller, and only after the profile's lease is proved quiescent.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use git2::{Commit, ErrorCode, Index, Oid, Repository, RepositoryOpenFlags, Signature};

use super::broker_answer::{Refusal, RefusalCode};
use super::broker_error::BrokerError;
use super::broker_request::CommitRequest;
use super::commit_paths::{read_change, PathChange, STAGED_BYTES_PER_COMMIT_MAX};

/// The trailer that lets a retry be recognised from the commit itself.
const DIGEST_TRAILER: &str = "Squadron-Request-Digest";

/// A profile's worktree, canonical, with the common Git dir it shares with its siblings and
/// its own Git dir (a linked worktree's admin dir), both found once, at registration, before
/// the sandbox runs. Every later request opens the repository from `git_dir`, never through
/// the worktree's `.git`: the worktree is the sandbox's to write, and a `.git` it replaced
/// with a link to a peer's admin dir or another project's repository would have the broker
/// (root) commit there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProfileWorktree {
    pub worktree: PathBuf,
    pub common_dir: PathBuf,
    pub git_dir: PathBuf,
}

/// HEAD of a worktree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeadState {
    /// `None` on an unborn branch.
    pub oid: Option<Oid>,
    /// The branch HEAD points at; `None` when detached.
    pub branch: Option<String>,
}

/// What a commit attempt did.
#[derive(Debug)]
pub(crate) enum CommitStep {
    /// A new commit, now HEAD.
    Committed(Oid),
    /// HEAD already is this request's commit (its digest trailer matches and its parent is
    /// `expected_head`): the ledger line was lost; nothing was written.
    Recovered(Oid),
    Refused(Refusal),
}

impl ProfileWorktree {
    /// Opens the worktree at `path` whose Git dir is `git_dir` — a linked worktree's admin
    /// dir (`repo/.git/worktrees/{name}`) or a repository's own `.git` —, both named by the
    /// caller from its own layout. The worktree's `.git` is never asked: the provider may
    /// replace it with a link to any repository on the host, before any generation starts.
    pub(crate) fn open(path: &Path, git_dir: &Path) -> Result<ProfileWorktree, BrokerError> {
        let worktree =
            fs::canonicalize(path).map_err(|e| BrokerError::io("resolve the worktree", path, e))?;
        let git_dir = fs::canonicalize(git_dir)
            .map_err(|e| BrokerError::io("resolve the git dir", git_dir, e))?;
        let repo = Repository::open_ext(&git_dir, RepositoryOpenFlags::NO_SEARCH, &[] as &[&OsStr])
            .map_err(|e| BrokerError::git("open the repository", &git_dir, &e))?;
        let common_dir = fs::canonicalize(repo.commondir())
            .map_err(|e| BrokerError::io("resolve the common git dir", repo.commondir(), e))?;
        let opened = ProfileWorktree {
            worktree,
            common_dir,
            git_dir,
        };
        opened.repo()?;
        Ok(opened)
    }

    /// The repository as registered: opened from its own Git dir, its work dir pinned to the
    /// worktree, its common dir checked to be the one registered.
    fn repo(&self) -> Result<Repository, BrokerError> {
        let repo = Repository::open_ext(
            &self.git_dir,
            RepositoryOpenFlags::NO_SEARCH,
            &[] as &[&OsStr],
        )
        .map_err(|e| BrokerError::git("open the repository", &self.git_dir, &e))?;
        repo.set_workdir(&self.worktree, false)
            .map_err(|e| BrokerError::git("pin the work dir", &self.worktree, &e))?;
        let common = fs::canonicalize(repo.commondir())
            .map_err(|e| BrokerError::io("resolve the common git dir", repo.commondir(), e))?;
        if common != self.common_dir {
            return Err(BrokerError::invalid(
                "worktree",
                format!(
                    "{} now shares {}, not the registered {}",
                    self.worktree.display(),
                    common.display(),
                    self.common_dir.display()
                ),
            ));
        }
        Ok(repo)
    }

    /// The worktree's HEAD now.
    pub(crate) fn head(&self) -> Result<HeadState, BrokerError> {
        let repo = self.repo()?;
        head_state(&repo).map_err(|e| BrokerError::git("read HEAD", &self.worktree, &e))
    }

    /// Commits exactly `request.paths` on HEAD if HEAD is `request.expected_head`. The
    /// caller holds the common dir's lock and has checked the fence.
    pub(crate) fn commit(&self, request: &CommitRequest, digest: &str) -> CommitStep {
        match self.try_commit(request, digest) {
            Ok(step) => step,
            Err(e) => CommitStep::Refused(Refusal::new(RefusalCode::Internal, e.to_string())),
        }
    }

    fn try_commit(&self, request: &CommitRequest, digest: &str) -> Result<CommitStep, BrokerError> {
        let git = |what: &'static str| {
            let worktree = self.worktree.clone();
            move |e: git2::Error| BrokerError::git(what, worktree, &e)
        };
        let repo = self.repo()?;
        let head = head_state(&repo).map_err(git("read HEAD"))?;
        let expected = match &request.expected_head {
            Some(text) => Some(
                Oid::from_str(text)
                    .map_err(|_| BrokerError::invalid("expected_head", "not a hex commit id"))?,
            ),
            None => None,
        };
        if head.oid != expected {
            if let Some(oid) = head.oid {
                if carries_request(&repo, oid, expected, digest) {
                    return Ok(CommitStep::Recovered(oid));
                }
            }
            let mut refusal = Refusal::new(
                RefusalCode::HeadMoved,
                format!(
                    "HEAD is {}, not the expected {}",
                    describe(head.oid),
                    describe(expected)
                ),
            )
            .with_field("expected_head");
            refusal.current_head = head.oid.map(|oid| oid.to_string());
            return Ok(CommitStep::Refused(refusal));
        }

        let mut changes = Vec::with_capacity(request.paths.len());
        let mut staged_bytes = 0u64;
        for (index, path) in request.paths.iter().enumerate() {
            let change = match read_change(&self.worktree, path) {
                Ok(change) => change,
                Err(message) => return Ok(CommitStep::Refused(invalid_path(index, message))),
            };
            if let PathChange::Upsert { content, .. } = &change {
                staged_bytes += content.len() as u64;
                if staged_bytes > STAGED_BYTES_PER_COMMIT_MAX {
                    return Ok(CommitStep::Refused(invalid_path(
                        index,
                        format!(
                            "the listed files exceed {STAGED_BYTES_PER_COMMIT_MAX} bytes together"
                        ),
                    )));
                }
            }
            changes.push((index, path.as_str(), change));
        }

        let parent = match head.oid {
            Some(oid) => Some(repo.find_commit(oid).map_err(git("find the HEAD commit"))?),
            None => None,
        };
        // The commit's tree is HEAD's tree plus exactly the listed paths, built in an index
        // of its own: whatever else the worktree's index holds is not committed.
        let mut tree_index = Index::new().map_err(git("create an index"))?;
        if let Some(parent) = &parent {
            let tree = parent.tree().map_err(git("read the HEAD tree"))?;
            tree_index
                .read_tree(&tree)
                .map_err(git("read the HEAD tree"))?;
        }
        // Every listed deletion must name something HEAD has, checked before any object is
        // written: a refused request writes nothing.
        for (index, path, change) in &changes {
            if matches!(change, PathChange::Delete)
                && tree_index.get_path(Path::new(*path), 0).is_none()
            {
                return Ok(CommitStep::Refused(invalid_path(
                    *index,
                    format!("{path:?} is neither in the worktree nor in HEAD"),
                )));
            }
        }
        for (index, path, change) in &mut changes {
            match change {
                PathChange::Upsert { entry, content } => {
                    entry.id = repo.blob(content).map_err(git("write a blob"))?;
                    if let Err(e) = tree_index.add(entry) {
                        return Ok(CommitStep::Refused(invalid_path(*index, e.message())));
                    }
                }
                PathChange::Delete => tree_index
                    .remove_path(Path::new(*path))
                    .map_err(git("remove a path"))?,
            }
        }
        let tree_id = tree_index
            .write_tree_to(&repo)
            .map_err(git("write the tree"))?;
        let unchanged = match &parent {
            Some(parent) => parent.tree_id() == tree_id,
            None => tree_index.is_empty(),
        };
        if unchanged {
            return Ok(CommitStep::Refused(
                Refusal::new(
                    RefusalCode::NothingToCommit,
                    "the listed paths are unchanged from HEAD",
                )
                .with_field("paths"),
            ));
        }
        let tree = repo.find_tree(tree_id).map_err(git("find the tree"))?;
        let name = format!("profile-{}", request.profile);
        let email = format!("profile-{}@squadron.invalid", request.profile);
        let signature = Signature::now(&name, &email).map_err(git("make a signature"))?;
        let parents: Vec<&Commit<'_>> = parent.iter().collect();
        // `Some("HEAD")` moves the branch HEAD points at (creating it when unborn); libgit2
        // itself refuses if that ref's tip is no longer the first parent.
        let oid = repo
            .commit(
                Some("HEAD"),
                &signature,
                &signature,
                &message_with_trailers(request, digest),
                &tree,
                &parents,
            )
            .map_err(git("commit"))?;
        self.update_worktree_index(&repo, &changes);
        Ok(CommitStep::Committed(oid))
    }

    /// Mirrors the committed paths into the worktree's own index, as `git commit --only`
    /// does, so `git status` agrees with the new HEAD. The commit already stands; a failure
    /// here only leaves the index stale, and is logged.
    fn update_worktree_index(&self, repo: &Repository, changes: &[(usize, &str, PathChange)]) {
        let result = (|| -> Result<(), git2::Error> {
            let mut index = repo.index()?;
            for (_, path, change) in changes {
                match change {
                    PathChange::Upsert { entry, .. } => index.add(entry)?,
                    PathChange::Delete => {
                        if index.get_path(Path::new(*path), 0).is_some() {
                            index.remove_path(Path::new(*path))?;
                        }
                    }
                }
            }
            index.write()
        })();
        if let Err(e) = result {
            tracing::warn!(
                worktree = %self.worktree.display(),
                error = %e.message(),
                "committed, but the worktree index was not updated"
            );
        }
    }
}

fn head_state(repo: &Repository) -> Result<HeadState, git2::Error> {
    match repo.head() {
        Ok(head) => {
            let oid = head.peel_to_commit()?.id();
            let branch = if head.is_branch() {
                head.name().map(str::to_string)
            } else {
                None
            };
            Ok(HeadState {
                oid: Some(oid),
                branch,
            })
        }
        Err(e) if e.code() == ErrorCode::UnbornBranch => {
            let head = repo.find_reference("HEAD")?;
            Ok(HeadState {
                oid: None,
                branch: head.symbolic_target().map(str::to_string),
            })
        }
        Err(e) => Err(e),
    }
}

/// Whether `oid` is the commit this very request made: parent `expected` and the same
/// request digest in its trailer.
fn carries_request(repo: &Repository, oid: Oid, expected: Option<Oid>, digest: &str) -> bool {
    let Ok(commit) = repo.find_commit(oid) else {
        return false;
    };
    let parents: Vec<Oid> = commit.parent_ids().collect();
    let parent_matches = match expected {
        Some(expected) => parents == [expected],
        None => parents.is_empty(),
    };
    let trailer = format!("{DIGEST_TRAILER}: {digest}");
    parent_matches
        && commit
            .message()
            .is_some_and(|message| message.lines().any(|line| line == trailer))
}

fn message_with_trailers(request: &CommitRequest, digest: &str) -> String {
    format!(
        "{}\n\nSquadron-Profile: {}\nSquadron-Lease: {}\nSquadron-Generation: {}\n{DIGEST_TRAILER}: {digest}\n",
        request.message.trim_end(),
        request.profile,
        request.lease,
        request.generation,
    )
}

fn invalid_path(index: usize, message: impl Into<String>) -> Refusal {
    Refusal::new(RefusalCode::InvalidArgument, message).with_field(format!("paths[{index}]"))
}

fn describe(oid: Option<Oid>) -> String {
    match oid {
        Some(oid) => oid.to_string(),
        None => "unborn".to_string(),
    }
}
