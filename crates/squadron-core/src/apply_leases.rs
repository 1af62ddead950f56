//! Runtime leases (INV-3 … INV-6), takeovers (INV-8, INV-9) and reap evidence.
//!
//! A lease is `Active` while it is the profile's writer, `Fenced` once it lost that authority
//! but its process is not yet proved gone, and `Released` or `Reaped` when it has ended. Both
//! `Active` and `Fenced` hold a project slot (INV-5): a slot is freed only by a release or by
//! reap evidence, never by time alone, so admission cannot be fooled by a process that outlived
//! its lease.

use crate::access::Subject;
use crate::command::{
    AcquireLease, CrashTakeover, FenceLease, GracefulTakeover, NextHolder, RecordReapEvidence,
    ReleaseLease, RenewLease, RenewLeases,
};
use crate::ids::{Generation, LeaseId, ProfileId, WorkerId};
use crate::lease::{
    EvidenceSource, FenceReason, FencingToken, LeaseState, ReapEvidence, RuntimeLease,
};
use crate::limits::{
    LEASE_TTL_MS_MAX, LEASE_TTL_MS_MIN, RENEWALS_PER_BATCH_MAX, TERMINAL_LEASES_PER_PROFILE_KEPT,
};
use crate::rejection::Rejection;
use crate::response::{LeaseGrant, Outcome, RenewalResult};
use crate::roster::RosterStatus;
use crate::state::State;
use crate::worker::WorkerStatus;

pub(crate) fn check_ttl(field: &str, ttl_ms: u64) -> Result<(), Rejection> {
    if !(LEASE_TTL_MS_MIN..=LEASE_TTL_MS_MAX).contains(&ttl_ms) {
        return Err(Rejection::invalid(
            field,
            format!("must be between {LEASE_TTL_MS_MIN} and {LEASE_TTL_MS_MAX} ms, got {ttl_ms}"),
        ));
    }
    Ok(())
}

/// Checks that evidence proves this exact lease generation quiescent.
fn check_evidence(lease: &RuntimeLease, ev: &ReapEvidence) -> Result<(), Rejection> {
    ev.validate()?;
    if ev.lease != lease.id || ev.generation != lease.generation {
        return Err(Rejection::EvidenceRefused {
            reason: format!(
                "evidence is for lease {} generation {}, not lease {} generation {}",
                ev.lease, ev.generation, lease.id, lease.generation
            ),
        });
    }
    if ev.populated {
        return Err(Rejection::EvidenceRefused {
            reason: "the cgroup was still populated; only populated 0 proves quiescence".into(),
        });
    }
    if let Some(cgroup) = &lease.holder.cgroup {
        if cgroup != &ev.cgroup {
            return Err(Rejection::EvidenceRefused {
                reason: format!(
                    "evidence names cgroup {:?} but the lease runs in {cgroup:?}",
                    ev.cgroup
                ),
            });
        }
    }
    if ev.observed_at_ms < lease.granted_at_ms {
        return Err(Rejection::EvidenceRefused {
            reason: "evidence was observed before the lease was granted".into(),
        });
    }
    if !matches!(ev.source, EvidenceSource::CgroupEvents) {
        return Err(Rejection::EvidenceRefused {
            reason: "operator evidence comes only from decommissioning the worker".into(),
        });
    }
    Ok(())
}

/// What a new generation is admitted against (see `State::check_admission`).
struct Admission<'a> {
    profile: ProfileId,
    /// The generation the caller expects the profile to be at (INV-3).
    expected: Generation,
    next: &'a NextHolder,
    /// The lease a takeover moves on from: its activity does not make the profile busy.
    replacing: Option<LeaseId>,
    /// The slots the same command frees before the grant.
    freed_slots: u32,
}

/// What the checks of a crash takeover found about the old lease.
struct CrashTakeoverPlan {
    /// It is still active (and expired), so it is fenced first.
    must_fence: bool,
    /// Evidence was recorded before; its slot is already free.
    already_reaped: bool,
}

impl State {
    /// The lease `token` names if it may write at `now` (INV-6: the profile's live, active
    /// lease at the current generation, unexpired): the Git broker's question, asked of the
    /// leader before each commit.
    pub fn current_writer(
        &self,
        token: &FencingToken,
        now: u64,
    ) -> Result<&RuntimeLease, Rejection> {
        self.check_fence(token, now, true)
    }

    /// INV-6: the token names the profile's current active lease, same generation.
    pub(crate) fn check_fence(
        &self,
        token: &FencingToken,
        now: u64,
        require_unexpired: bool,
    ) -> Result<&RuntimeLease, Rejection> {
        let profile = self.profile_ref(token.profile)?;
        let fenced = |reason: String| Rejection::Fenced {
            reason,
            current_lease: profile.live_lease,
            current_generation: profile.generation,
        };
        if token.generation != profile.generation {
            return Err(fenced(format!(
                "generation {} is not the current generation {}",
                token.generation, profile.generation
            )));
        }
        if profile.live_lease != Some(token.lease) {
            return Err(fenced(format!(
                "lease {} is not the profile's active lease",
                token.lease
            )));
        }
        let lease = self.lease_ref(token.lease)?;
        assert_eq!(
            lease.generation, profile.generation,
            "INV-3: live lease generation"
        );
        assert_eq!(
            lease.state,
            LeaseState::Active,
            "INV-4: live lease must be active"
        );
        if require_unexpired && lease.is_expired(now) {
            return Err(Rejection::LeaseExpired {
                expired_at_ms: lease.expires_at_ms,
            });
        }
        Ok(lease)
    }

    /// Admission of a new generation (INV-1, INV-3 … INV-5).
    fn check_admission(&self, admission: Admission<'_>) -> Result<(), Rejection> {
        let Admission {
            profile: profile_id,
            expected,
            next,
            replacing,
            freed_slots,
        } = admission;
        next.holder.validate()?;
        check_ttl("ttl_ms", next.ttl_ms)?;
        let profile = self.profile_ref(profile_id)?;
        if !profile.providers.contains(&next.provider) {
            return Err(Rejection::ProviderNotAllowed {
                provider: next.provider,
                allowed: profile.providers.clone(),
            });
        }
        // INV-3: compare-and-swap on the generation the caller expects.
        if expected != profile.generation {
            return Err(Rejection::StaleGeneration {
                expected,
                current: profile.generation,
            });
        }
        // INV-4: one writer. A live lease other than the one being replaced makes it busy.
        if let Some(live) = profile.live_lease.filter(|l| Some(*l) != replacing) {
            let lease = self.lease_ref(live)?;
            return Err(Rejection::ProfileBusy {
                lease: live,
                generation: lease.generation,
                state: lease.state.name().into(),
            });
        }
        let project = self.project_ref(&(profile.tenant.clone(), profile.project.clone()))?;
        // INV-1: the launch runs in the project's one sandbox or not at all.
        let Some(sandbox) = &project.sandbox else {
            return Err(Rejection::NoSandbox);
        };
        if sandbox.worker != next.holder.worker {
            return Err(Rejection::SandboxMismatch {
                sandbox_worker: sandbox.worker.to_string(),
            });
        }
        let worker = self.worker_ref(&next.holder.worker)?;
        if worker.status != WorkerStatus::Alive {
            return Err(Rejection::WorkerUnavailable {
                reason: format!("worker {} is {:?}", worker.id, worker.status),
            });
        }
        // INV-5: fail closed. Fenced leases still count: their processes are not proved gone.
        let held = project.slots_held.saturating_sub(freed_slots);
        if held >= project.max_active {
            return Err(Rejection::CapacityFull {
                held,
                max: project.max_active,
            });
        }
        Ok(())
    }

    /// Grants the next generation. Callers have run `check_admission`.
    pub(crate) fn grant(
        &mut self,
        now: u64,
        profile_id: ProfileId,
        next: NextHolder,
    ) -> LeaseGrant {
        let NextHolder {
            provider,
            holder,
            ttl_ms,
        } = next;
        let id = self.next_lease_id;
        self.next_lease_id = id.next();
        let profile = self
            .profiles
            .get_mut(&profile_id)
            .expect("admission checked the profile");
        assert!(
            profile.live_lease.is_none(),
            "INV-4: grant over a live lease"
        );
        let generation = profile.generation.successor();
        profile.generation = generation;
        profile.live_lease = Some(id);
        let project_key = (profile.tenant.clone(), profile.project.clone());
        let expires_at_ms = now.saturating_add(ttl_ms);
        self.leases.insert(
            id,
            RuntimeLease {
                id,
                profile: profile_id,
                tenant: project_key.0.clone(),
                project: project_key.1.clone(),
                generation,
                provider,
                holder,
                ttl_ms,
                granted_at_ms: now,
                renewed_at_ms: now,
                expires_at_ms,
                state: LeaseState::Active,
            },
        );
        self.lease_expiry.insert((expires_at_ms, id));
        let project = self
            .projects
            .get_mut(&project_key)
            .expect("admission checked the project");
        project.slots_held += 1;
        assert!(
            project.slots_held <= project.max_active,
            "INV-5 violated: {} slots held, max {}",
            project.slots_held,
            project.max_active
        );
        project.stats.leases_granted += 1;
        project.stats.peak_slots_held = project.stats.peak_slots_held.max(project.slots_held);
        self.publish_roster(
            now,
            profile_id,
            RosterStatus::Active {
                provider,
                generation,
            },
        );
        LeaseGrant {
            profile: profile_id,
            lease: id,
            generation,
            expires_at_ms,
        }
    }

    /// Active → Fenced: the lease loses its authority but keeps its slot.
    fn fence(&mut self, now: u64, lease_id: LeaseId, reason: FenceReason) {
        let lease = self
            .leases
            .get_mut(&lease_id)
            .expect("caller checked lease");
        assert_eq!(
            lease.state,
            LeaseState::Active,
            "only an active lease is fenced"
        );
        let why = format!("runtime lease {lease_id} fenced ({reason:?})");
        lease.state = LeaseState::Fenced { at_ms: now, reason };
        self.lease_expiry.remove(&(lease.expires_at_ms, lease_id));
        let (profile_id, generation) = (lease.profile, lease.generation);
        let profile = self
            .profiles
            .get_mut(&profile_id)
            .expect("lease has a profile");
        if profile.live_lease == Some(lease_id) {
            profile.live_lease = None;
        }
        profile.fenced_unreaped.insert(lease_id);
        self.end_agent_credential_lease(now, lease_id, &why);
        self.publish_roster(now, profile_id, RosterStatus::Fenced { generation });
    }

    /// Active or Fenced → Released or Reaped: frees the slot.
    pub(crate) fn end(&mut self, now: u64, lease_id: LeaseId, terminal: LeaseState) {
        assert!(terminal.is_terminal(), "end needs a terminal state");
        let lease = self
            .leases
            .get_mut(&lease_id)
            .expect("caller checked lease");
        assert!(lease.state.holds_slot(), "lease already ended");
        if lease.state == LeaseState::Active {
            self.lease_expiry.remove(&(lease.expires_at_ms, lease_id));
        }
        lease.state = terminal;
        let profile_id = lease.profile;
        self.end_agent_credential_lease(now, lease_id, &format!("runtime lease {lease_id} ended"));
        let profile = self
            .profiles
            .get_mut(&profile_id)
            .expect("lease has a profile");
        if profile.live_lease == Some(lease_id) {
            profile.live_lease = None;
        }
        profile.fenced_unreaped.remove(&lease_id);
        profile.past_leases.push_back(lease_id);
        let mut pruned = Vec::new();
        while profile.past_leases.len() > TERMINAL_LEASES_PER_PROFILE_KEPT {
            if let Some(old) = profile.past_leases.pop_front() {
                pruned.push(old);
            }
        }
        let project_key = (profile.tenant.clone(), profile.project.clone());
        let idle = profile.live_lease.is_none();
        for old in pruned {
            self.leases.remove(&old);
        }
        let project = self
            .projects
            .get_mut(&project_key)
            .expect("lease has a project");
        project.slots_held = project
            .slots_held
            .checked_sub(1)
            .expect("INV-5 accounting: slot count underflow");
        if idle {
            self.publish_roster(now, profile_id, RosterStatus::Idle);
        }
    }

    pub(crate) fn acquire_lease(
        &mut self,
        now: u64,
        subject: &Subject,
        command: AcquireLease,
    ) -> Result<Outcome, Rejection> {
        self.require_not_other_worker(subject, &command.holder.worker)?;
        let AcquireLease {
            profile,
            expected_generation,
            provider,
            holder,
            ttl_ms,
        } = command;
        let next = NextHolder {
            provider,
            holder,
            ttl_ms,
        };
        self.check_acquire(profile, expected_generation, &next)?;
        Ok(Outcome::LeaseGranted(self.grant(now, profile, next)))
    }

    /// Admission of a plain acquire (no takeover): `check_admission`, and no fenced generation
    /// still awaiting its reap.
    pub(crate) fn check_acquire(
        &self,
        profile: ProfileId,
        expected: Generation,
        next: &NextHolder,
    ) -> Result<(), Rejection> {
        self.check_admission(Admission {
            profile,
            expected,
            next,
            replacing: None,
            freed_slots: 0,
        })?;
        // A fenced generation whose process is not proved gone blocks a plain acquire: only a
        // crash takeover with evidence (INV-9) or a graceful takeover (INV-8) moves past it.
        if let Some(unreaped) = self.unreaped_lease_of(profile) {
            let lease = self.lease_ref(unreaped)?;
            return Err(Rejection::ProfileBusy {
                lease: unreaped,
                generation: lease.generation,
                state: lease.state.name().into(),
            });
        }
        Ok(())
    }

    /// The fenced lease of the profile's current generation, if it still awaits reap evidence.
    /// Older fenced generations were passed by graceful takeovers and hold their own slots.
    fn unreaped_lease_of(&self, profile: ProfileId) -> Option<LeaseId> {
        let p = self.profiles.get(&profile)?;
        let newest = *p.fenced_unreaped.last()?;
        (self.leases.get(&newest)?.generation == p.generation).then_some(newest)
    }

    pub(crate) fn renew_lease(
        &mut self,
        now: u64,
        subject: &Subject,
        command: RenewLease,
    ) -> Result<Outcome, Rejection> {
        let RenewLease { fence, ttl_ms } = command;
        check_ttl("ttl_ms", ttl_ms)?;
        self.check_fence(&fence, now, true)?;
        self.require_holder_side(subject, &fence)?;
        Ok(Outcome::LeaseRenewed {
            expires_at_ms: self.renew(now, fence.lease, ttl_ms),
        })
    }

    pub(crate) fn renew(&mut self, now: u64, lease_id: LeaseId, ttl_ms: u64) -> u64 {
        let lease = self.leases.get_mut(&lease_id).expect("fence checked lease");
        self.lease_expiry.remove(&(lease.expires_at_ms, lease_id));
        lease.renewed_at_ms = now;
        lease.ttl_ms = ttl_ms;
        // Renewal never shortens a lease: a delayed heartbeat must not cut a later one short.
        lease.expires_at_ms = lease.expires_at_ms.max(now.saturating_add(ttl_ms));
        self.lease_expiry.insert((lease.expires_at_ms, lease_id));
        lease.expires_at_ms
    }

    pub(crate) fn renew_leases(
        &mut self,
        now: u64,
        subject: &Subject,
        command: RenewLeases,
    ) -> Result<Outcome, Rejection> {
        self.require_worker(subject, &command.worker)?;
        let RenewLeases {
            worker,
            fences,
            ttl_ms,
        } = command;
        check_ttl("ttl_ms", ttl_ms)?;
        if fences.is_empty() || fences.len() > RENEWALS_PER_BATCH_MAX {
            return Err(Rejection::invalid(
                "fences",
                format!(
                    "must hold between 1 and {RENEWALS_PER_BATCH_MAX} leases, got {}",
                    fences.len()
                ),
            ));
        }
        self.worker_ref(&worker)?;
        let mut results = Vec::with_capacity(fences.len());
        for fence in fences {
            let checked = self.check_fence(&fence, now, true).and_then(|lease| {
                if lease.holder.worker == worker {
                    Ok(())
                } else {
                    Err(Rejection::Fenced {
                        reason: format!("lease {} is held by another worker", lease.id),
                        current_lease: Some(lease.id),
                        current_generation: lease.generation,
                    })
                }
            });
            let result = checked.map(|()| self.renew(now, fence.lease, ttl_ms));
            results.push(RenewalResult {
                lease: fence.lease,
                result,
            });
        }
        Ok(Outcome::LeasesRenewed { results })
    }

    pub(crate) fn release_lease(
        &mut self,
        now: u64,
        subject: &Subject,
        command: ReleaseLease,
    ) -> Result<Outcome, Rejection> {
        let ReleaseLease { fence } = command;
        // The holder may release after expiry: it says its process has stopped, which frees
        // the slot sooner than waiting for a sweep, a fence and reap evidence.
        self.check_fence(&fence, now, false)?;
        self.require_holder_side(subject, &fence)?;
        self.end(now, fence.lease, LeaseState::Released { at_ms: now });
        Ok(Outcome::LeaseReleased)
    }

    pub(crate) fn fence_lease(
        &mut self,
        now: u64,
        command: FenceLease,
    ) -> Result<Outcome, Rejection> {
        let FenceLease { fence, reason } = command;
        if matches!(reason, FenceReason::Takeover | FenceReason::Decommissioned) {
            return Err(Rejection::invalid(
                "reason",
                "takeover and decommission fence through their own commands",
            ));
        }
        let lease = self.check_fence(&fence, now, false)?;
        if reason == FenceReason::Expired && !lease.is_expired(now) {
            return Err(Rejection::LeaseNotExpired {
                expires_at_ms: lease.expires_at_ms,
            });
        }
        self.fence(now, fence.lease, reason);
        Ok(Outcome::LeaseFenced)
    }

    /// Reap evidence is believed only from the worker that held the lease (it reaped the
    /// leaf); an operator's word takes the audited decommission path, never a posted
    /// evidence body.
    fn check_evidence_sender(
        &self,
        subject: &Subject,
        evidence: &ReapEvidence,
    ) -> Result<(), Rejection> {
        if *subject == Subject::Legacy {
            return Ok(());
        }
        if matches!(evidence.source, EvidenceSource::OperatorDecommission { .. }) {
            return Err(Rejection::EvidenceRefused {
                reason: "an operator's decommission is recorded by `squadron worker \
                         decommission`, not posted as evidence"
                    .into(),
            });
        }
        let lease = self.lease_ref(evidence.lease)?;
        self.require_worker(subject, &lease.holder.worker)
    }

    pub(crate) fn record_reap_evidence(
        &mut self,
        now: u64,
        subject: &Subject,
        command: RecordReapEvidence,
    ) -> Result<Outcome, Rejection> {
        self.check_evidence_sender(subject, &command.evidence)?;
        let RecordReapEvidence { profile, evidence } = command;
        self.profile_ref(profile)?;
        let lease = self.lease_ref(evidence.lease)?;
        if lease.profile != profile {
            return Err(Rejection::EvidenceRefused {
                reason: format!("lease {} belongs to another profile", lease.id),
            });
        }
        check_evidence(lease, &evidence)?;
        match &lease.state {
            LeaseState::Fenced { .. } => {}
            // The process is gone and the lease ran out: fence and reap in one step.
            LeaseState::Active if lease.is_expired(now) => {
                self.fence(now, evidence.lease, FenceReason::Expired);
            }
            LeaseState::Active => {
                return Err(Rejection::EvidenceRefused {
                    reason: format!(
                        "lease {} is active until {} ms; release or fence it first",
                        lease.id, lease.expires_at_ms
                    ),
                })
            }
            LeaseState::Released { .. } | LeaseState::Reaped { .. } => {
                return Err(Rejection::EvidenceRefused {
                    reason: format!("lease {} has already ended", lease.id),
                })
            }
        }
        let lease_id = evidence.lease;
        self.end(
            now,
            lease_id,
            LeaseState::Reaped {
                at_ms: now,
                evidence,
            },
        );
        Ok(Outcome::EvidenceRecorded { slot_freed: true })
    }

    pub(crate) fn graceful_takeover(
        &mut self,
        now: u64,
        subject: &Subject,
        command: GracefulTakeover,
    ) -> Result<Outcome, Rejection> {
        self.require_not_other_worker(subject, &command.next.holder.worker)?;
        if let Some(evidence) = &command.old_reap_evidence {
            self.check_evidence_sender(subject, evidence)?;
        }
        let GracefulTakeover {
            fence,
            capsule: draft,
            next,
            old_reap_evidence: old_evidence,
        } = command;
        // INV-8, step 1: the writer is current, and its capsule verifies against the chain.
        let old = self.check_fence(&fence, now, true)?.clone();
        let capsule = self.prepare_capsule(&old, draft)?;
        if let Some(ev) = &old_evidence {
            check_evidence(&old, ev)?;
        }
        let freed = u32::from(old_evidence.is_some());
        self.check_admission(Admission {
            profile: fence.profile,
            expected: fence.generation,
            next: &next,
            replacing: Some(old.id),
            freed_slots: freed,
        })?;
        // All checks passed; mutate in the order the invariant names.
        let head = (capsule.sequence, capsule.digest);
        self.append_capsule(capsule);
        self.fence(now, old.id, FenceReason::Takeover);
        if let Some(evidence) = old_evidence {
            self.end(
                now,
                old.id,
                LeaseState::Reaped {
                    at_ms: now,
                    evidence,
                },
            );
        }
        let grant = self.grant(now, fence.profile, next);
        self.bump_takeovers(fence.profile, true);
        Ok(Outcome::TookOver {
            capsule: Some(head),
            fenced: old.id,
            old_reaped: freed == 1,
            grant,
        })
    }

    pub(crate) fn crash_takeover(
        &mut self,
        now: u64,
        subject: &Subject,
        command: CrashTakeover,
    ) -> Result<Outcome, Rejection> {
        self.require_not_other_worker(subject, &command.next.holder.worker)?;
        if let Some(evidence) = &command.reap_evidence {
            self.check_evidence_sender(subject, evidence)?;
        }
        let plan = self.plan_crash_takeover(now, &command)?;
        let CrashTakeover {
            profile,
            lease: lease_id,
            generation,
            next,
            reap_evidence: evidence,
        } = command;
        let freed = u32::from(!plan.already_reaped);
        self.check_admission(Admission {
            profile,
            expected: generation,
            next: &next,
            replacing: Some(lease_id),
            freed_slots: freed,
        })?;
        if plan.must_fence {
            self.fence(now, lease_id, FenceReason::Expired);
        }
        if let Some(evidence) = evidence {
            self.end(
                now,
                lease_id,
                LeaseState::Reaped {
                    at_ms: now,
                    evidence,
                },
            );
        }
        let grant = self.grant(now, profile, next);
        self.bump_takeovers(profile, false);
        Ok(Outcome::TookOver {
            capsule: None,
            fenced: lease_id,
            old_reaped: true,
            grant,
        })
    }

    /// INV-9: expiry first, then evidence for this exact generation; admission of the next
    /// holder is checked by the caller.
    fn plan_crash_takeover(
        &self,
        now: u64,
        command: &CrashTakeover,
    ) -> Result<CrashTakeoverPlan, Rejection> {
        let CrashTakeover {
            profile,
            lease: lease_id,
            generation,
            reap_evidence: evidence,
            ..
        } = command;
        let (profile, lease_id, generation) = (*profile, *lease_id, *generation);
        let p = self.profile_ref(profile)?;
        if generation != p.generation {
            return Err(Rejection::StaleGeneration {
                expected: generation,
                current: p.generation,
            });
        }
        let old = self.lease_ref(lease_id)?;
        if old.profile != profile || old.generation != generation {
            return Err(Rejection::TakeoverBlocked {
                reason: format!("lease {lease_id} is not generation {generation} of {profile}"),
            });
        }
        let must_fence = match &old.state {
            LeaseState::Active if !old.is_expired(now) => {
                return Err(Rejection::LeaseNotExpired {
                    expires_at_ms: old.expires_at_ms,
                })
            }
            LeaseState::Active => true,
            LeaseState::Fenced { .. } => false,
            LeaseState::Reaped { .. } => {
                if evidence.is_some() {
                    return Err(Rejection::EvidenceRefused {
                        reason: format!("lease {lease_id} was already reaped"),
                    });
                }
                false
            }
            LeaseState::Released { .. } => {
                return Err(Rejection::TakeoverBlocked {
                    reason: format!(
                        "lease {lease_id} was released; acquire with expected generation \
                         {generation}"
                    ),
                })
            }
        };
        let already_reaped = matches!(old.state, LeaseState::Reaped { .. });
        match evidence {
            Some(ev) => check_evidence(old, ev)?,
            None if already_reaped => {}
            None => {
                return Err(Rejection::TakeoverBlocked {
                    reason: format!(
                        "no reap evidence for generation {generation}: its cgroup must be shown \
                         empty (populated 0), or its worker decommissioned by an operator"
                    ),
                })
            }
        }
        Ok(CrashTakeoverPlan {
            must_fence,
            already_reaped,
        })
    }

    fn bump_takeovers(&mut self, profile: ProfileId, graceful: bool) {
        let p = &self.profiles[&profile];
        let key = (p.tenant.clone(), p.project.clone());
        if let Some(project) = self.projects.get_mut(&key) {
            if graceful {
                project.stats.takeovers_graceful += 1;
            } else {
                project.stats.takeovers_crash += 1;
            }
        }
    }

    /// Fences every active lease whose expiry has passed. Returns them in expiry order.
    pub(crate) fn fence_expired(&mut self, now: u64) -> Vec<LeaseId> {
        let expired: Vec<LeaseId> = self
            .lease_expiry
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, id)| *id)
            .collect();
        for id in &expired {
            self.fence(now, *id, FenceReason::Expired);
        }
        expired
    }

    /// Fences and reaps, on an operator's word, every slot-holding lease held by a worker.
    pub(crate) fn reap_leases_of_worker(
        &mut self,
        now: u64,
        worker: &WorkerId,
        operator: &str,
        reason: &str,
    ) -> Vec<LeaseId> {
        let held: Vec<LeaseId> = self
            .leases
            .values()
            .filter(|l| &l.holder.worker == worker && l.state.holds_slot())
            .map(|l| l.id)
            .collect();
        for id in &held {
            let lease = &self.leases[id];
            let evidence = ReapEvidence {
                lease: *id,
                generation: lease.generation,
                cgroup: lease
                    .holder
                    .cgroup
                    .clone()
                    .unwrap_or_else(|| format!("worker:{worker}")),
                populated: false,
                observed_at_ms: now,
                source: EvidenceSource::OperatorDecommission {
                    operator: operator.to_string(),
                    reason: reason.to_string(),
                },
            };
            if lease.state == LeaseState::Active {
                self.fence(now, *id, FenceReason::Decommissioned);
            }
            self.end(
                now,
                *id,
                LeaseState::Reaped {
                    at_ms: now,
                    evidence,
                },
            );
        }
        held
    }
}
