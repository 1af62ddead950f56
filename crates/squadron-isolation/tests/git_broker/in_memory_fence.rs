//! A control plane stand-in for the broker's fence: which (lease, generation) is current per
//! profile. Test-only; the production `FenceCheck` reads the profile's live lease through
//! the control plane.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use squadron_isolation::{BrokerError, FenceCheck, FenceFuture, FenceVerdict};

#[derive(Debug, Default)]
pub struct InMemoryFence {
    /// Per profile: its live lease (none once released) and its generation.
    current: Mutex<HashMap<u64, (Option<u64>, u64)>>,
    /// Applied right after the next check is answered: a takeover that lands between the
    /// broker's fence check and its commit…
    grant_after_next_check: Mutex<Option<(u64, u64, u64)>>,
    /// …or the profile's lease released there (a stop), its generation kept.
    release_after_next_check: Mutex<Option<u64>>,
    unavailable: AtomicBool,
    checks: AtomicU64,
}

impl InMemoryFence {
    /// Makes (lease, generation) the profile's current active lease.
    pub fn grant(&self, profile: u64, lease: u64, generation: u64) {
        self.current
            .lock()
            .expect("fence state")
            .insert(profile, (Some(lease), generation));
    }

    pub fn release_after_next_check(&self, profile: u64) {
        *self.release_after_next_check.lock().expect("fence state") = Some(profile);
    }

    pub fn grant_after_next_check(&self, profile: u64, lease: u64, generation: u64) {
        *self.grant_after_next_check.lock().expect("fence state") =
            Some((profile, lease, generation));
    }

    pub fn set_unavailable(&self, unavailable: bool) {
        self.unavailable.store(unavailable, Ordering::SeqCst);
    }

    pub fn checks(&self) -> u64 {
        self.checks.load(Ordering::SeqCst)
    }

    fn verdict(
        &self,
        profile: u64,
        lease: u64,
        generation: u64,
    ) -> Result<FenceVerdict, BrokerError> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        if self.unavailable.load(Ordering::SeqCst) {
            return Err(BrokerError::FenceUnavailable(
                "control plane unreachable (test)".into(),
            ));
        }
        let mut current = self.current.lock().expect("fence state");
        let verdict = match current.get(&profile) {
            Some(&(Some(l), g)) if l == lease && g == generation => FenceVerdict::Current,
            Some(&(_, g)) => FenceVerdict::Stale {
                current_generation: Some(g),
                reason: format!("profile {profile} is at generation {g}"),
            },
            None => FenceVerdict::Stale {
                current_generation: None,
                reason: format!("profile {profile} has no active lease"),
            },
        };
        if let Some((p, l, g)) = self
            .grant_after_next_check
            .lock()
            .expect("fence state")
            .take()
        {
            current.insert(p, (Some(l), g));
        }
        if let Some(p) = self
            .release_after_next_check
            .lock()
            .expect("fence state")
            .take()
        {
            if let Some(entry) = current.get_mut(&p) {
                entry.0 = None;
            }
        }
        Ok(verdict)
    }
}

impl FenceCheck for InMemoryFence {
    fn check(&self, profile: u64, lease: u64, generation: u64) -> FenceFuture<'_> {
        Box::pin(async move { self.verdict(profile, lease, generation) })
    }
}
