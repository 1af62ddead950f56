//! The Git broker's fence, checked against the control plane: a commit is allowed only for the
//! profile's live lease, at the profile's current generation, while that lease is active and
//! unexpired. Reads are linearizable (ReadIndex through the leader), so a lease fenced or
//! superseded before the check is seen as such.

use squadron_client::{ClientError, Consistency, SquadronClient};
use squadron_core::ids::{LeaseId, ProfileId};
use squadron_core::lease::LeaseState;
use squadron_isolation::{BrokerError, FenceCheck, FenceFuture, FenceVerdict};

/// Margin before a lease's expiry after which commits are already refused: a commit must not
/// race the sweep that fences the lease.
pub(crate) const FENCE_EXPIRY_MARGIN_MS: u64 = 1_000;

#[derive(Debug, Clone)]
pub struct ControlFence {
    client: SquadronClient,
}

impl ControlFence {
    pub fn new(client: SquadronClient) -> Self {
        Self { client }
    }

    async fn verdict(
        &self,
        profile: u64,
        lease: u64,
        generation: u64,
    ) -> Result<FenceVerdict, BrokerError> {
        let (Ok(profile_id), Ok(lease_id)) = (ProfileId::new(profile), LeaseId::new(lease)) else {
            return stale(None, "profile and lease ids must be positive".into());
        };
        let p = match self
            .client
            .get_profile(profile_id, Consistency::Linearizable)
            .await
        {
            Ok(p) => p,
            Err(e) if is_not_found(&e) => {
                return stale(None, format!("profile {profile} does not exist"))
            }
            Err(e) => return Err(BrokerError::FenceUnavailable(e.to_string())),
        };
        let current = p.generation.get();
        if current != generation {
            return stale(
                Some(current),
                format!(
                    "generation {generation} is not the profile's current generation {current}"
                ),
            );
        }
        if p.live_lease != Some(lease_id) {
            return stale(
                Some(current),
                format!("lease {lease} is not the profile's live lease"),
            );
        }
        self.lease_verdict(profile_id, lease_id, current).await
    }

    /// The second half of the check, once the profile names `lease` its live lease at the
    /// current generation: the lease itself must agree, be active, and not about to expire.
    async fn lease_verdict(
        &self,
        profile: ProfileId,
        lease: LeaseId,
        current: u64,
    ) -> Result<FenceVerdict, BrokerError> {
        let l = match self
            .client
            .get_lease(lease, Consistency::Linearizable)
            .await
        {
            Ok(l) => l,
            Err(e) if is_not_found(&e) => {
                return stale(Some(current), format!("lease {lease} does not exist"))
            }
            Err(e) => return Err(BrokerError::FenceUnavailable(e.to_string())),
        };
        if l.profile != profile || l.generation.get() != current {
            return stale(
                Some(current),
                format!("lease {lease} belongs to another profile or generation"),
            );
        }
        if !matches!(l.state, LeaseState::Active) {
            return stale(
                Some(current),
                format!("lease {lease} is {}", l.state.name()),
            );
        }
        // Both clocks must agree the lease is alive: the cluster's (leader-stamped) and ours.
        let cluster_now = self
            .client
            .cluster_status(Consistency::Stale)
            .await
            .map(|s| s.clock_ms)
            .unwrap_or(0);
        let now = cluster_now.max(squadron_client::now_ms());
        if now + FENCE_EXPIRY_MARGIN_MS >= l.expires_at_ms {
            return stale(
                Some(current),
                format!("lease {lease} expires at {} ms", l.expires_at_ms),
            );
        }
        Ok(FenceVerdict::Current)
    }
}

fn stale(current_generation: Option<u64>, reason: String) -> Result<FenceVerdict, BrokerError> {
    Ok(FenceVerdict::Stale {
        current_generation,
        reason,
    })
}

fn is_not_found(e: &ClientError) -> bool {
    matches!(e, ClientError::Api { status: 404, .. })
}

impl FenceCheck for ControlFence {
    fn check(&self, profile: u64, lease: u64, generation: u64) -> FenceFuture<'_> {
        Box::pin(self.verdict(profile, lease, generation))
    }
}
