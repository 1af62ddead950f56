//! The reference model: the state machine's rules again, written with plain collections.

mod capsules;
mod leases;
mod tasks;

pub(crate) use capsules::capsule_digest;
pub(crate) use tasks::{forward, has_sandbox, is_assigned, is_terminal, lifecycle_allows};

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
    pub(crate) agent: Option<MAgent>,
    pub(crate) state: TaskState,
    pub(crate) worker: Option<usize>,
    pub(crate) exit_code: Option<i32>,
    pub(crate) cancel_requested: bool,
    pub(crate) preserve: bool,
    pub(crate) rank: u8,
}

/// The agent of a task's sandbox as the model knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MAgent {
    pub(crate) registered_at_ms: u64,
    pub(crate) last_seen_ms: u64,
    pub(crate) check_ins: u64,
    pub(crate) usage: Option<SandboxUsage>,
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
    pub(crate) fn check_admission(
        &self,
        profile: ProfileId,
        expected: Generation,
        next: &NextHolder,
        replacing: Option<u64>,
        freed: u32,
    ) -> MResult<()> {
        if !(1_000..=600_000).contains(&next.ttl_ms) {
            return rej("Invalid");
        }
        let Some(p) = self.profile_idx(profile) else {
            return rej("NotFound");
        };
        let prof = &self.profiles[p];
        if !PROVIDERS.contains(&next.provider) {
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
        if next.holder.worker != worker_id(project.sandbox_worker) {
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
            Command::AcquireLease(c) => self.acquire_lease(c),
            Command::RenewLease(c) => self.renew_lease(c),
            Command::ReleaseLease(c) => self.release_lease(c),
            Command::FenceLease(c) => self.fence_lease(c),
            Command::RecordReapEvidence(c) => self.record_reap_evidence(c),
            Command::GracefulTakeover(c) => self.graceful_takeover(c),
            Command::CrashTakeover(c) => self.crash_takeover(c),
            Command::CommitCapsule(c) => self.commit_capsule(c),
            Command::Sweep => self.sweep(),
            Command::SubmitTask(c) => self.submit_task(c),
            Command::ReportTransition(c) => self.report_transition(c),
            Command::CancelTask(c) => self.cancel_task(c),
            Command::AgentCheckIn(c) => self.agent_check_in(c),
            other => panic!("the model does not generate {}", other.name()),
        }
    }
}
