//! The account of a generation that left without a handover (issue 16: "crash takeover the
//! same after kill -9"). A graceful takeover commits the stopped generation's capsule; a
//! generation that crashed, exited or was stopped commits none, and what it did lies only in
//! its structured stream. So before the next generation starts here, it commits that account
//! under its own fence (the capsule chain's writer is the lease holder, INV-8's chain), and
//! starts from it — with the previous CLI's session, which the same CLI then resumes.
//!
//! A generation's account is missing when nothing was committed since it started: its run
//! directory keeps the capsule it started from (`capsule.json`), and the newest capsule is
//! still that one (or there is none at all).

use std::path::Path;

use squadron_api::leases::CommitCapsule;
use squadron_core::capsule::{CapsuleDraft, ContinuityCapsule};
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::Generation;
use squadron_core::limits::CAPSULE_SCHEMA_VERSION_CURRENT;
use squadron_core::Outcome;

use crate::agent::error::AgentError;
use crate::agent::launch::GrantedAttempt;
use crate::agent::project_sandbox::ProfilePaths;
use crate::agent::stream_capsule::{capsule_from_stream, read_run_file, Ending};
use crate::agent::supervisor::{blocking, unexpected, AgentSupervisor};
use crate::agent::takeover::branch_tip;

/// Largest `capsule.json` or `identity.json` run file read back (the worker wrote them; a
/// capsule is bounded far below this by the core's limits).
const RUN_FILE_BYTES_MAX: u64 = 1024 * 1024;

impl AgentSupervisor {
    /// The capsule the granted generation starts from: the previous generation's account
    /// from its stream, committed now, when it left none; else the newest capsule as read.
    pub(super) async fn catch_up_capsule(
        &self,
        g: &GrantedAttempt<'_>,
    ) -> Result<Option<ContinuityCapsule>, AgentError> {
        let Some(previous) = g.token.generation.get().checked_sub(1).map(Generation::new) else {
            return Ok(g.capsule.clone());
        };
        let paths = g.sandbox.profile_paths(&g.profile.key);
        let newest = g.capsule.as_ref().map_or(0, |c| c.sequence);
        let (p, git_dir) = (paths.clone(), g.sandbox.git_dir());
        let cursor = self.inner.control.read_mailbox(g.profile.id).await?;
        let cursor = cursor.acked_through;
        let account =
            blocking(move || Ok(unhanded_account(&p, &git_dir, previous, newest, cursor))).await?;
        let Some(payload) = account else {
            return Ok(g.capsule.clone());
        };
        let req = CommitCapsule {
            lease: g.token.lease,
            generation: g.token.generation,
            capsule: CapsuleDraft {
                sequence: newest + 1,
                previous: g.capsule.as_ref().map(|c| c.digest),
                schema_version: CAPSULE_SCHEMA_VERSION_CURRENT,
                payload,
                expected_digest: None,
            },
        };
        let outcome = self
            .inner
            .control
            .commit_capsule(g.profile.id, &req)
            .await
            .map_err(|e| {
                AgentError::from(e).context("committing the previous generation's account")
            })?;
        let Outcome::CapsuleCommitted { sequence, digest } = outcome else {
            return Err(unexpected("commit capsule", &outcome));
        };
        let Some(committed) = self.read_back(g.profile.id, (sequence, digest)).await? else {
            return Err(AgentError::new(
                ErrorCode::Internal,
                format!(
                    "capsule {sequence} of profile {} is missing after commit",
                    g.profile.id
                ),
            ));
        };
        tracing::info!(profile = %g.profile.id, %previous, sequence, "committed the account of a generation that left without a handover");
        Ok(Some(committed))
    }
}

/// The account of generation `previous` from its stream, when it ran here and nothing was
/// committed since it started (`newest` is the newest capsule's sequence, 0 for none).
fn unhanded_account(
    paths: &ProfilePaths,
    git_dir: &Path,
    previous: Generation,
    newest: u64,
    mailbox_cursor: u64,
) -> Option<squadron_core::capsule::CapsulePayload> {
    let run_dir = paths.generation_run_dir(previous);
    let started_from = started_from(&run_dir)?;
    if newest > started_from {
        return None;
    }
    let provider = provider_of(&run_dir)?;
    let revision = branch_tip(git_dir, &paths.branch);
    capsule_from_stream(
        paths,
        previous,
        provider,
        Ending::Unhanded,
        revision,
        mailbox_cursor,
    )
}

/// The sequence of the capsule a generation started from (0 for none); `None` when it never
/// started here.
fn started_from(run_dir: &Path) -> Option<u64> {
    if !run_dir.is_dir() {
        return None;
    }
    match read_run_file(&run_dir.join("capsule.json"), RUN_FILE_BYTES_MAX) {
        None => Some(0),
        Some(bytes) => serde_json::from_slice::<ContinuityCapsule>(&bytes)
            .ok()
            .map(|c| c.sequence),
    }
}

/// The provider a generation ran, from its `identity.json` run file.
fn provider_of(run_dir: &Path) -> Option<squadron_core::provider::Provider> {
    let bytes = read_run_file(&run_dir.join("identity.json"), RUN_FILE_BYTES_MAX)?;
    let identity: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    serde_json::from_value(identity.get("provider")?.clone()).ok()
}
