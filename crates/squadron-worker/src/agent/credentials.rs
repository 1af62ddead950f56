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
//! which credential each mount holds in a file (ids only).
//!
//! A credential an admin injects at egress (issue 14 item 8) never becomes a file: the
//! generation gets a placeholder and its own loopback base URL instead
//! (`/mnt/run/egress.env`, sourced before the provider starts), and the worker's proxy,
//! listening in the generation's network namespace, puts the value on the way out. The proxy
//! closes with the generation's sockets (`AgentSockets`) and asks the control plane at every
//! request whether the lease is still active.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use squadron_client::{CredentialLeaseGrant, GrantAgentCredentialLease};
use squadron_core::ids::{CredentialLeaseId, Generation};
use squadron_core::lease::FencingToken;
use squadron_core::manifest::CredentialRef;
use squadron_core::profile_credentials::agent_session_name;

use crate::agent::attempt::AgentAttempt;
use crate::agent::error::AgentError;
use crate::agent::project_sandbox::ProfilePaths;
use crate::agent::stream_capsule::read_run_file;
use crate::agent::supervisor::AgentSupervisor;
use crate::egress::{EgressOwner, EgressSession};
use crate::error::WorkerError;
use crate::support::write_atomic;
use crate::task::credential_session::{file_variable, CredentialSession, Redactor};
use crate::task::launcher::EGRESS_ENV_FILE_NAME;
use squadron_isolation::secret_tmpfs::{wipe_secret_tmpfs, SECRET_TMPFS_BYTES_DEFAULT};

/// Largest `egress.env` read back after a restart (a few base URLs and a placeholder).
const EGRESS_ENV_BYTES_MAX: u64 = 64 * 1024;
/// Largest `g{n}.egress-lease` read back (a credential lease id).
const EGRESS_LEASE_RECORD_BYTES_MAX: u64 = 64;

/// What a started generation is shown of its credentials.
#[derive(Debug, Clone)]
pub(crate) struct AgentCredentials {
    /// The filled tmpfs on the worker.
    pub(crate) host: PathBuf,
    /// Where it appears inside the boundary.
    pub(crate) sandbox: String,
    /// `{MOUNT}_FILE` → the file's path inside, for the mounts held in files: paths only.
    pub(crate) env: BTreeMap<String, String>,
    /// The proxy of the credentials injected at egress, served in the generation's network
    /// namespace before its provider starts.
    pub(crate) egress: Option<Arc<EgressSession>>,
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
        let grant = self
            .grant_credentials(token, None)
            .await
            .map_err(|e| e.context("taking the profile's credentials"))?;
        // Never a file for a value an admin keeps out of sandboxes: its proxy instead.
        let egress = EgressSession::of(
            EgressOwner::Agent {
                profile: token.profile,
                generation: token.generation,
            },
            &grant,
            self.inner.control.clone(),
            self.inner.config.egress_ca.as_deref(),
        )
        .map_err(|e| AgentError::from(e).context("taking the profile's credentials"))?;
        let injected: BTreeSet<String> = egress
            .iter()
            .flat_map(|e| e.mounts().map(str::to_owned))
            .collect();
        let session_name = agent_session_name(token.profile, token.generation);
        let session = CredentialSession::at(
            credentials_dir(paths, token.generation),
            &session_name,
            refs.clone(),
        );
        let mut env = session.env();
        env.retain(|name, _| !injected.iter().any(|m| file_variable(m) == *name));
        let (host, sandbox) = (
            session.host_dir().to_path_buf(),
            session.sandbox_dir().to_owned(),
        );
        // The record names the mounts held in files: those are what the reap reads back to
        // redact, and a live read demands every one it names.
        let in_files: Vec<CredentialRef> = refs
            .into_iter()
            .filter(|r| !injected.contains(&r.mount))
            .collect();
        let record = credentials_record(paths, token.generation);
        let lease = egress.as_ref().map(|_| {
            (
                egress_lease_record(paths, token.generation),
                grant.lease.to_string(),
            )
        });
        super::supervisor::blocking(move || {
            // The lease the proxy was served under: a restarted worker serves it again only
            // while that very lease is active (`serve_egress_again`).
            if let Some((path, id)) = &lease {
                write_atomic(path, id.as_bytes())?;
            }
            fill(&session, &grant, owner, &record, &in_files)
        })
        .await?;
        tracing::info!(profile = %token.profile, generation = %token.generation, session = %session_name, injected = injected.len(), "credentials leased");
        Ok(Some(AgentCredentials {
            host,
            sandbox,
            env,
            egress,
        }))
    }

    /// An adopted generation whose provider holds a placeholder the worker's last life gave
    /// it (its `egress.env`): the lease again (the same one: a second grant under one runtime
    /// lease returns it) and the proxy served again, accepting that placeholder. Failing
    /// that, the provider meets a refused connection, as if the upstream were down; `None`.
    pub(super) async fn resume_egress(
        &self,
        attempt: &AgentAttempt,
        run_dir: &Path,
        token: FencingToken,
    ) -> Option<Arc<EgressSession>> {
        let text = read_run_file(&run_dir.join(EGRESS_ENV_FILE_NAME), EGRESS_ENV_BYTES_MAX)?;
        match self.serve_egress_again(attempt, token, &text).await {
            Ok(egress) => {
                tracing::info!(profile = %token.profile, generation = %token.generation, "egress injection served again");
                Some(egress)
            }
            Err(e) => {
                tracing::warn!(profile = %token.profile, generation = %token.generation, error = %e, "egress injection not served again after a restart");
                None
            }
        }
    }

    /// The generation's credential lease, as the control plane grants it to this worker
    /// (the same lease again for a second grant under one runtime lease); with `only`, that
    /// lease or a refusal, never a new one.
    async fn grant_credentials(
        &self,
        token: FencingToken,
        only: Option<CredentialLeaseId>,
    ) -> Result<CredentialLeaseGrant, AgentError> {
        let req = GrantAgentCredentialLease {
            worker: self.inner.worker.clone(),
            fence: token,
            only_lease: only,
        };
        Ok(self
            .inner
            .control
            .grant_agent_credential_lease(token.profile, &req)
            .await?)
    }

    /// The credential lease the worker's last life served the generation's proxy under. It is
    /// asked for again as the only lease the grant may answer with (in the same command that
    /// checks it is active): one that ended (the credential revoked) is never followed by a new
    /// one for the same generation, whatever the credential holds now.
    fn served_lease(
        attempt: &AgentAttempt,
        token: FencingToken,
    ) -> Result<CredentialLeaseId, AgentError> {
        let path = egress_lease_record(attempt.paths(), token.generation);
        let text = read_run_file(&path, EGRESS_LEASE_RECORD_BYTES_MAX).unwrap_or_default();
        std::str::from_utf8(&text)
            .ok()
            .and_then(|t| t.trim().parse::<CredentialLeaseId>().ok())
            .ok_or_else(|| {
                AgentError::precondition(format!("{} names no credential lease", path.display()))
            })
    }

    async fn serve_egress_again(
        &self,
        attempt: &AgentAttempt,
        token: FencingToken,
        egress_env: &[u8],
    ) -> Result<Arc<EgressSession>, AgentError> {
        let egress_env = std::str::from_utf8(egress_env)
            .map_err(|e| AgentError::invalid(EGRESS_ENV_FILE_NAME, e.to_string()))?;
        let served = Self::served_lease(attempt, token)?;
        let grant = self.grant_credentials(token, Some(served)).await?;
        // The control plane answers with that lease or refuses; anything else is a bug there.
        if grant.lease != served {
            return Err(AgentError::precondition(format!(
                "asked for credential lease {served} only, granted {}",
                grant.lease
            )));
        }
        let owner = EgressOwner::Agent {
            profile: token.profile,
            generation: token.generation,
        };
        let egress = EgressSession::resumed(
            owner,
            &grant,
            self.inner.control.clone(),
            self.inner.config.egress_ca.as_deref(),
            egress_env,
        )?
        .ok_or_else(|| {
            AgentError::invalid(
                "credential_refs",
                "no credential is injected at egress any more",
            )
        })?;
        attempt.serve_egress_again(&egress)?;
        Ok(egress)
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

/// `run/{key}/g{n}.egress-lease`: the credential lease the generation's egress proxy serves
/// under (an id, nothing secret), beside the other records the sandbox never sees.
fn egress_lease_record(paths: &ProfilePaths, generation: Generation) -> PathBuf {
    paths.run.join(format!("g{generation}.egress-lease"))
}

/// At the proving reap: the generation's logs redacted with the values still in its files,
/// then the files and the tmpfs gone. Nothing to do for a generation without credentials.
pub(crate) fn redact_and_wipe(
    paths: &ProfilePaths,
    generation: Generation,
) -> Result<(), WorkerError> {
    let dir = credentials_dir(paths, generation);
    let record = credentials_record(paths, generation);
    crate::support::remove_path(&egress_lease_record(paths, generation))?;
    if !dir.exists() && !record.exists() {
        return Ok(());
    }
    // Whatever can still be read is hidden; what cannot goes with the wipe anyway.
    let (redactor, _unread) = redactor_from_files(&dir, &record);
    let logs = [
        PathBuf::from(format!("g{generation}.stdout.log")),
        PathBuf::from(format!("g{generation}.stderr.log")),
    ];
    let (changed, skipped) = redactor.rewrite_files(&paths.logs, &logs);
    for why in &skipped {
        tracing::warn!(profile = %paths.key, %generation, "log not redacted: {why}");
    }
    if !skipped.is_empty() {
        // Written before the values go: from now on only this says the logs hold secrets.
        write_atomic(
            &unredacted_marker(paths, generation),
            skipped.join("\n").as_bytes(),
        )?;
    }
    wipe_secret_tmpfs(&dir).map_err(|e| WorkerError::runtime("credentials", e.to_string()))?;
    crate::support::remove_path(&record)?;
    tracing::info!(profile = %paths.key, %generation, logs_redacted = changed, "credentials wiped");
    Ok(())
}

/// What a live read of the generation's logs shows them through: the values its credential
/// files hold now, so a rotated value is hidden as soon as it is written; `None` for a
/// generation that never held any. Fails closed: a value it cannot read, or logs the proving
/// reap could not redact (over its size limit), and nothing is served.
pub(crate) fn live_redactor(
    paths: &ProfilePaths,
    generation: Generation,
) -> Result<Option<Redactor>, String> {
    if unredacted_marker(paths, generation).exists() {
        return Err(format!(
            "generation {generation}'s logs held credentials and could not be redacted when \
             it ended; they are not served"
        ));
    }
    let (dir, record) = (
        credentials_dir(paths, generation),
        credentials_record(paths, generation),
    );
    if !dir.exists() && !record.exists() {
        return Ok(None);
    }
    match redactor_from_files(&dir, &record) {
        (redactor, unread) if unread.is_empty() => Ok(Some(redactor)),
        (_, unread) => Err(unread.join("; ")),
    }
}

/// Left in the never-shown run directory when the reap could not redact a log of the
/// generation: its logs are then never served.
fn unredacted_marker(paths: &ProfilePaths, generation: Generation) -> PathBuf {
    paths.run.join(format!("g{generation}.logs-unredacted"))
}

/// The values the generation's files hold, each under the id its mount was granted for, and
/// what could not be read (the record, or a value file): the reap's wipe goes on without
/// those, a live read refuses to serve.
fn redactor_from_files(dir: &Path, record: &Path) -> (Redactor, Vec<String>) {
    let mut redactor = Redactor::default();
    let refs: Result<Vec<CredentialRef>, String> = fs::read(record)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
    let refs = match refs {
        Ok(refs) => refs,
        Err(e) => {
            return (
                redactor,
                vec![format!("the generation's credential record: {e}")],
            )
        }
    };
    let mut unread = Vec::new();
    for r in refs {
        let mut value = zeroize::Zeroizing::new(Vec::new());
        let read = fs::File::open(dir.join(&r.mount))
            .and_then(|f| f.take(SECRET_TMPFS_BYTES_DEFAULT).read_to_end(&mut value));
        match read {
            Ok(_) => redactor.add(&value, r.id.as_str()),
            Err(e) => unread.push(format!(
                "credential {} cannot be read to hide it: {e}",
                r.id.as_str()
            )),
        }
    }
    (redactor, unread)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(root: &Path) -> ProfilePaths {
        let state = root.join("state/pilot");
        ProfilePaths {
            key: squadron_core::ids::ProfileKey::new("pilot").unwrap(),
            worktree: root.join("worktrees/pilot"),
            logs: state.join("logs"),
            state,
            run: root.join("run/pilot"),
            branch: "squadron/pilot".into(),
        }
    }

    /// A live read of a generation's logs fails closed: a credential file it cannot read, or a
    /// generation whose logs the reap could not redact, and there is no redactor to serve
    /// through; a generation that never held credentials needs none.
    #[test]
    fn the_live_redactor_fails_closed() {
        let tmp = tempfile::tempdir().unwrap();
        let p = paths(tmp.path());
        let g = Generation::new(2);
        std::fs::create_dir_all(&p.run).unwrap();
        assert!(matches!(live_redactor(&p, g), Ok(None)));

        std::fs::create_dir_all(credentials_dir(&p, g)).unwrap();
        let record = r#"[{"id":"anthropic","mount":"anthropic_api_key"}]"#;
        std::fs::write(credentials_record(&p, g), record).unwrap();
        let unreadable = live_redactor(&p, g).map(|r| r.is_some());
        assert!(unreadable.is_err(), "{unreadable:?}");

        std::fs::write(
            credentials_dir(&p, g).join("anthropic_api_key"),
            "sk-live-1",
        )
        .unwrap();
        let redactor = live_redactor(&p, g).unwrap().expect("a redactor");
        let shown = redactor.redact(b"key sk-live-1 printed").expect("redacted");
        assert_eq!(shown, b"key [REDACTED:anthropic] printed");

        std::fs::write(unredacted_marker(&p, g), "g2.stdout.log: too large").unwrap();
        assert!(live_redactor(&p, g).is_err());
    }
}
