//! The attempt's credential lease (INV-13): taken just before the provider starts, redacted
//! from the outputs and wiped when the attempt ends.

use std::sync::Arc;

use super::TaskDriver;
use crate::runtime::{LaunchSpec, Runtime};
use crate::task::credential_session::CredentialSession;

impl TaskDriver {
    /// Takes the lease the manifest's credentials need and writes the files for the sandbox
    /// user; the refusal (a revoked or unknown credential, a lost lease) fails the task.
    pub(super) async fn take_credentials(
        &mut self,
        runtime: &dyn Runtime,
        spec: &LaunchSpec,
    ) -> Result<(), String> {
        let Some(session) = &spec.credentials else {
            return Ok(());
        };
        let req = squadron_client::GrantCredentialLease {
            worker: self.ctx.config.id.clone(),
            attempt: self.attempt,
        };
        let grant = self
            .ctx
            .control
            .grant_credential_lease(self.task, &req)
            .await
            .map_err(|e| format!("credentials: {e}"))?;
        let owner = runtime.sandbox_owner(spec).map_err(|e| e.to_string())?;
        let redactor = session
            .fill(&grant, owner)
            .map_err(|e| format!("credentials: {e}"))?;
        let ids: Vec<String> = grant.credentials.iter().map(|c| c.id.to_string()).collect();
        self.event(serde_json::json!({"event": "credentials_leased", "lease": grant.lease.get(), "credentials": ids, "session": grant.session}));
        let redactor = Arc::new(redactor);
        self.ctx.redactions.insert(self.task, redactor.clone());
        self.redactor = Some(redactor);
        Ok(())
    }

    /// The attempt is over here: redact what it wrote, then drop the values and the files.
    pub(super) fn end_credentials(&mut self) {
        let Some(session) = CredentialSession::of(
            &self.ctx.config.data_dir,
            self.task,
            self.attempt,
            &self.spec,
        ) else {
            return;
        };
        if let Some(redactor) = self.redactor.take() {
            let (changed, skipped) = redactor.rewrite_outbox(&self.dir);
            // Readers see the rewritten files from here on, at the offsets the view gave.
            self.ctx.redactions.remove(self.task);
            self.event(serde_json::json!({"event": "credentials_redacted", "files": changed, "skipped": skipped}));
        }
        match session.wipe() {
            Ok(()) => self.event(serde_json::json!({"event": "credentials_wiped"})),
            Err(e) => {
                tracing::error!(task = %self.task, error = %e, "cannot wipe the credential session")
            }
        }
    }
}
