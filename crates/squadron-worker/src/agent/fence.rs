//! The Git broker's fence, checked against the control plane: a commit is allowed only for the
//! profile's live lease, at the profile's current generation, while that lease is active and
//! unexpired. The leader decides (`CheckFence`, the core's own fence check under a
//! linearizable read), so a lease fenced or superseded before the check is seen as such.

use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{Generation, LeaseId, ProfileId};
use squadron_core::lease::FencingToken;
use squadron_core::Rejection;
use squadron_isolation::{BrokerError, FenceCheck, FenceFuture, FenceVerdict};

use crate::control_link::{CallError, ControlLink};

/// Margin before a lease's expiry after which commits are already refused: a commit must not
/// race the sweep that fences the lease.
pub(crate) const FENCE_EXPIRY_MARGIN_MS: u64 = 1_000;

#[derive(Debug, Clone)]
pub struct ControlFence {
    control: ControlLink,
}

impl ControlFence {
    pub(crate) fn new(control: ControlLink) -> Self {
        Self { control }
    }

    /// A fence asked of the leader as the worker `config` names, under its certificate (a
    /// broker outside a running worker: tests, tools).
    pub fn for_worker(
        config: &crate::WorkerConfig,
        tls: squadron_pki::TlsIdentity,
    ) -> Result<Self, crate::WorkerError> {
        ControlLink::new(config.clone(), tls).map(Self::new)
    }

    async fn verdict(
        &self,
        profile: u64,
        lease: u64,
        generation: u64,
    ) -> Result<FenceVerdict, BrokerError> {
        let (Ok(profile), Ok(lease)) = (ProfileId::new(profile), LeaseId::new(lease)) else {
            return stale(None, "profile and lease ids must be positive".into());
        };
        let token = FencingToken {
            profile,
            lease,
            generation: Generation::new(generation),
        };
        let writer = match self.control.check_fence(token).await {
            Ok(w) => w,
            Err(CallError::Refused(body)) => return refused(body),
            Err(e @ CallError::Unanswered(_)) => {
                return Err(BrokerError::FenceUnavailable(e.to_string()))
            }
        };
        // Both clocks must agree the lease is alive: the cluster's (leader-stamped) and ours.
        let now = writer.clock_ms.max(squadron_client::now_ms());
        let expires_at_ms = writer.lease.expires_at_ms;
        if now + FENCE_EXPIRY_MARGIN_MS >= expires_at_ms {
            return stale(
                Some(writer.lease.generation.get()),
                format!("lease {lease} expires at {expires_at_ms} ms"),
            );
        }
        Ok(FenceVerdict::Current)
    }
}

/// The leader's refusal: stale with what it names (a fenced token, an expired lease, an
/// unknown profile or lease); anything else leaves the question unanswered.
fn refused(body: squadron_api::ErrorBody) -> Result<FenceVerdict, BrokerError> {
    match body.rejection {
        Some(Rejection::Fenced {
            current_generation, ..
        }) => stale(Some(current_generation.get()), body.message),
        Some(_) => stale(None, body.message),
        None if body.code == ErrorCode::NotFound => stale(None, body.message),
        None => Err(BrokerError::FenceUnavailable(body.message)),
    }
}

fn stale(current_generation: Option<u64>, reason: String) -> Result<FenceVerdict, BrokerError> {
    Ok(FenceVerdict::Stale {
        current_generation,
        reason,
    })
}

impl FenceCheck for ControlFence {
    fn check(&self, profile: u64, lease: u64, generation: u64) -> FenceFuture<'_> {
        Box::pin(self.verdict(profile, lease, generation))
    }
}
