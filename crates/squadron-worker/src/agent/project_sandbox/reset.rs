//! `reset_worktree`: the only way a profile's worktree is reset, gated on proof that the
//! leaf of its last started generation is quiescent (ADR-0011 decision 6, INV-9).

use std::path::Path;

use git2::build::CheckoutBuilder;
use git2::{Repository, ResetType};
use squadron_core::ids::ProfileKey;
use squadron_isolation::ReapEvidence;

use super::{git_error, invalid, list_names, ProjectSandbox, StartedGeneration};
use crate::agent::runtime::leaf_populated;
use crate::error::WorkerError;
use crate::support::{remove_path, write_atomic};

impl ProjectSandbox {
    /// Resets the profile's worktree to the tip of `squadron/{key}`: every file of the
    /// worktree is removed (symlinks are not followed), the `.git` link rewritten, the tip
    /// checked out and the index reset. Returns the commit.
    ///
    /// Refused unless `proof` is reap evidence with `populated: false` for the leaf of the
    /// profile's last started generation, and that leaf is not populated now. A profile
    /// that never started on this worker needs no proof.
    #[allow(
        dead_code,
        reason = "no caller yet: a takeover that resets the worktree will use it (ADR-0011 decision 6); the tests prove the proof requirement"
    )]
    pub(crate) fn reset_worktree(
        &self,
        key: &ProfileKey,
        proof: Option<&ReapEvidence>,
    ) -> Result<String, WorkerError> {
        let _guard = self.guard();
        let paths = self.profile_paths(key);
        let admin = self.git_dir().join("worktrees").join(key.as_str());
        if !self.has_worktree(key) {
            return Err(invalid(
                "profile_key",
                format!("{key} has no worktree in {}", self.root.display()),
            ));
        }
        if let Some(last) = self.last_started(key)? {
            check_quiescence_proof(key, &last, proof)?;
        }

        for name in list_names(&paths.worktree)? {
            remove_path(&paths.worktree.join(name))?;
        }
        let gitfile = paths.worktree.join(".git");
        let link = format!("gitdir: {}\n", admin.display());
        write_atomic(&gitfile, link.as_bytes())?;
        let repo = Repository::open(&paths.worktree)
            .map_err(|e| git_error("opening the profile worktree", &e))?;
        let refname = format!("refs/heads/{}", paths.branch);
        let tip = repo
            .find_reference(&refname)
            .and_then(|r| r.peel_to_commit())
            .map_err(|e| git_error("finding the profile branch", &e))?;
        repo.set_head(&refname)
            .map_err(|e| git_error("pointing the worktree at its branch", &e))?;
        let mut checkout = CheckoutBuilder::new();
        checkout.force().recreate_missing(true);
        repo.reset(tip.as_object(), ResetType::Hard, Some(&mut checkout))
            .map_err(|e| git_error("resetting the profile worktree", &e))?;
        Ok(tip.id().to_string())
    }
}

/// The proof `reset_worktree` demands for the last started generation.
#[allow(
    dead_code,
    reason = "no caller yet: a takeover that resets the worktree will use it (ADR-0011 decision 6); the tests prove the proof requirement"
)]
pub(super) fn check_quiescence_proof(
    key: &ProfileKey,
    last: &StartedGeneration,
    proof: Option<&ReapEvidence>,
) -> Result<(), WorkerError> {
    let generation = last.generation;
    let Some(proof) = proof else {
        return Err(invalid(
            "reap evidence",
            format!(
                "missing: resetting the worktree of {key} needs reap evidence that generation \
                 {generation} (cgroup {}) is quiescent",
                last.cgroup
            ),
        ));
    };
    if proof.cgroup != last.cgroup {
        return Err(invalid(
            "reap evidence",
            format!(
                "it is for {}, not for {}, the leaf of generation {generation} of {key}, the \
                 last one started",
                proof.cgroup, last.cgroup
            ),
        ));
    }
    if proof.populated {
        return Err(invalid(
            "reap evidence",
            format!(
                "{} was still populated when reaped; generation {generation} of {key} is not \
                 proved quiescent",
                proof.cgroup
            ),
        ));
    }
    if leaf_populated(Path::new(&last.cgroup))? {
        return Err(invalid(
            "reap evidence",
            format!(
                "{} is populated now; generation {generation} of {key} runs again",
                last.cgroup
            ),
        ));
    }
    Ok(())
}
