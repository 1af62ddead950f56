//! The model's lease commands: acquire, renew, release, fence, reap evidence, takeovers and
//! the sweep.

use crate::*;

impl Model {
    pub(crate) fn acquire_lease(&mut self, c: &AcquireLease) -> MResult<Outcome> {
        let AcquireLease {
            profile,
            expected_generation,
            provider,
            holder,
            ttl_ms,
        } = c;
        let next = NextHolder {
            provider: *provider,
            holder: holder.clone(),
            ttl_ms: *ttl_ms,
        };
        self.check_admission(*profile, *expected_generation, &next, None, 0)?;
        let p = self.profile_idx(*profile).expect("admitted");
        if self.unreaped_current(p) {
            return rej("ProfileBusy");
        }
        Ok(Outcome::LeaseGranted(self.grant(p, holder, *ttl_ms)))
    }

    pub(crate) fn renew_lease(&mut self, c: &RenewLease) -> MResult<Outcome> {
        let RenewLease { fence, ttl_ms } = c;
        if !(1_000..=600_000).contains(ttl_ms) {
            return rej("Invalid");
        }
        let id = self.check_fence(fence, true)?;
        let now = self.now;
        let l = self.leases.get_mut(&id).expect("fenced lease");
        // Renewal never shortens a lease.
        l.expires_at = l.expires_at.max(now + ttl_ms);
        Ok(Outcome::LeaseRenewed {
            expires_at_ms: l.expires_at,
        })
    }

    pub(crate) fn release_lease(&mut self, c: &ReleaseLease) -> MResult<Outcome> {
        let ReleaseLease { fence } = c;
        let id = self.check_fence(fence, false)?;
        self.end(id, MLeaseState::Released);
        Ok(Outcome::LeaseReleased)
    }

    pub(crate) fn fence_lease(&mut self, c: &FenceLease) -> MResult<Outcome> {
        let FenceLease { fence, reason } = c;
        if matches!(reason, FenceReason::Takeover | FenceReason::Decommissioned) {
            return rej("Invalid");
        }
        let id = self.check_fence(fence, false)?;
        let l = &self.leases[&id];
        if *reason == FenceReason::Expired && !self.expired(l) {
            return Err(Rej::Exact(Rejection::LeaseNotExpired {
                expires_at_ms: l.expires_at,
            }));
        }
        self.fence(id);
        Ok(Outcome::LeaseFenced)
    }

    pub(crate) fn record_reap_evidence(&mut self, c: &RecordReapEvidence) -> MResult<Outcome> {
        let RecordReapEvidence { profile, evidence } = c;
        let Some(p) = self.profile_idx(*profile) else {
            return rej("NotFound");
        };
        let Some(l) = self.leases.get(&evidence.lease.get()) else {
            return rej("NotFound");
        };
        if l.profile != p {
            return rej("EvidenceRefused");
        }
        self.check_evidence(l, evidence)?;
        let (id, state, expired) = (l.id, l.state, self.expired(l));
        match state {
            MLeaseState::Fenced => {}
            MLeaseState::Active if expired => self.fence(id),
            _ => return rej("EvidenceRefused"),
        }
        self.end(id, MLeaseState::Reaped);
        Ok(Outcome::EvidenceRecorded { slot_freed: true })
    }

    pub(crate) fn graceful_takeover(&mut self, c: &GracefulTakeover) -> MResult<Outcome> {
        let GracefulTakeover {
            fence,
            capsule,
            next,
            old_reap_evidence,
        } = c;
        let old = self.check_fence(fence, true)?;
        let head = self.check_capsule(old, capsule)?;
        if let Some(ev) = old_reap_evidence {
            self.check_evidence(&self.leases[&old], ev)?;
        }
        let freed = u32::from(old_reap_evidence.is_some());
        self.check_admission(fence.profile, fence.generation, next, Some(old), freed)?;
        let p = self.leases[&old].profile;
        // INV-8: commit the capsule, fence the old lease, grant the next generation.
        self.profiles[p].head = Some(head);
        self.fence(old);
        if old_reap_evidence.is_some() {
            self.end(old, MLeaseState::Reaped);
        }
        let grant = self.grant(p, &next.holder, next.ttl_ms);
        Ok(Outcome::TookOver {
            capsule: Some(head),
            fenced: lease_id(old),
            old_reaped: freed == 1,
            grant,
        })
    }

    pub(crate) fn crash_takeover(&mut self, c: &CrashTakeover) -> MResult<Outcome> {
        let CrashTakeover {
            profile,
            lease,
            generation,
            next,
            reap_evidence,
        } = c;
        let Some(p) = self.profile_idx(*profile) else {
            return rej("NotFound");
        };
        let current = Generation::new(self.profiles[p].generation);
        if *generation != current {
            return Err(Rej::Exact(Rejection::StaleGeneration {
                expected: *generation,
                current,
            }));
        }
        let Some(l) = self.leases.get(&lease.get()) else {
            return rej("NotFound");
        };
        if l.profile != p || l.generation != generation.get() {
            return rej("TakeoverBlocked");
        }
        // INV-9: expiry first, then evidence for this exact generation, then the grant.
        let must_fence = match l.state {
            MLeaseState::Active if !self.expired(l) => {
                return Err(Rej::Exact(Rejection::LeaseNotExpired {
                    expires_at_ms: l.expires_at,
                }))
            }
            MLeaseState::Active => true,
            MLeaseState::Fenced => false,
            MLeaseState::Reaped if reap_evidence.is_some() => return rej("EvidenceRefused"),
            MLeaseState::Reaped => false,
            MLeaseState::Released => return rej("TakeoverBlocked"),
        };
        let already_reaped = l.state == MLeaseState::Reaped;
        match reap_evidence {
            Some(ev) => self.check_evidence(l, ev)?,
            None if already_reaped => {}
            None => return rej("TakeoverBlocked"),
        }
        let id = l.id;
        self.check_admission(
            *profile,
            *generation,
            next,
            Some(id),
            u32::from(!already_reaped),
        )?;
        if must_fence {
            self.fence(id);
        }
        if reap_evidence.is_some() {
            self.end(id, MLeaseState::Reaped);
        }
        let grant = self.grant(p, &next.holder, next.ttl_ms);
        Ok(Outcome::TookOver {
            capsule: None,
            fenced: *lease,
            old_reaped: true,
            grant,
        })
    }

    pub(crate) fn sweep(&mut self) -> MResult<Outcome> {
        // Expiry is judged by command time only: every active lease whose expiry has
        // passed is fenced, in expiry order.
        let mut expired: Vec<(u64, u64)> = self
            .leases
            .values()
            .filter(|l| l.state == MLeaseState::Active && self.expired(l))
            .map(|l| (l.expires_at, l.id))
            .collect();
        expired.sort_unstable();
        for (_, id) in &expired {
            self.fence(*id);
        }
        Ok(Outcome::Swept(SweepReport {
            leases_fenced: expired.iter().map(|(_, id)| lease_id(*id)).collect(),
            ..SweepReport::default()
        }))
    }
}
