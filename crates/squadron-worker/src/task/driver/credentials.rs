//! The attempt's credential lease (INV-13): taken just before the provider starts, redacted
//! from the outputs and wiped when the attempt ends.

use std::sync::Arc;

use super::TaskDriver;
use crate::runtime::{LaunchSpec, Runtime, SandboxHandle};
use squadron_core::manifest::{Keyword as _, NetworkMode};

use crate::egress::{EgressOwner, EgressSession};
use crate::error::WorkerError;
use crate::support::{remove_path, write_atomic};
use crate::task::credential_session::{CredentialSession, Redactor};
use crate::task::launcher::EGRESS_ENV_FILE_NAME;

impl TaskDriver {
    /// Takes the lease the manifest's credentials need and writes the files for the sandbox
    /// user — or, for those injected at egress, hands the runtime their proxy and the
    /// sandbox their base URLs; the refusal (a revoked or unknown credential, a lost lease,
    /// a sandbox that cannot take an injected one) fails the task.
    pub(super) async fn take_credentials(
        &mut self,
        runtime: &dyn Runtime,
        spec: &mut LaunchSpec,
    ) -> Result<(), String> {
        let Some(session) = &spec.credentials else {
            self.redact_shapes_only();
            return Ok(());
        };
        let grant = self.grant_lease(None).await?;
        // Before the provider starts: a restarted worker must ask for this lease and no other
        // (a plain grant would hand its proxy a value put after a revoke).
        self.try_checkpoint(|c| c.credential_lease = Some(grant.lease.get()))
            .map_err(|e| format!("credentials: recording the lease: {e}"))?;
        let egress = EgressSession::of(
            EgressOwner::Task(self.task),
            &grant,
            self.ctx.control.clone(),
            self.ctx.config.egress_ca.as_deref(),
        )
        .map_err(|e| format!("credentials: {e}"))?;
        if egress.is_some() {
            let injected = grant.credentials.iter().find(|c| c.egress.is_some());
            let id = injected.map(|c| c.id.to_string()).unwrap_or_default();
            let own_network = runtime.agent_over_channel() || spec.network != NetworkMode::Full;
            if !runtime.serves_egress() || !own_network {
                return Err(format!(
                    "credentials: credential {id} is injected at egress, which needs a KVM guest, \
                     or the process or Docker runtime with network_mode isolated, outbound or \
                     gateway (this attempt: {} runtime, {} network)",
                    runtime.kind().as_str(),
                    spec.network.as_str()
                ));
            }
        }
        self.write_egress_env(egress.as_deref())
            .map_err(|e| format!("credentials: {e}"))?;
        let owner = runtime.sandbox_owner(spec).map_err(|e| e.to_string())?;
        let redactor = session
            .fill(&grant, owner)
            .map_err(|e| format!("credentials: {e}"))?
            .with_profile(&self.spec);
        spec.egress = egress.clone();
        self.egress = egress;
        let ids: Vec<String> = grant.credentials.iter().map(|c| c.id.to_string()).collect();
        self.event(serde_json::json!({"event": "credentials_leased", "lease": grant.lease.get(), "credentials": ids, "session": grant.session}));
        self.install_redactor(redactor);
        Ok(())
    }

    /// An attempt without credentials whose redaction profile hides secrets by their shape
    /// (`provider-secrets-v1`): its outputs are served through that from the start, and
    /// rewritten at the end.
    pub(super) fn redact_shapes_only(&mut self) {
        if self.redactor.is_some() {
            return;
        }
        let redactor = Redactor::default().with_profile(&self.spec);
        if !redactor.is_empty() {
            self.install_redactor(redactor);
        }
    }

    /// The provider ran with values this life never held (a lease that could not be taken
    /// again after a restart): nothing here can redact them, so none of the attempt's output
    /// is served from now on, rather than the values in clear.
    fn mark_not_redacted(&mut self) {
        let marker = self.dir.unredacted_marker();
        if marker.exists() {
            return;
        }
        let why = "the provider ran with credentials this worker's life could not hold again \
                   to redact them";
        if let Err(e) = write_atomic(&marker, why.as_bytes()) {
            tracing::error!(task = %self.task, error = %e, "cannot mark the outbox unredacted");
        }
        self.event(serde_json::json!({"event": "credentials_not_redacted", "reason": why}));
    }

    /// The live view of this attempt's outputs goes through `redactor` from now on.
    fn install_redactor(&mut self, redactor: Redactor) {
        let redactor = Arc::new(redactor);
        self.ctx.redactions.insert(self.task, redactor.clone());
        self.redactor = Some(redactor);
    }

    /// An attempt adopted after a restart whose provider started in the worker's last life:
    /// the values went with that life (its credential tmpfs swept at start), so the lease is
    /// taken again for what the attempt's end needs — the redaction — and a proxy of
    /// credentials injected at egress is served again in the sandbox, accepting the
    /// placeholder the provider holds. Failing that, the attempt runs on (its provider meets
    /// a refused connection, as if the upstream were down) and the event says why.
    pub(super) async fn resume_credentials(
        &mut self,
        runtime: &dyn Runtime,
        handle: &SandboxHandle,
    ) {
        let has_credentials = CredentialSession::of(
            &self.ctx.config.data_dir,
            self.task,
            self.attempt,
            &self.spec,
        )
        .is_some();
        // The shapes alone may already be hidden (the driver's start): the values are not.
        let holds_values = self.redactor.as_ref().is_some_and(|r| r.has_values());
        if holds_values || !has_credentials {
            return;
        }
        match self.take_credentials_again(runtime, handle).await {
            Ok(egress) => {
                self.event(serde_json::json!({"event": "credentials_resumed", "egress": egress}));
            }
            Err(why) => {
                tracing::warn!(task = %self.task, error = %why, "credentials not resumed after a restart");
                self.event(serde_json::json!({"event": "credentials_not_resumed", "reason": why}));
                // Only the values matter here: a lease taken again whose proxy could not be
                // served still redacts.
                if !self.redactor.as_ref().is_some_and(|r| r.has_values()) {
                    self.mark_not_redacted();
                }
            }
        }
    }

    /// The lease again, the redaction, and the proxy if `egress.env` says the last life
    /// served one; `Ok(true)` when it serves the proxy again.
    async fn take_credentials_again(
        &mut self,
        runtime: &dyn Runtime,
        handle: &SandboxHandle,
    ) -> Result<bool, String> {
        // The lease the last life took, and only it: a credential revoked (and put again)
        // since ended it, and a plain grant would hand the provider's proxy the new value.
        let held = match self.load_checkpoint().and_then(|c| c.credential_lease) {
            Some(id) => Some(
                squadron_core::ids::CredentialLeaseId::new(id)
                    .map_err(|e| format!("credentials: the recorded lease {id}: {e}"))?,
            ),
            // A checkpoint of a worker older than the record: the plain grant it would take.
            None => None,
        };
        let grant = self.grant_lease(held).await?;
        self.install_redactor(Redactor::of_grant(&grant).with_profile(&self.spec));
        let path = self.dir.run().join(EGRESS_ENV_FILE_NAME);
        let egress_env = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(format!("credentials: {}: {e}", path.display())),
        };
        let egress = EgressSession::resumed(
            EgressOwner::Task(self.task),
            &grant,
            self.ctx.control.clone(),
            self.ctx.config.egress_ca.as_deref(),
            &egress_env,
        )
        .map_err(|e| format!("credentials: {e}"))?;
        let Some(egress) = egress else {
            return Ok(false);
        };
        self.serve_egress(runtime, handle, &egress)
            .await
            .map_err(|e| format!("credentials: serving egress injection again: {e}"))?;
        self.egress = Some(egress);
        Ok(true)
    }

    /// Serves `egress` to the started sandbox: a VM's over its agent channel (the worker
    /// cannot listen inside another kernel; the guest's agent accepts there for it), every
    /// other's on the sandbox's own loopback.
    pub(super) async fn serve_egress(
        &self,
        runtime: &dyn Runtime,
        handle: &SandboxHandle,
        egress: &Arc<EgressSession>,
    ) -> Result<(), WorkerError> {
        if runtime.agent_over_channel() {
            return self.ctx.relays.serve_egress(self.task, egress);
        }
        runtime.serve_egress(handle, egress).await
    }

    /// This attempt's credential lease, as the control plane grants it to this worker; with
    /// `only_lease`, that lease or a refusal.
    async fn grant_lease(
        &self,
        only_lease: Option<squadron_core::ids::CredentialLeaseId>,
    ) -> Result<squadron_client::CredentialLeaseGrant, String> {
        let req = squadron_client::GrantCredentialLease {
            worker: self.ctx.config.id.clone(),
            attempt: self.attempt,
            only_lease,
        };
        self.ctx
            .control
            .grant_credential_lease(self.task, &req)
            .await
            .map_err(|e| format!("credentials: {e}"))
    }

    /// `run/egress.env` for this attempt's injected credentials, or none: an earlier
    /// attempt's placeholder would be refused.
    fn write_egress_env(&self, egress: Option<&EgressSession>) -> Result<(), WorkerError> {
        let path = self.dir.run().join(EGRESS_ENV_FILE_NAME);
        match egress {
            Some(egress) => write_atomic(&path, egress.env_script()?.as_bytes()),
            None => remove_path(&path),
        }
    }

    /// The attempt is over here: redact what it wrote, then drop the values and the files.
    pub(super) fn end_credentials(&mut self) {
        if let Some(egress) = self.egress.take() {
            egress.close();
            if let Err(e) = self.write_egress_env(None) {
                tracing::warn!(task = %self.task, error = %e, "cannot remove egress.env");
            }
            self.event(serde_json::json!({"event": "egress_closed"}));
        }
        let session = CredentialSession::of(
            &self.ctx.config.data_dir,
            self.task,
            self.attempt,
            &self.spec,
        );
        let values_held = self.redactor.as_ref().is_some_and(|r| r.has_values());
        let provider_started = self
            .load_checkpoint()
            .and_then(|c| c.started_at_ms)
            .is_some();
        if session.is_some() && !values_held && provider_started {
            // A restart at COMPLETING: written before any live view goes.
            self.mark_not_redacted();
        }
        if let Some(redactor) = self.redactor.take() {
            let (changed, skipped) = redactor.rewrite_outbox(&self.dir);
            if !skipped.is_empty() {
                // Before the live view goes: from now on only this keeps the files unserved.
                let marker = self.dir.unredacted_marker();
                if let Err(e) = write_atomic(&marker, skipped.join("\n").as_bytes()) {
                    tracing::error!(task = %self.task, error = %e, "cannot mark the outbox unredacted");
                }
            }
            // Readers see the rewritten files from here on, at the offsets the view gave.
            self.ctx.redactions.remove(self.task);
            let event = if redactor.has_values() {
                "credentials_redacted"
            } else {
                "secrets_redacted"
            };
            self.event(serde_json::json!({"event": event, "files": changed, "skipped": skipped}));
        }
        let Some(session) = session else {
            return;
        };
        match session.wipe() {
            Ok(()) => self.event(serde_json::json!({"event": "credentials_wiped"})),
            Err(e) => {
                tracing::error!(task = %self.task, error = %e, "cannot wipe the credential session")
            }
        }
    }
}
