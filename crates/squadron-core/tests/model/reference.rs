//! The reference model: the state machine's rules again, written with plain collections.

use crate::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MLeaseState {
    Active,
    Fenced,
    Released,
    Reaped,
}

impl MLeaseState {
    pub(crate) fn holds_slot(self) -> bool {
        matches!(self, MLeaseState::Active | MLeaseState::Fenced)
    }

    pub(crate) fn of(s: &LeaseState) -> Self {
        match s {
            LeaseState::Active => MLeaseState::Active,
            LeaseState::Fenced { .. } => MLeaseState::Fenced,
            LeaseState::Released { .. } => MLeaseState::Released,
            LeaseState::Reaped { .. } => MLeaseState::Reaped,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct MLease {
    pub(crate) id: u64,
    pub(crate) profile: usize,
    pub(crate) generation: u64,
    pub(crate) granted_at: u64,
    pub(crate) expires_at: u64,
    pub(crate) state: MLeaseState,
    pub(crate) cgroup: Option<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct MProfile {
    pub(crate) project: usize,
    pub(crate) generation: u64,
    pub(crate) live: Option<u64>,
    /// Terminal leases, oldest first; the core keeps only the newest few.
    pub(crate) past: VecDeque<u64>,
    pub(crate) head: Option<(u64, Digest)>,
}

#[derive(Debug, Clone)]
pub(crate) struct MProject {
    pub(crate) max_active: u32,
    pub(crate) sandbox_worker: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct MTask {
    pub(crate) state: TaskState,
    pub(crate) worker: Option<usize>,
    pub(crate) exit_code: Option<i32>,
    pub(crate) cancel_requested: bool,
    pub(crate) preserve: bool,
    pub(crate) rank: u8,
}

/// What the model expects a refusal to be: its variant, or the exact value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Rej {
    Kind(&'static str),
    Exact(Rejection),
}

pub(crate) type MResult<T> = Result<T, Rej>;

pub(crate) fn rej<T>(k: &'static str) -> MResult<T> {
    Err(Rej::Kind(k))
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expect {
    Ok(Outcome),
    /// A scheduling batch: per task, accepted or the variant of its refusal.
    Assigned(Vec<(TaskId, Result<(), &'static str>)>),
    Rejected(Rej),
    /// An idempotent retry: the first answer, unchanged.
    Replay(Response),
    /// COMPLETING -> COMPLETED carrying an exit code other than the one recorded when the
    /// task left RUNNING. The design leaves open whether this is refused or accepted; either
    /// way a COMPLETED task must end with a success exit code (checked separately).
    CompletedWithNewExitCode(usize),
}

#[derive(Debug, Clone)]
pub(crate) struct LedgerEntry {
    pub(crate) key: IdempotencyKey,
    pub(crate) command: Command,
    pub(crate) response: Response,
}

#[derive(Debug, Clone)]
pub(crate) struct Model {
    /// `now = max(prev now, at_ms)`.
    pub(crate) now: u64,
    /// The leader's last stamp; it may go backwards.
    pub(crate) last_at: u64,
    pub(crate) next_lease: u64,
    pub(crate) projects: Vec<MProject>,
    pub(crate) profiles: Vec<MProfile>,
    pub(crate) leases: BTreeMap<u64, MLease>,
    pub(crate) tasks: Vec<MTask>,
    pub(crate) ledger: Vec<LedgerEntry>,
    /// Every generation the core ever granted, per profile (INV-3: never twice).
    pub(crate) granted: BTreeMap<ProfileId, BTreeSet<Generation>>,
    /// Capacity the model admits beyond `max_active`. Always 0; raising it is how the test's
    /// own sensitivity was checked (it must then fail on INV-5).
    pub(crate) slack: u32,
}

impl Model {
    pub(crate) fn profile_idx(&self, id: ProfileId) -> Option<usize> {
        let i = usize::try_from(id.get()).ok()?.checked_sub(1)?;
        (i < self.profiles.len()).then_some(i)
    }

    pub(crate) fn task_idx(&self, id: TaskId) -> Option<usize> {
        let i = usize::try_from(id.get()).ok()?.checked_sub(1)?;
        (i < self.tasks.len()).then_some(i)
    }

    pub(crate) fn slots(&self, project: usize) -> u32 {
        self.leases
            .values()
            .filter(|l| self.profiles[l.profile].project == project && l.state.holds_slot())
            .count() as u32
    }

    pub(crate) fn expired(&self, l: &MLease) -> bool {
        self.now >= l.expires_at
    }

    /// The newest lease of a profile, if any.
    pub(crate) fn latest_lease(&self, p: usize) -> Option<&MLease> {
        self.leases.values().rev().find(|l| l.profile == p)
    }

    // -- lease primitives --

    pub(crate) fn fence(&mut self, id: u64) {
        let l = self.leases.get_mut(&id).expect("model lease");
        assert_eq!(
            l.state,
            MLeaseState::Active,
            "model fences only active leases"
        );
        l.state = MLeaseState::Fenced;
        let p = &mut self.profiles[l.profile];
        if p.live == Some(id) {
            p.live = None;
        }
    }

    pub(crate) fn end(&mut self, id: u64, terminal: MLeaseState) {
        let l = self.leases.get_mut(&id).expect("model lease");
        assert!(l.state.holds_slot(), "model ends only live leases");
        l.state = terminal;
        let p = &mut self.profiles[l.profile];
        if p.live == Some(id) {
            p.live = None;
        }
        p.past.push_back(id);
        while p.past.len() > TERMINAL_LEASES_PER_PROFILE_KEPT {
            let old = p.past.pop_front().expect("non-empty");
            self.leases.remove(&old);
        }
    }

    pub(crate) fn grant(&mut self, p: usize, holder: &LeaseHolder, ttl: u64) -> LeaseGrant {
        let id = self.next_lease;
        self.next_lease += 1;
        let prof = &mut self.profiles[p];
        assert!(prof.live.is_none(), "model grants over no live lease");
        prof.generation += 1;
        prof.live = Some(id);
        let expires_at = self.now + ttl;
        self.leases.insert(
            id,
            MLease {
                id,
                profile: p,
                generation: prof.generation,
                granted_at: self.now,
                expires_at,
                state: MLeaseState::Active,
                cgroup: holder.cgroup.clone(),
            },
        );
        LeaseGrant {
            profile: profile_id(p),
            lease: lease_id(id),
            generation: Generation::new(prof.generation),
            expires_at_ms: expires_at,
        }
    }

    // -- checks, in the order the design describes them --

    /// INV-6: the token names the profile's current active lease, same generation.
    pub(crate) fn check_fence(&self, tok: &FencingToken, require_unexpired: bool) -> MResult<u64> {
        let Some(p) = self.profile_idx(tok.profile) else {
            return rej("NotFound");
        };
        let prof = &self.profiles[p];
        if tok.generation.get() != prof.generation || prof.live != Some(tok.lease.get()) {
            return rej("Fenced");
        }
        let l = &self.leases[&tok.lease.get()];
        if require_unexpired && self.expired(l) {
            return Err(Rej::Exact(Rejection::LeaseExpired {
                expired_at_ms: l.expires_at,
            }));
        }
        Ok(l.id)
    }

    /// INV-9: evidence for this exact lease generation, cgroup emptied, seen after the grant.
    pub(crate) fn check_evidence(&self, l: &MLease, ev: &ReapEvidence) -> MResult<()> {
        let refused = ev.lease.get() != l.id
            || ev.generation.get() != l.generation
            || ev.populated
            || l.cgroup.as_ref().is_some_and(|c| *c != ev.cgroup)
            || ev.observed_at_ms < l.granted_at
            || ev.source != EvidenceSource::CgroupEvents;
        if refused {
            return rej("EvidenceRefused");
        }
        Ok(())
    }

    /// INV-3 (compare-and-swap), INV-4 (one writer), INV-1 (the project sandbox), INV-5.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check_admission(
        &self,
        profile: ProfileId,
        expected: Generation,
        provider: Provider,
        holder: &LeaseHolder,
        ttl: u64,
        replacing: Option<u64>,
        freed: u32,
    ) -> MResult<()> {
        if !(1_000..=600_000).contains(&ttl) {
            return rej("Invalid");
        }
        let Some(p) = self.profile_idx(profile) else {
            return rej("NotFound");
        };
        let prof = &self.profiles[p];
        if !PROVIDERS.contains(&provider) {
            return rej("ProviderNotAllowed");
        }
        if expected.get() != prof.generation {
            return Err(Rej::Exact(Rejection::StaleGeneration {
                expected,
                current: Generation::new(prof.generation),
            }));
        }
        if prof.live.is_some_and(|l| Some(l) != replacing) {
            return rej("ProfileBusy");
        }
        let project = &self.projects[prof.project];
        if holder.worker != worker_id(project.sandbox_worker) {
            return rej("SandboxMismatch");
        }
        let held = self.slots(prof.project).saturating_sub(freed);
        if held >= project.max_active + self.slack {
            return Err(Rej::Exact(Rejection::CapacityFull {
                held,
                max: project.max_active,
            }));
        }
        Ok(())
    }

    /// INV-7: the draft continues the chain; returns (sequence, digest) of the new head.
    pub(crate) fn check_capsule(
        &self,
        writer: u64,
        draft: &CapsuleDraft,
    ) -> MResult<(u64, Digest)> {
        if draft.schema_version != 1 || draft.sequence == 0 {
            return rej("Invalid");
        }
        let l = &self.leases[&writer];
        let head = self.profiles[l.profile].head;
        let expected_sequence = head.map_or(1, |h| h.0 + 1);
        let expected_previous = head.map(|h| h.1);
        if draft.sequence != expected_sequence || draft.previous != expected_previous {
            return Err(Rej::Exact(Rejection::ChainBroken {
                expected_sequence,
                expected_previous,
            }));
        }
        let digest = capsule_digest(l.profile, l.generation, draft);
        if draft.expected_digest.is_some_and(|d| d != digest) {
            return Err(Rej::Exact(Rejection::DigestMismatch { computed: digest }));
        }
        Ok((draft.sequence, digest))
    }

    /// A fenced lease of the profile's current generation still awaiting evidence blocks a
    /// plain acquire.
    pub(crate) fn unreaped_current(&self, p: usize) -> bool {
        let g = self.profiles[p].generation;
        self.leases
            .values()
            .any(|l| l.profile == p && l.generation == g && l.state == MLeaseState::Fenced)
    }

    pub(crate) fn assigned_count(&self, w: usize) -> usize {
        self.tasks
            .iter()
            .filter(|t| t.worker == Some(w) && is_assigned(t.state))
            .count()
    }

    // -- commands --

    pub(crate) fn apply(&mut self, cmd: &Command) -> Expect {
        match cmd {
            Command::AssignTasks(AssignTasks { assignments }) => match self.assign(assignments) {
                Ok(v) => Expect::Assigned(v),
                Err(r) => Expect::Rejected(r),
            },
            _ => match self.apply_one(cmd) {
                Ok(o) => Expect::Ok(o),
                Err(Rej::Kind("either")) => match cmd {
                    Command::ReportTransition(ReportTransition { task, .. }) => {
                        Expect::CompletedWithNewExitCode(
                            self.task_idx(*task).expect("reported task"),
                        )
                    }
                    _ => unreachable!("only reports are open"),
                },
                Err(r) => Expect::Rejected(r),
            },
        }
    }

    pub(crate) fn apply_one(&mut self, cmd: &Command) -> MResult<Outcome> {
        match cmd {
            Command::AcquireLease(AcquireLease {
                profile,
                expected_generation,
                provider,
                holder,
                ttl_ms,
            }) => {
                self.check_admission(
                    *profile,
                    *expected_generation,
                    *provider,
                    holder,
                    *ttl_ms,
                    None,
                    0,
                )?;
                let p = self.profile_idx(*profile).expect("admitted");
                if self.unreaped_current(p) {
                    return rej("ProfileBusy");
                }
                Ok(Outcome::LeaseGranted(self.grant(p, holder, *ttl_ms)))
            }
            Command::RenewLease(RenewLease { fence, ttl_ms }) => {
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
            Command::ReleaseLease(ReleaseLease { fence }) => {
                let id = self.check_fence(fence, false)?;
                self.end(id, MLeaseState::Released);
                Ok(Outcome::LeaseReleased)
            }
            Command::FenceLease(FenceLease { fence, reason }) => {
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
            Command::RecordReapEvidence(RecordReapEvidence { profile, evidence }) => {
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
            Command::GracefulTakeover(GracefulTakeover {
                fence,
                capsule,
                next,
                old_reap_evidence,
            }) => {
                let old = self.check_fence(fence, true)?;
                let head = self.check_capsule(old, capsule)?;
                if let Some(ev) = old_reap_evidence {
                    self.check_evidence(&self.leases[&old], ev)?;
                }
                let freed = u32::from(old_reap_evidence.is_some());
                self.check_admission(
                    fence.profile,
                    fence.generation,
                    next.provider,
                    &next.holder,
                    next.ttl_ms,
                    Some(old),
                    freed,
                )?;
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
            Command::CrashTakeover(CrashTakeover {
                profile,
                lease,
                generation,
                next,
                reap_evidence,
            }) => {
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
                    MLeaseState::Reaped if reap_evidence.is_some() => {
                        return rej("EvidenceRefused")
                    }
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
                    next.provider,
                    &next.holder,
                    next.ttl_ms,
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
            Command::CommitCapsule(CommitCapsule { fence, capsule }) => {
                let writer = self.check_fence(fence, true)?;
                let (sequence, digest) = self.check_capsule(writer, capsule)?;
                let p = self.leases[&writer].profile;
                self.profiles[p].head = Some((sequence, digest));
                Ok(Outcome::CapsuleCommitted { sequence, digest })
            }
            Command::Sweep => {
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
            Command::SubmitTask(SubmitTask { spec }) => {
                self.tasks.push(MTask {
                    state: TaskState::Pending,
                    worker: None,
                    exit_code: None,
                    cancel_requested: false,
                    preserve: spec.lifecycle.failure_action == FailureAction::Preserve,
                    rank: spec.priority.rank(),
                });
                Ok(Outcome::TaskSubmitted {
                    task: task_id(self.tasks.len() - 1),
                })
            }
            Command::ReportTransition(ReportTransition {
                task,
                worker,
                attempt,
                from,
                to,
                detail,
            }) => {
                let Some(t) = self.task_idx(*task) else {
                    return rej("NotFound");
                };
                let mt = &self.tasks[t];
                if mt.worker.map(worker_id).as_ref() != Some(worker) || *attempt != 1 {
                    return rej("NotTaskOwner");
                }
                if *from != mt.state {
                    return Err(Rej::Exact(Rejection::StaleTaskState {
                        expected: *from,
                        current: mt.state,
                    }));
                }
                let legal = worker_may_move(mt.state, *to);
                if legal
                    && *to == TaskState::Completed
                    && detail.exit_code.is_some()
                    && detail.exit_code != mt.exit_code
                {
                    // Open: `apply` turns this into Expect::CompletedWithNewExitCode.
                    return Err(Rej::Kind("either"));
                }
                let allowed = legal
                    && match to {
                        TaskState::Completing => detail.exit_code.is_some(),
                        TaskState::Completed => mt.exit_code == Some(0),
                        TaskState::FailedPreserved => mt.preserve,
                        TaskState::Cancelled => mt.cancel_requested,
                        _ => true,
                    };
                if !allowed {
                    return rej("IllegalTransition");
                }
                let mt = &mut self.tasks[t];
                mt.state = *to;
                if detail.exit_code.is_some() {
                    mt.exit_code = detail.exit_code;
                }
                Ok(Outcome::TransitionRecorded { state: *to })
            }
            Command::CancelTask(CancelTask { task, .. }) => {
                let Some(t) = self.task_idx(*task) else {
                    return rej("NotFound");
                };
                let mt = &mut self.tasks[t];
                if is_terminal(mt.state) {
                    return rej("IllegalTransition");
                }
                if mt.state == TaskState::Pending {
                    mt.state = TaskState::Cancelled;
                }
                mt.cancel_requested = true;
                Ok(Outcome::CancelAccepted { state: mt.state })
            }
            other => panic!("the model does not generate {}", other.name()),
        }
    }

    pub(crate) fn assign(
        &mut self,
        assignments: &[Assignment],
    ) -> MResult<Vec<(TaskId, Result<(), &'static str>)>> {
        if assignments.is_empty() {
            return rej("Invalid");
        }
        let mut out = Vec::new();
        for a in assignments {
            let w = WORKERS
                .iter()
                .position(|n| *n == a.worker.as_str())
                .expect("known worker");
            let result = match self.task_idx(a.task) {
                None => Err("NotFound"),
                Some(t) if self.tasks[t].state != TaskState::Pending => Err("StaleTaskState"),
                Some(_) if self.assigned_count(w) >= WORKER_CAPACITY as usize => {
                    Err("WorkerUnavailable")
                }
                Some(t) => {
                    self.tasks[t].state = TaskState::Staging;
                    self.tasks[t].worker = Some(w);
                    Ok(())
                }
            };
            out.push((a.task, result));
        }
        Ok(out)
    }

    /// The PENDING queue: higher priority first, then submission order.
    pub(crate) fn pending_queue(&self) -> Vec<TaskId> {
        let mut q: Vec<(std::cmp::Reverse<u8>, usize)> = self
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, t)| t.state == TaskState::Pending)
            .map(|(i, t)| (std::cmp::Reverse(t.rank), i))
            .collect();
        q.sort_unstable();
        q.into_iter().map(|(_, i)| task_id(i)).collect()
    }
}

pub(crate) fn capsule_digest(profile: usize, generation: u64, draft: &CapsuleDraft) -> Digest {
    CapsuleDigestInput {
        schema_version: draft.schema_version,
        profile: profile_id(profile),
        generation: Generation::new(generation),
        sequence: draft.sequence,
        previous: draft.previous.as_ref(),
        payload: &draft.payload,
    }
    .digest()
}

pub(crate) fn is_terminal(s: TaskState) -> bool {
    matches!(
        s,
        TaskState::Completed
            | TaskState::Failed
            | TaskState::FailedPreserved
            | TaskState::Cancelled
    )
}

pub(crate) fn is_assigned(s: TaskState) -> bool {
    !is_terminal(s) && s != TaskState::Pending
}

/// The lifecycle of DESIGN.md §3, as a worker may report it.
pub(crate) fn worker_may_move(from: TaskState, to: TaskState) -> bool {
    use TaskState::*;
    if is_terminal(from) {
        return false;
    }
    matches!(
        (from, to),
        (Staging, Provisioning)
            | (Provisioning, Ready)
            | (Ready, Running)
            | (Running, Completing)
            | (Completing, Completed)
            | (_, Failed | FailedPreserved)
    ) || (to == Cancelled && from != Pending)
}

/// Any move the lifecycle allows, by a worker or by the control plane (assign, cancel queued).
pub(crate) fn lifecycle_allows(from: TaskState, to: TaskState) -> bool {
    worker_may_move(from, to)
        || matches!(
            (from, to),
            (TaskState::Pending, TaskState::Staging) | (TaskState::Pending, TaskState::Cancelled)
        )
}

pub(crate) fn forward(s: TaskState) -> TaskState {
    use TaskState::*;
    match s {
        Staging => Provisioning,
        Provisioning => Ready,
        Ready => Running,
        Running => Completing,
        Completing => Completed,
        _ => Staging,
    }
}
