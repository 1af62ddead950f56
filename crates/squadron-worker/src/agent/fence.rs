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
            Err(CallError::Refused(body)) => return refused(body, generation),
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
/// unknown profile or lease); anything else leaves the question unanswered. An expired lease
/// is refused only once its generation and lease were found the profile's current ones
/// (`check_fence`), so its generation is the asked one, and no newer one exists yet.
fn refused(body: squadron_api::ErrorBody, generation: u64) -> Result<FenceVerdict, BrokerError> {
    match body.rejection {
        Some(Rejection::Fenced {
            current_generation, ..
        }) => stale(Some(current_generation.get()), body.message),
        Some(Rejection::LeaseExpired { .. }) => stale(Some(generation), body.message),
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

#[cfg(test)]
mod tests {
    use super::*;
    use squadron_core::ids::LeaseId;

    fn body(rejection: Rejection) -> squadron_api::ErrorBody {
        squadron_api::ErrorBody {
            code: ErrorCode::FailedPrecondition,
            message: rejection.to_string(),
            field: None,
            rejection: Some(rejection),
        }
    }

    fn generation_of(v: Result<FenceVerdict, BrokerError>) -> Option<u64> {
        match v {
            Ok(FenceVerdict::Stale {
                current_generation, ..
            }) => current_generation,
            other => panic!("not stale: {other:?}"),
        }
    }

    #[test]
    fn an_expired_lease_is_stale_at_its_own_generation_and_a_fenced_one_at_the_current() {
        let expired = body(Rejection::LeaseExpired { expired_at_ms: 5 });
        assert_eq!(generation_of(refused(expired, 3)), Some(3));
        let fenced = body(Rejection::Fenced {
            reason: "lease 7 is not the profile's active lease".into(),
            current_lease: Some(LeaseId::new(9).expect("lease")),
            current_generation: Generation::new(4),
        });
        assert_eq!(generation_of(refused(fenced, 3)), Some(4));
    }
}
