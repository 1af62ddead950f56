//! A profile generation's credentials (INV-13, "agent profiles get credentials the same
//! way"): the lease is taken right after the runtime lease is granted and before the provider
//! starts; the values become 0400 files of the sandbox user in a tmpfs of their own,
//! `run/{key}/g{n}.credentials/` in the project sandbox, bound read-only at
//! `/run/squadron/credentials/profile-{id}-g{n}` with `{MOUNT}_FILE` variables.
//!
//! The control plane ends the lease the moment the runtime lease stops being active. The
//! files go with the generation's proving reap (`AgentAttempt::reap`, every way an attempt
//! ends: stop, exit, takeover, crash takeover, a restarted worker's reap): its logs are
//! first rewritten with `[REDACTED:cred_id]` in place of each value, read back from the files
//! themselves, so a reap after a restart redacts as well. `g{n}.credentials.json` records
//! which credential each mount holds (ids only).

use std::collections::BTreeMap;
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use squadron_client::{CredentialLeaseGrant, GrantAgentCredentialLease};
use squadron_core::ids::Generation;
use squadron_core::lease::FencingToken;
use squadron_core::manifest::CredentialRef;
use squadron_core::profile_credentials::agent_session_name;

use crate::agent::error::AgentError;
use crate::agent::project_sandbox::ProfilePaths;
use crate::agent::supervisor::AgentSupervisor;
use crate::error::WorkerError;
use crate::support::write_atomic;
use crate::task::credential_session::{CredentialSession, Redactor};
use squadron_isolation::secret_tmpfs::{wipe_secret_tmpfs, SECRET_TMPFS_BYTES_DEFAULT};

/// What a started generation is shown of its credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentCredentials {
    /// The filled tmpfs on the worker.
    pub(crate) host: PathBuf,
    /// Where it appears inside the boundary.
    pub(crate) sandbox: String,
    /// `{MOUNT}_FILE` → the file's path inside: paths only.
    pub(crate) env: BTreeMap<String, String>,
}

impl AgentSupervisor {
    /// Takes the generation's credential lease and writes the files for `owner`; `None` when
    /// the profile names no credentials. A refusal (a revoked credential, a lease no longer
    /// active) fails the start, and the runtime lease is released by the caller.
    pub(super) async fn take_credentials(
        &self,
        paths: &ProfilePaths,
        token: FencingToken,
        owner: (u32, u32),
    ) -> Result<Option<AgentCredentials>, AgentError> {
        let refs = self
            .inner
            .control
            .profile_credentials(token.profile)
            .await?;
        if refs.is_empty() {
            return Ok(None);
        }
        let req = GrantAgentCredentialLease {
            worker: self.inner.worker.clone(),
            fence: token,
        };
        let grant = self
            .inner
            .control
            .grant_agent_credential_lease(token.profile, &req)
            .await
            .map_err(|e| AgentError::from(e).context("taking the profile's credentials"))?;
        // Never a file for a value an admin keeps out of sandboxes; agent generations have
        // no egress proxy yet, so the launch fails naming the credential.
        if let Some(injected) = grant.credentials.iter().find(|c| c.egress.is_some()) {
            return Err(AgentError::invalid(
                "credential_refs",
                format!(
                    "credential {} is injected at egress, which agent profiles do not support \
                     yet; name a credential without an egress binding",
                    injected.id
                ),
            ));
        }
        let session_name = agent_session_name(token.profile, token.generation);
        let session = CredentialSession::at(
            credentials_dir(paths, token.generation),
            &session_name,
            refs.clone(),
        );
        let (host, sandbox, env) = (
            session.host_dir().to_path_buf(),
            session.sandbox_dir().to_owned(),
            session.env(),
        );
        let record = credentials_record(paths, token.generation);
        super::supervisor::blocking(move || fill(&session, &grant, owner, &record, &refs)).await?;
        tracing::info!(profile = %token.profile, generation = %token.generation, session = %session_name, "credentials leased");
        Ok(Some(AgentCredentials { host, sandbox, env }))
    }
}

fn fill(
    session: &CredentialSession,
    grant: &CredentialLeaseGrant,
    owner: (u32, u32),
    record: &Path,
    refs: &[CredentialRef],
) -> Result<(), WorkerError> {
    let ids = serde_json::to_vec(refs)
        .map_err(|e| WorkerError::runtime("credentials", format!("encoding the record: {e}")))?;
    write_atomic(record, &ids)?;
    if let Err(e) = session.fill(grant, owner) {
        let _ = session.wipe();
        return Err(e);
    }
    Ok(())
}

/// The generation's tmpfs on the worker.
pub(crate) fn credentials_dir(paths: &ProfilePaths, generation: Generation) -> PathBuf {
    paths.run.join(format!("g{generation}.credentials"))
}

fn credentials_record(paths: &ProfilePaths, generation: Generation) -> PathBuf {
    paths.run.join(format!("g{generation}.credentials.json"))
}

/// At the proving reap: the generation's logs redacted with the values still in its files,
/// then the files and the tmpfs gone. Nothing to do for a generation without credentials.
pub(crate) fn redact_and_wipe(
    paths: &ProfilePaths,
    generation: Generation,
) -> Result<(), WorkerError> {
    let dir = credentials_dir(paths, generation);
    let record = credentials_record(paths, generation);
    if !dir.exists() && !record.exists() {
        return Ok(());
    }
    let redactor = redactor_from_files(&dir, &record);
    let logs = [
        PathBuf::from(format!("g{generation}.stdout.log")),
        PathBuf::from(format!("g{generation}.stderr.log")),
    ];
    let (changed, skipped) = redactor.rewrite_files(&paths.logs, &logs);
    for why in &skipped {
        tracing::warn!(profile = %paths.key, %generation, "log not redacted: {why}");
    }
    wipe_secret_tmpfs(&dir).map_err(|e| WorkerError::runtime("credentials", e.to_string()))?;
    crate::support::remove_path(&record)?;
    tracing::info!(profile = %paths.key, %generation, logs_redacted = changed, "credentials wiped");
    Ok(())
}

/// What a live read of the generation's logs shows them through while it holds credentials
/// (its files exist): the values those files hold now, so a rotated value is hidden as soon
/// as it is written. `None` for a generation without credentials.
pub(crate) fn live_redactor(paths: &ProfilePaths, generation: Generation) -> Option<Redactor> {
    let (dir, record) = (
        credentials_dir(paths, generation),
        credentials_record(paths, generation),
    );
    (dir.exists() || record.exists()).then(|| redactor_from_files(&dir, &record))
}

/// The values the generation's files hold, each under the id its mount was granted for.
/// Unreadable or oversized files are skipped: the wipe that follows removes them anyway.
fn redactor_from_files(dir: &Path, record: &Path) -> Redactor {
    let mut redactor = Redactor::default();
    let refs: Vec<CredentialRef> = fs::read(record)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    for r in refs {
        let mut value = zeroize::Zeroizing::new(Vec::new());
        let read = fs::File::open(dir.join(&r.mount))
            .and_then(|f| f.take(SECRET_TMPFS_BYTES_DEFAULT).read_to_end(&mut value));
        if read.is_ok() {
            redactor.add(&value, r.id.as_str());
        }
    }
    redactor
}
