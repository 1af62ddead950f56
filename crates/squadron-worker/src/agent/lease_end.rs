//! How a lease ends once its process is gone: released while it is still the profile's
//! writer, else ended by the reap evidence (fenced or expired). Whatever does not get
//! through is owed and sent again by the tick loop, so no slot is ever left behind.

use crate::control_link::CallError;
use squadron_client::types::LeaseFence;
use squadron_core::error_code::ErrorCode;
use squadron_core::lease::FencingToken;

use crate::agent::error::AgentError;
use crate::agent::state::ReapProof;
use crate::agent::supervisor::AgentSupervisor;

impl AgentSupervisor {
    /// Ends a lease whose process was reaped: released while it is still the writer, else
    /// ended by the evidence (fenced or expired).
    pub(super) async fn end_lease(
        &self,
        token: FencingToken,
        proof: ReapProof,
    ) -> Result<(), AgentError> {
        let fence = LeaseFence {
            profile: token.profile,
            generation: token.generation,
        };
        let released = self.inner.control.release_lease(token.lease, &fence).await;
        let (result, owed) = match released {
            Ok(_) => (Ok(()), None),
            Err(CallError::Refused(_)) => match self.record(token, &proof).await {
                Ok(()) => (Ok(()), None),
                Err(e) => (Err(e.context("recording the reap evidence")), Some(proof)),
            },
            Err(e) => (
                Err(AgentError::from(e).context("releasing the lease")),
                Some(proof),
            ),
        };
        let closed = {
            let mut reg = self.registry();
            if let Some(proof) = owed {
                reg.queue_evidence(token.profile, proof);
            }
            // A newer generation of the profile keeps its socket.
            reg.close_sockets_of(token.lease)
        };
        if closed {
            self.inner.broker.unregister_profile(token.profile.get());
        }
        result
    }

    /// Records the reap evidence of a lease the control plane would not release; `Ok` too
    /// when the lease has ended already (it needs nothing more).
    async fn record(&self, token: FencingToken, proof: &ReapProof) -> Result<(), AgentError> {
        match self
            .inner
            .control
            .record_evidence(proof.record(&token))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                let e = AgentError::from(e);
                if e.message.contains("already ended") {
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Releases a lease whose attempt never ran (or ended); a release that does not get
    /// through is retried by the tick loop, so the slot is never left behind.
    pub(super) async fn release_or_queue(&self, token: FencingToken) {
        if let Err(e) = self.release(token).await {
            tracing::warn!(lease = %token.lease, error = %e, "lease not released yet; retrying");
            self.registry().owe_release(token);
        }
    }

    /// `Ok` when the lease is released or already ended; `Err` when it should be retried.
    async fn release(&self, token: FencingToken) -> Result<(), AgentError> {
        let fence = LeaseFence {
            profile: token.profile,
            generation: token.generation,
        };
        match self.inner.control.release_lease(token.lease, &fence).await {
            Ok(_) => Ok(()),
            // Refused: no longer the profile's active lease (fenced, ended). A fenced one is
            // ended by evidence; `reap_generation` supplies it for a generation that never
            // started.
            Err(CallError::Refused(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) async fn retry_pending_releases(&self) {
        let pending = self.registry().take_releases();
        let mut failed = Vec::new();
        for token in pending {
            if self.release(token).await.is_err() {
                failed.push(token);
            }
        }
        if !failed.is_empty() {
            self.registry().owe_releases(failed);
        }
    }

    pub(super) async fn retry_pending_evidence(&self) {
        let pending = self.registry().pending_evidence();
        for (token, proof) in pending {
            let recorded = self
                .inner
                .control
                .record_evidence(proof.record(&token))
                .await;
            // Not expired yet: asked again next tick. Ended already: nothing to do.
            let done = match recorded {
                Ok(_) => true,
                Err(e) => {
                    let e = AgentError::from(e);
                    e.message.contains("already ended") || e.code == ErrorCode::NotFound
                }
            };
            if done {
                self.registry().clear_evidence(token.profile);
            }
        }
    }
}
