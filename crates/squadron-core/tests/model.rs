//! Model-based property tests of the replicated state machine (DESIGN.md §2).
//!
//! A small reference model, written here with plain collections, is run beside the core on
//! random command sequences over a tiny universe (one tenant, one or two projects, up to six
//! profiles, two workers). After every step the test checks the core's own invariant checker,
//! that the core and the model agree on the answer and on every view the model keeps, that a
//! refused command changed nothing but the clock (and its idempotency record), and, in the
//! INV-12 test, that a second replica and snapshot round trips agree byte for byte.
//!
//! Commands are generated as abstract operations ("acquire for profile 2 with a stale
//! generation") and turned into concrete commands against the model's current view when they
//! run, so most fencing tokens, generations and chain positions are valid and some are
//! deliberately wrong.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::strategy::Union;

use squadron_core::capsule::{CapsuleDigestInput, CapsuleDraft, CapsulePayload};
use squadron_core::codec::{
    command_fingerprint, decode_command, decode_response, encode_command, encode_response,
};
use squadron_core::command::{
    AcquireLease, AssignTasks, Assignment, AttachSandbox, CancelTask, Command, CommandEnvelope,
    CommitCapsule, CrashTakeover, CreateProfile, CreateProject, FenceLease, GracefulTakeover,
    NextHolder, RecordReapEvidence, RegisterWorker, ReleaseLease, RenewLease, ReportTransition,
    SubmitTask, TransitionDetail, WorkerHeartbeat,
};
use squadron_core::ids::{
    Digest, Generation, IdempotencyKey, LeaseId, ProfileId, ProfileKey, ProjectId, TaskId,
    TenantId, WorkerId,
};
use squadron_core::lease::{
    EvidenceSource, FenceReason, FencingToken, LeaseHolder, LeaseState, ReapEvidence,
};
use squadron_core::limits::TERMINAL_LEASES_PER_PROFILE_KEPT;
use squadron_core::manifest::{
    parse_manifest_yaml, FailureAction, Keyword as _, RuntimeKind, TaskSpec,
};
use squadron_core::provider::Provider;
use squadron_core::rejection::Rejection;
use squadron_core::response::{LeaseGrant, Outcome, Response, SweepReport};
use squadron_core::snapshot::{decode_snapshot, encode_snapshot, state_digest};
use squadron_core::task::TaskState;
use squadron_core::State;

// --- the universe ------------------------------------------------------------------------------

const TENANT: &str = "t";
const WORKERS: [&str; 2] = ["w0", "w1"];
/// Time of the setup prefix; every lease is granted at or after it.
const SETUP_AT_MS: u64 = 1_000;
/// Tasks one worker runs at once; small so that "worker full" is reached.
const WORKER_CAPACITY: u32 = 3;
/// Long enough that no worker goes silent within a generated sequence (3 × this > horizon).
const HEARTBEAT_INTERVAL_MS: u64 = 600_000;
/// A lease id the core never reaches in a sequence.
const MISSING_LEASE: u64 = 9_999;
const PROVIDERS: [Provider; 2] = [Provider::Codex, Provider::Claude];
const PRIORITIES: [&str; 4] = ["low", "normal", "high", "critical"];

#[derive(Debug, Clone)]
struct Universe {
    /// `max_active` of each project (one or two projects).
    max_active: Vec<u32>,
    /// The project of each profile (one to six profiles).
    profile_projects: Vec<usize>,
}

fn universe() -> impl Strategy<Value = Universe> {
    prop::collection::vec(2u32..=4, 1..=2)
        .prop_flat_map(|max_active| {
            let n = max_active.len();
            (Just(max_active), prop::collection::vec(0..n, 1..=6))
        })
        .prop_map(|(max_active, profile_projects)| Universe {
            max_active,
            profile_projects,
        })
}

fn tenant() -> TenantId {
    TenantId::new(TENANT).expect("tenant name")
}

fn project_id(i: usize) -> ProjectId {
    ProjectId::new(format!("p{i}")).expect("project name")
}

fn worker_id(i: usize) -> WorkerId {
    WorkerId::new(WORKERS[i]).expect("worker name")
}

fn profile_id(i: usize) -> ProfileId {
    ProfileId::new(i as u64 + 1).expect("profile id")
}

fn lease_id(id: u64) -> LeaseId {
    LeaseId::new(id).expect("lease id")
}

fn task_id(i: usize) -> TaskId {
    TaskId::new(i as u64 + 1).expect("task id")
}

/// The eight specs the test submits: every priority, with failure_action destroy or preserve.
fn specs() -> &'static Vec<TaskSpec> {
    static SPECS: OnceLock<Vec<TaskSpec>> = OnceLock::new();
    SPECS.get_or_init(|| {
        let mut out = Vec::new();
        for priority in PRIORITIES {
            for action in ["destroy", "preserve"] {
                let text = format!(
                    "version: \"1\"\n\
                     kind: Task\n\
                     metadata: {{ name: t, labels: {{ priority: {priority} }} }}\n\
                     repository: {{ url: \"file:///srv/repo\" }}\n\
                     agent: {{ prompt: \"do it\" }}\n\
                     lifecycle: {{ failure_action: {action} }}\n"
                );
                let spec = parse_manifest_yaml(&text)
                    .unwrap_or_else(|e| panic!("manifest should parse: {e}\n{text}"));
                assert_eq!(spec.priority.as_str(), priority, "manifest priority label");
                assert_eq!(spec.lifecycle.failure_action.as_str(), action);
                assert_eq!(spec.sandbox.runtime, RuntimeKind::Process);
                out.push(spec);
            }
        }
        out
    })
}

/// A command that is refused without touching anything: used to move a copy's clock exactly
/// as the command under test moved the real one.
fn noop(at_ms: u64) -> CommandEnvelope {
    CommandEnvelope {
        at_ms,
        idempotency_key: None,
        command: Command::WorkerHeartbeat(WorkerHeartbeat {
            worker: WorkerId::new("ghost").expect("worker name"),
        }),
    }
}

/// The name of a rejection's variant, as the model predicts it.
fn kind(r: &Rejection) -> String {
    format!("{r:?}")
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect()
}

// --- the reference model -----------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MLeaseState {
    Active,
    Fenced,
    Released,
    Reaped,
}

impl MLeaseState {
    fn holds_slot(self) -> bool {
        matches!(self, MLeaseState::Active | MLeaseState::Fenced)
    }

    fn of(s: &LeaseState) -> Self {
        match s {
            LeaseState::Active => MLeaseState::Active,
            LeaseState::Fenced { .. } => MLeaseState::Fenced,
            LeaseState::Released { .. } => MLeaseState::Released,
            LeaseState::Reaped { .. } => MLeaseState::Reaped,
        }
    }
}

#[derive(Debug, Clone)]
struct MLease {
    id: u64,
    profile: usize,
    generation: u64,
    granted_at: u64,
    expires_at: u64,
    state: MLeaseState,
    cgroup: Option<String>,
}

#[derive(Debug, Clone)]
struct MProfile {
    project: usize,
    generation: u64,
    live: Option<u64>,
    /// Terminal leases, oldest first; the core keeps only the newest few.
    past: VecDeque<u64>,
    head: Option<(u64, Digest)>,
}

#[derive(Debug, Clone)]
struct MProject {
    max_active: u32,
    sandbox_worker: usize,
}

#[derive(Debug, Clone)]
struct MTask {
    state: TaskState,
    worker: Option<usize>,
    exit_code: Option<i32>,
    cancel_requested: bool,
    preserve: bool,
    rank: u8,
}

/// What the model expects a refusal to be: its variant, or the exact value.
#[derive(Debug, Clone, PartialEq)]
enum Rej {
    Kind(&'static str),
    Exact(Rejection),
}

type MResult<T> = Result<T, Rej>;

fn rej<T>(k: &'static str) -> MResult<T> {
    Err(Rej::Kind(k))
}

#[derive(Debug, Clone, PartialEq)]
enum Expect {
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
struct LedgerEntry {
    key: IdempotencyKey,
    command: Command,
    response: Response,
}

#[derive(Debug, Clone)]
struct Model {
    /// `now = max(prev now, at_ms)`.
    now: u64,
    /// The leader's last stamp; it may go backwards.
    last_at: u64,
    next_lease: u64,
    projects: Vec<MProject>,
    profiles: Vec<MProfile>,
    leases: BTreeMap<u64, MLease>,
    tasks: Vec<MTask>,
    ledger: Vec<LedgerEntry>,
    /// Every generation the core ever granted, per profile (INV-3: never twice).
    granted: BTreeMap<ProfileId, BTreeSet<Generation>>,
    /// Capacity the model admits beyond `max_active`. Always 0; raising it is how the test's
    /// own sensitivity was checked (it must then fail on INV-5).
    slack: u32,
}

impl Model {
    fn profile_idx(&self, id: ProfileId) -> Option<usize> {
        let i = usize::try_from(id.get()).ok()?.checked_sub(1)?;
        (i < self.profiles.len()).then_some(i)
    }

    fn task_idx(&self, id: TaskId) -> Option<usize> {
        let i = usize::try_from(id.get()).ok()?.checked_sub(1)?;
        (i < self.tasks.len()).then_some(i)
    }

    fn slots(&self, project: usize) -> u32 {
        self.leases
            .values()
            .filter(|l| self.profiles[l.profile].project == project && l.state.holds_slot())
            .count() as u32
    }

    fn expired(&self, l: &MLease) -> bool {
        self.now >= l.expires_at
    }

    /// The newest lease of a profile, if any.
    fn latest_lease(&self, p: usize) -> Option<&MLease> {
        self.leases.values().rev().find(|l| l.profile == p)
    }

    // -- lease primitives --

    fn fence(&mut self, id: u64) {
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

    fn end(&mut self, id: u64, terminal: MLeaseState) {
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

    fn grant(&mut self, p: usize, holder: &LeaseHolder, ttl: u64) -> LeaseGrant {
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
    fn check_fence(&self, tok: &FencingToken, require_unexpired: bool) -> MResult<u64> {
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
    fn check_evidence(&self, l: &MLease, ev: &ReapEvidence) -> MResult<()> {
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
    fn check_admission(
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
    fn check_capsule(&self, writer: u64, draft: &CapsuleDraft) -> MResult<(u64, Digest)> {
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
    fn unreaped_current(&self, p: usize) -> bool {
        let g = self.profiles[p].generation;
        self.leases
            .values()
            .any(|l| l.profile == p && l.generation == g && l.state == MLeaseState::Fenced)
    }

    fn assigned_count(&self, w: usize) -> usize {
        self.tasks
            .iter()
            .filter(|t| t.worker == Some(w) && is_assigned(t.state))
            .count()
    }

    // -- commands --

    fn apply(&mut self, cmd: &Command) -> Expect {
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

    fn apply_one(&mut self, cmd: &Command) -> MResult<Outcome> {
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

    fn assign(
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
    fn pending_queue(&self) -> Vec<TaskId> {
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

fn capsule_digest(profile: usize, generation: u64, draft: &CapsuleDraft) -> Digest {
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

fn is_terminal(s: TaskState) -> bool {
    matches!(
        s,
        TaskState::Completed
            | TaskState::Failed
            | TaskState::FailedPreserved
            | TaskState::Cancelled
    )
}

fn is_assigned(s: TaskState) -> bool {
    !is_terminal(s) && s != TaskState::Pending
}

/// The lifecycle of DESIGN.md §3, as a worker may report it.
fn worker_may_move(from: TaskState, to: TaskState) -> bool {
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
fn lifecycle_allows(from: TaskState, to: TaskState) -> bool {
    worker_may_move(from, to)
        || matches!(
            (from, to),
            (TaskState::Pending, TaskState::Staging) | (TaskState::Pending, TaskState::Cancelled)
        )
}

fn forward(s: TaskState) -> TaskState {
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

// --- abstract operations -----------------------------------------------------------------------

/// Which fencing token to present.
#[derive(Debug, Clone, Copy)]
enum Tok {
    /// The live lease of this profile or, if it has none, of the next profile that has one.
    Current,
    /// This very profile's live or newest lease, even when it has none live.
    Own,
    /// The right lease with a stale (or future) generation.
    StaleGen,
    /// Some other lease, under this profile's generation.
    OtherLease(usize),
    /// This profile's lease, presented for another profile.
    WrongProfile(usize),
}

/// Which lease reap evidence or a crash takeover names.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// The newest lease of the first profile (from this one on) whose newest lease has
    /// expired or been fenced: what reap evidence and crash takeovers are for.
    Stuck,
    /// The newest lease of the first profile (from this one on) that has any.
    Latest,
    Nth(usize),
    Missing,
}

#[derive(Debug, Clone, Copy)]
enum Chain {
    Right,
    SeqAhead,
    SeqRepeat,
    WrongPrev,
    Zero,
}

#[derive(Debug, Clone, Copy)]
enum Verify {
    Unset,
    Right,
    Wrong,
}

#[derive(Debug, Clone, Copy)]
struct Ev {
    populated: bool,
    gen_ok: bool,
    cgroup_ok: bool,
    observed_ok: bool,
    source_ok: bool,
}

#[derive(Debug, Clone, Copy)]
struct Next {
    provider: Provider,
    worker_ok: bool,
    cgroup: bool,
    ttl: u64,
}

#[derive(Debug, Clone, Copy)]
enum Gen {
    Right,
    Behind,
    Ahead,
}

#[derive(Debug, Clone, Copy)]
enum To {
    Forward,
    Fail,
    FailPreserved,
    Cancel,
    Any(usize),
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        p: usize,
        /// Prefer a profile that can be granted (no live lease, nothing unreaped).
        idle: bool,
        gen: Gen,
        next: Next,
    },
    Renew {
        p: usize,
        tok: Tok,
        ttl: u64,
    },
    Release {
        p: usize,
        tok: Tok,
    },
    Fence {
        p: usize,
        tok: Tok,
        reason: FenceReason,
    },
    Reap {
        p: usize,
        target: Target,
        ev: Ev,
    },
    Graceful {
        p: usize,
        tok: Tok,
        chain: Chain,
        verify: Verify,
        seed: u8,
        ev: Option<Ev>,
        next: Next,
    },
    Crash {
        p: usize,
        target: Target,
        gen_ok: bool,
        ev: Option<Ev>,
        next: Next,
    },
    Commit {
        p: usize,
        tok: Tok,
        chain: Chain,
        verify: Verify,
        seed: u8,
    },
    Sweep,
    Submit {
        spec: usize,
    },
    Assign {
        picks: Vec<(usize, usize)>,
        raw: bool,
    },
    Report {
        t: usize,
        raw: bool,
        worker_ok: bool,
        attempt_ok: bool,
        from_ok: bool,
        to: To,
        exit: Option<i32>,
    },
    Cancel {
        t: usize,
    },
}

#[derive(Debug, Clone, Copy)]
enum KeyUse {
    Unkeyed,
    Fresh,
    /// Retry the command first sent under the i-th key used so far.
    Same(usize),
    /// Send this step's command under the i-th key used so far.
    Other(usize),
}

#[derive(Debug, Clone)]
struct Step {
    dt: i64,
    key: KeyUse,
    op: Op,
}

/// Weights of the operations in one test's sequences.
#[derive(Debug, Clone, Copy)]
struct Mix {
    acquire: u32,
    renew: u32,
    release: u32,
    fence: u32,
    reap: u32,
    graceful: u32,
    crash: u32,
    commit: u32,
    sweep: u32,
    submit: u32,
    assign: u32,
    report: u32,
    cancel: u32,
    /// Percentage of steps that carry an idempotency key.
    keyed: u32,
    max_len: usize,
    /// Largest forward time step, ms.
    dt_max: i64,
}

const BALANCED: Mix = Mix {
    acquire: 12,
    renew: 5,
    release: 5,
    fence: 4,
    reap: 6,
    graceful: 5,
    crash: 5,
    commit: 6,
    sweep: 5,
    submit: 5,
    assign: 4,
    report: 10,
    cancel: 2,
    keyed: 15,
    max_len: 80,
    dt_max: 3_000,
};

const LEASES: Mix = Mix {
    acquire: 14,
    renew: 6,
    release: 6,
    fence: 5,
    reap: 8,
    graceful: 5,
    crash: 7,
    commit: 2,
    sweep: 6,
    submit: 1,
    assign: 1,
    report: 1,
    cancel: 1,
    keyed: 10,
    max_len: 100,
    dt_max: 3_000,
};

const CAPSULES: Mix = Mix {
    acquire: 10,
    renew: 4,
    release: 3,
    fence: 1,
    reap: 3,
    graceful: 8,
    crash: 2,
    commit: 14,
    sweep: 2,
    submit: 0,
    assign: 0,
    report: 0,
    cancel: 0,
    keyed: 10,
    max_len: 80,
    dt_max: 1_500,
};

const TASKS: Mix = Mix {
    acquire: 2,
    renew: 0,
    release: 1,
    fence: 0,
    reap: 0,
    graceful: 0,
    crash: 0,
    commit: 0,
    sweep: 2,
    submit: 8,
    assign: 10,
    report: 22,
    cancel: 3,
    keyed: 10,
    max_len: 80,
    dt_max: 3_000,
};

/// Shorter sequences: every step also runs a second replica and compares snapshot bytes.
const REPLICAS: Mix = Mix {
    max_len: 60,
    ..BALANCED
};

const IDEMPOTENT: Mix = Mix {
    keyed: 60,
    max_len: 80,
    ..BALANCED
};

fn any_p() -> impl Strategy<Value = usize> {
    0usize..6
}

fn tok() -> impl Strategy<Value = Tok> {
    prop_oneof![
        14 => Just(Tok::Current),
        2 => Just(Tok::Own),
        2 => Just(Tok::StaleGen),
        2 => (0usize..32).prop_map(Tok::OtherLease),
        1 => (0usize..6).prop_map(Tok::WrongProfile),
    ]
}

fn ttl() -> impl Strategy<Value = u64> {
    prop_oneof![30 => 1_000u64..=5_000, 1 => Just(999u64)]
}

fn provider() -> impl Strategy<Value = Provider> {
    prop_oneof![
        10 => Just(Provider::Codex),
        8 => Just(Provider::Claude),
        1 => Just(Provider::Script),
    ]
}

fn next() -> impl Strategy<Value = Next> {
    (
        provider(),
        prop::bool::weighted(0.92),
        prop::bool::weighted(0.8),
        ttl(),
    )
        .prop_map(|(provider, worker_ok, cgroup, ttl)| Next {
            provider,
            worker_ok,
            cgroup,
            ttl,
        })
}

fn ev() -> impl Strategy<Value = Ev> {
    (
        prop::bool::weighted(0.12),
        prop::bool::weighted(0.88),
        prop::bool::weighted(0.88),
        prop::bool::weighted(0.92),
        prop::bool::weighted(0.95),
    )
        .prop_map(
            |(populated, gen_ok, cgroup_ok, observed_ok, source_ok)| Ev {
                populated,
                gen_ok,
                cgroup_ok,
                observed_ok,
                source_ok,
            },
        )
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        10 => Just(Target::Stuck),
        6 => Just(Target::Latest),
        3 => (0usize..32).prop_map(Target::Nth),
        1 => Just(Target::Missing),
    ]
}

fn chain() -> impl Strategy<Value = Chain> {
    prop_oneof![
        16 => Just(Chain::Right),
        1 => Just(Chain::SeqAhead),
        1 => Just(Chain::SeqRepeat),
        1 => Just(Chain::WrongPrev),
        1 => Just(Chain::Zero),
    ]
}

fn verify() -> impl Strategy<Value = Verify> {
    prop_oneof![
        6 => Just(Verify::Unset),
        4 => Just(Verify::Right),
        1 => Just(Verify::Wrong),
    ]
}

fn to() -> impl Strategy<Value = To> {
    prop_oneof![
        14 => Just(To::Forward),
        2 => Just(To::Fail),
        2 => Just(To::FailPreserved),
        2 => Just(To::Cancel),
        2 => (0usize..10).prop_map(To::Any),
    ]
}

fn op(mix: Mix) -> BoxedStrategy<Op> {
    let arms: Vec<(u32, BoxedStrategy<Op>)> =
        vec![
        (
            mix.acquire,
            (
                any_p(),
                prop::bool::weighted(0.75),
                prop_oneof![8 => Just(Gen::Right), 1 => Just(Gen::Behind), 1 => Just(Gen::Ahead)],
                next(),
            )
                .prop_map(|(p, idle, gen, next)| Op::Acquire { p, idle, gen, next })
                .boxed(),
        ),
        (
            mix.renew,
            (any_p(), tok(), ttl())
                .prop_map(|(p, tok, ttl)| Op::Renew { p, tok, ttl })
                .boxed(),
        ),
        (
            mix.release,
            (any_p(), tok())
                .prop_map(|(p, tok)| Op::Release { p, tok })
                .boxed(),
        ),
        (
            mix.fence,
            (
                any_p(),
                tok(),
                prop_oneof![
                    5 => Just(FenceReason::Operator),
                    4 => Just(FenceReason::Expired),
                    1 => Just(FenceReason::Takeover),
                ],
            )
                .prop_map(|(p, tok, reason)| Op::Fence { p, tok, reason })
                .boxed(),
        ),
        (
            mix.reap,
            (any_p(), target(), ev())
                .prop_map(|(p, target, ev)| Op::Reap { p, target, ev })
                .boxed(),
        ),
        (
            mix.graceful,
            (
                any_p(),
                tok(),
                chain(),
                verify(),
                any::<u8>(),
                prop::option::weighted(0.5, ev()),
                next(),
            )
                .prop_map(|(p, tok, chain, verify, seed, ev, next)| Op::Graceful {
                    p,
                    tok,
                    chain,
                    verify,
                    seed,
                    ev,
                    next,
                })
                .boxed(),
        ),
        (
            mix.crash,
            (
                any_p(),
                target(),
                prop::bool::weighted(0.9),
                prop::option::weighted(0.75, ev()),
                next(),
            )
                .prop_map(|(p, target, gen_ok, ev, next)| Op::Crash {
                    p,
                    target,
                    gen_ok,
                    ev,
                    next,
                })
                .boxed(),
        ),
        (
            mix.commit,
            (any_p(), tok(), chain(), verify(), any::<u8>())
                .prop_map(|(p, tok, chain, verify, seed)| Op::Commit {
                    p,
                    tok,
                    chain,
                    verify,
                    seed,
                })
                .boxed(),
        ),
        (mix.sweep, Just(Op::Sweep).boxed()),
        (
            mix.submit,
            (0usize..8).prop_map(|spec| Op::Submit { spec }).boxed(),
        ),
        (
            mix.assign,
            (
                prop::collection::vec((0usize..16, 0usize..2), 1..=3),
                prop::bool::weighted(0.15),
            )
                .prop_map(|(picks, raw)| Op::Assign { picks, raw })
                .boxed(),
        ),
        (
            mix.report,
            (
                (0usize..16, prop::bool::weighted(0.1)),
                prop::bool::weighted(0.92),
                prop::bool::weighted(0.95),
                prop::bool::weighted(0.9),
                to(),
                prop_oneof![8 => Just(Some(0)), 1 => Just(Some(1)), 1 => Just(None)],
            )
                .prop_map(|((t, raw), worker_ok, attempt_ok, from_ok, to, exit)| Op::Report {
                    t,
                    raw,
                    worker_ok,
                    attempt_ok,
                    from_ok,
                    to,
                    exit,
                })
                .boxed(),
        ),
        (
            mix.cancel,
            (0usize..16).prop_map(|t| Op::Cancel { t }).boxed(),
        ),
    ];
    Union::new_weighted(arms.into_iter().filter(|(w, _)| *w > 0).collect()).boxed()
}

fn key_use(keyed: u32) -> impl Strategy<Value = KeyUse> {
    prop_oneof![
        100 - keyed => Just(KeyUse::Unkeyed),
        keyed * 2 / 4 => Just(KeyUse::Fresh),
        keyed / 4 => (0usize..8).prop_map(KeyUse::Same),
        keyed / 4 => (0usize..8).prop_map(KeyUse::Other),
    ]
}

fn steps(mix: Mix) -> impl Strategy<Value = Vec<Step>> {
    let step = (
        prop_oneof![9 => 0i64..=mix.dt_max, 1 => -3_000i64..0],
        key_use(mix.keyed),
        op(mix),
    )
        .prop_map(|(dt, key, op)| Step { dt, key, op });
    prop::collection::vec(step, 1..=mix.max_len)
}

// --- turning operations into commands ----------------------------------------------------------

impl Model {
    fn n_profiles(&self) -> usize {
        self.profiles.len()
    }

    /// The first profile, from `p` on, that satisfies `pred`; `p` itself when none does.
    fn pick(&self, p: usize, pred: impl Fn(&Self, usize) -> bool) -> usize {
        let n = self.n_profiles();
        (0..n)
            .map(|k| (p + k) % n)
            .find(|q| pred(self, *q))
            .unwrap_or(p % n)
    }

    fn pick_live(&self, p: usize, tok: Tok) -> usize {
        match tok {
            Tok::Own => p % self.n_profiles(),
            _ => self.pick(p, |m, q| m.profiles[q].live.is_some()),
        }
    }

    fn token(&self, p: usize, tok: Tok) -> FencingToken {
        let prof = &self.profiles[p];
        let (lease, generation) = match (prof.live, self.latest_lease(p)) {
            (Some(l), _) => (l, prof.generation),
            (None, Some(l)) => (l.id, l.generation),
            (None, None) => (MISSING_LEASE, prof.generation),
        };
        let mut t = FencingToken {
            profile: profile_id(p),
            lease: lease_id(lease),
            generation: Generation::new(generation),
        };
        match tok {
            Tok::Current | Tok::Own => {}
            Tok::StaleGen => {
                t.generation = Generation::new(generation.checked_sub(1).unwrap_or(1));
            }
            Tok::OtherLease(i) => {
                let ids: Vec<u64> = self.leases.keys().copied().collect();
                if !ids.is_empty() {
                    t.lease = lease_id(ids[i % ids.len()]);
                }
            }
            Tok::WrongProfile(i) => t.profile = profile_id(i % self.n_profiles()),
        }
        t
    }

    fn target(&self, p: usize, target: Target) -> (usize, u64) {
        let stuck = |m: &Self, q: usize| {
            m.latest_lease(q).is_some_and(|l| {
                l.state == MLeaseState::Fenced || (l.state == MLeaseState::Active && m.expired(l))
            })
        };
        let newest = |q: usize| (q, self.latest_lease(q).map_or(MISSING_LEASE, |l| l.id));
        let p = p % self.n_profiles();
        let lease = match target {
            Target::Stuck => return newest(self.pick(p, stuck)),
            Target::Latest => return newest(self.pick(p, |m, q| m.latest_lease(q).is_some())),
            Target::Nth(i) => {
                let ids: Vec<u64> = self.leases.keys().copied().collect();
                if ids.is_empty() {
                    MISSING_LEASE
                } else {
                    ids[i % ids.len()]
                }
            }
            Target::Missing => MISSING_LEASE,
        };
        (p, lease)
    }

    fn evidence(&self, lease: u64, ev: Ev, now: u64) -> ReapEvidence {
        let (generation, cgroup, granted_at) = self.leases.get(&lease).map_or_else(
            || (1, "cg-none".to_string(), SETUP_AT_MS),
            |l| {
                (
                    l.generation,
                    l.cgroup.clone().unwrap_or_else(|| "cg-any".into()),
                    l.granted_at,
                )
            },
        );
        ReapEvidence {
            lease: lease_id(lease),
            generation: Generation::new(if ev.gen_ok {
                generation
            } else {
                generation + 1
            }),
            cgroup: if ev.cgroup_ok {
                cgroup
            } else {
                "cg-elsewhere".into()
            },
            populated: ev.populated,
            observed_at_ms: if ev.observed_ok { now } else { granted_at - 1 },
            source: if ev.source_ok {
                EvidenceSource::CgroupEvents
            } else {
                EvidenceSource::OperatorDecommission {
                    operator: "op".into(),
                    reason: "said so".into(),
                }
            },
        }
    }

    fn holder(&self, p: usize, next: Next) -> LeaseHolder {
        let sandbox = self.projects[self.profiles[p].project].sandbox_worker;
        let worker = if next.worker_ok { sandbox } else { 1 - sandbox };
        LeaseHolder {
            worker: worker_id(worker),
            process: format!("pid for profile {p}"),
            cgroup: next
                .cgroup
                .then(|| format!("cg-p{p}-g{}", self.profiles[p].generation + 1)),
        }
    }

    fn next_holder(&self, p: usize, next: Next) -> NextHolder {
        NextHolder {
            provider: next.provider,
            holder: self.holder(p, next),
            ttl_ms: next.ttl,
        }
    }

    fn draft(&self, p: usize, chain: Chain, verify: Verify, seed: u8) -> CapsuleDraft {
        let head = self.profiles[p].head;
        let right_seq = head.map_or(1, |h| h.0 + 1);
        let right_prev = head.map(|h| h.1);
        let bogus = Digest::from_bytes([0xAB; 32]);
        let (sequence, previous) = match chain {
            Chain::Right => (right_seq, right_prev),
            Chain::SeqAhead => (right_seq + 1, right_prev),
            Chain::SeqRepeat => (head.map_or(2, |h| h.0), right_prev),
            Chain::WrongPrev => (right_seq, Some(bogus)),
            Chain::Zero => (0, right_prev),
        };
        let payload = CapsulePayload {
            task_state: format!("state {seed}"),
            decisions: vec![format!("decision {}", seed % 3)],
            pending_work: Vec::new(),
            repository_revision: "0123abc".into(),
            mailbox_cursor: u64::from(seed),
            context_ref: String::new(),
        };
        let mut draft = CapsuleDraft {
            sequence,
            previous,
            schema_version: 1,
            payload,
            expected_digest: None,
        };
        draft.expected_digest = match verify {
            Verify::Unset => None,
            Verify::Right => Some(capsule_digest(p, self.profiles[p].generation, &draft)),
            Verify::Wrong => Some(bogus),
        };
        draft
    }

    /// The first task, from `t` on, that satisfies `pred` (any task when `raw`).
    fn task_sel(&self, t: usize, raw: bool, pred: impl Fn(&MTask) -> bool) -> TaskId {
        let n = self.tasks.len();
        if n == 0 {
            return task_id(0);
        }
        let found = (0..n)
            .map(|k| (t + k) % n)
            .find(|i| raw || pred(&self.tasks[*i]));
        task_id(found.unwrap_or(t % n))
    }

    /// The concrete command of an operation, against the model's current view. `now` is the
    /// time the command will be applied at.
    fn resolve(&self, op: &Op, now: u64) -> Command {
        let n = self.n_profiles();
        match op {
            Op::Acquire { p, idle, gen, next } => {
                let p = if *idle {
                    self.pick(*p, |m, q| {
                        m.profiles[q].live.is_none() && !m.unreaped_current(q)
                    })
                } else {
                    p % n
                };
                let g = self.profiles[p].generation;
                let expected = match gen {
                    Gen::Right => g,
                    Gen::Behind => g.checked_sub(1).unwrap_or(1),
                    Gen::Ahead => g + 1,
                };
                Command::AcquireLease(AcquireLease {
                    profile: profile_id(p),
                    expected_generation: Generation::new(expected),
                    provider: next.provider,
                    holder: self.holder(p, *next),
                    ttl_ms: next.ttl,
                })
            }
            Op::Renew { p, tok, ttl } => Command::RenewLease(RenewLease {
                fence: self.token(self.pick_live(*p, *tok), *tok),
                ttl_ms: *ttl,
            }),
            Op::Release { p, tok } => Command::ReleaseLease(ReleaseLease {
                fence: self.token(self.pick_live(*p, *tok), *tok),
            }),
            Op::Fence { p, tok, reason } => Command::FenceLease(FenceLease {
                fence: self.token(self.pick_live(*p, *tok), *tok),
                reason: reason.clone(),
            }),
            Op::Reap { p, target, ev } => {
                let (p, lease) = self.target(*p, *target);
                Command::RecordReapEvidence(RecordReapEvidence {
                    profile: profile_id(p),
                    evidence: self.evidence(lease, *ev, now),
                })
            }
            Op::Graceful {
                p,
                tok,
                chain,
                verify,
                seed,
                ev,
                next,
            } => {
                let p = self.pick_live(*p, *tok);
                let fence = self.token(p, *tok);
                Command::GracefulTakeover(GracefulTakeover {
                    fence,
                    capsule: self.draft(p, *chain, *verify, *seed),
                    next: self.next_holder(p, *next),
                    old_reap_evidence: ev.map(|ev| self.evidence(fence.lease.get(), ev, now)),
                })
            }
            Op::Crash {
                p,
                target,
                gen_ok,
                ev,
                next,
            } => {
                let (p, lease) = self.target(*p, *target);
                let g = self.profiles[p].generation;
                Command::CrashTakeover(CrashTakeover {
                    profile: profile_id(p),
                    lease: lease_id(lease),
                    generation: Generation::new(if *gen_ok { g } else { g + 1 }),
                    next: self.next_holder(p, *next),
                    reap_evidence: ev.map(|ev| self.evidence(lease, ev, now)),
                })
            }
            Op::Commit {
                p,
                tok,
                chain,
                verify,
                seed,
            } => {
                let p = self.pick_live(*p, *tok);
                Command::CommitCapsule(CommitCapsule {
                    fence: self.token(p, *tok),
                    capsule: self.draft(p, *chain, *verify, *seed),
                })
            }
            Op::Sweep => Command::Sweep,
            Op::Submit { spec } => Command::SubmitTask(SubmitTask {
                spec: Box::new(specs()[*spec].clone()),
            }),
            Op::Assign { picks, raw } => Command::AssignTasks(AssignTasks {
                assignments: picks
                    .iter()
                    .map(|(t, w)| Assignment {
                        task: self.task_sel(*t, *raw, |m| m.state == TaskState::Pending),
                        worker: worker_id(*w),
                    })
                    .collect(),
            }),
            Op::Report {
                t,
                raw,
                worker_ok,
                attempt_ok,
                from_ok,
                to,
                exit,
            } => {
                let id = self.task_sel(*t, *raw, |m| is_assigned(m.state));
                let (state, owner) = self.task_idx(id).map_or((TaskState::Pending, None), |i| {
                    (self.tasks[i].state, self.tasks[i].worker)
                });
                let worker = match (owner, worker_ok) {
                    (Some(w), true) => w,
                    (Some(w), false) => 1 - w,
                    (None, ok) => usize::from(!ok),
                };
                let from = if *from_ok {
                    state
                } else {
                    let i = TaskState::ALL.iter().position(|s| *s == state).unwrap_or(0);
                    TaskState::ALL[(i + 1 + t) % TaskState::ALL.len()]
                };
                let to = match to {
                    To::Forward => forward(state),
                    To::Fail => TaskState::Failed,
                    To::FailPreserved => TaskState::FailedPreserved,
                    To::Cancel => TaskState::Cancelled,
                    To::Any(i) => TaskState::ALL[i % TaskState::ALL.len()],
                };
                Command::ReportTransition(ReportTransition {
                    task: id,
                    worker: worker_id(worker),
                    attempt: if *attempt_ok { 1 } else { 2 },
                    from,
                    to,
                    detail: TransitionDetail {
                        exit_code: *exit,
                        error: None,
                        artifacts: Vec::new(),
                    },
                })
            }
            Op::Cancel { t } => Command::CancelTask(CancelTask {
                task: self.task_sel(*t, true, |_| true),
                reason: "operator changed their mind".into(),
            }),
        }
    }
}

// --- running a sequence ------------------------------------------------------------------------

/// INV-12: how often (in steps) the replica is reinstalled from its snapshot.
const SNAPSHOT_EVERY: usize = 4;

/// What one test checks beyond the model.
#[derive(Debug, Clone, Copy, Default)]
struct Checks {
    /// INV-12: a second replica, reinstalled from its own snapshot before every command,
    /// applies the same envelopes and must stay byte-identical; snapshots round-trip.
    replicas: bool,
}

/// The public views of a state that the "refused means unchanged" check compares when the
/// idempotency ledger legitimately differs.
#[derive(Debug, PartialEq)]
struct Views {
    clock: u64,
    projects: Vec<squadron_core::project::Project>,
    profiles: Vec<squadron_core::profile::AgentProfile>,
    leases: Vec<squadron_core::lease::RuntimeLease>,
    mailboxes: Vec<squadron_core::mailbox::Mailbox>,
    tasks: Vec<squadron_core::task::Task>,
    pending: Vec<TaskId>,
    workers: Vec<squadron_core::worker::Worker>,
}

fn views(s: &State) -> Views {
    Views {
        clock: s.clock_ms(),
        projects: s.projects().cloned().collect(),
        profiles: s.profiles().cloned().collect(),
        leases: s.leases().cloned().collect(),
        mailboxes: s
            .profiles()
            .filter_map(|p| s.mailbox(p.id).cloned())
            .collect(),
        tasks: s.tasks(None).cloned().collect(),
        pending: s.pending_queue().collect(),
        workers: s.workers().cloned().collect(),
    }
}

struct Run {
    core: State,
    model: Model,
    replica: Option<State>,
    checks: Checks,
    next_key: usize,
}

impl Run {
    fn new(u: &Universe, checks: Checks) -> Self {
        let mut setup = Vec::new();
        for (i, _) in WORKERS.iter().enumerate() {
            setup.push(Command::RegisterWorker(RegisterWorker {
                worker: worker_id(i),
                address: format!("10.0.0.{i}:7000"),
                runtimes: vec![RuntimeKind::Process],
                capacity: WORKER_CAPACITY,
                labels: BTreeMap::new(),
                heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS,
            }));
        }
        for (i, max) in u.max_active.iter().enumerate() {
            setup.push(Command::CreateProject(CreateProject {
                tenant: tenant(),
                project: project_id(i),
                max_profiles: None,
                max_active: Some(*max),
            }));
            setup.push(Command::AttachSandbox(AttachSandbox {
                tenant: tenant(),
                project: project_id(i),
                worker: worker_id(i),
                runtime: RuntimeKind::Process,
                sandbox_ref: format!("sandbox-{i}"),
            }));
        }
        for (j, project) in u.profile_projects.iter().enumerate() {
            setup.push(Command::CreateProfile(CreateProfile {
                tenant: tenant(),
                project: project_id(*project),
                key: ProfileKey::new(format!("agent-{j}")).expect("profile key"),
                providers: PROVIDERS.to_vec(),
                context_ref: None,
            }));
        }
        let mut core = State::new();
        let mut replica = checks.replicas.then(State::new);
        for command in setup {
            let env = CommandEnvelope {
                at_ms: SETUP_AT_MS,
                idempotency_key: None,
                command,
            };
            let r = core.apply(env.clone());
            assert!(r.is_ok(), "setup command {:?} refused: {r:?}", env.command);
            if let Some(rep) = replica.as_mut() {
                assert_eq!(rep.apply(env), r, "INV-12: replicas answer setup alike");
            }
        }
        for (j, _) in u.profile_projects.iter().enumerate() {
            assert_eq!(
                core.profile(profile_id(j))
                    .map(|p| p.key.as_str().to_string()),
                Some(format!("agent-{j}")),
                "profiles get ids 1.. in creation order"
            );
        }
        let model = Model {
            now: SETUP_AT_MS,
            last_at: SETUP_AT_MS,
            next_lease: 1,
            projects: u
                .max_active
                .iter()
                .enumerate()
                .map(|(i, m)| MProject {
                    max_active: *m,
                    sandbox_worker: i,
                })
                .collect(),
            profiles: u
                .profile_projects
                .iter()
                .map(|project| MProfile {
                    project: *project,
                    generation: 0,
                    live: None,
                    past: VecDeque::new(),
                    head: None,
                })
                .collect(),
            leases: BTreeMap::new(),
            tasks: Vec::new(),
            ledger: Vec::new(),
            granted: BTreeMap::new(),
            slack: 0,
        };
        let run = Self {
            core,
            model,
            replica,
            checks,
            next_key: 0,
        };
        run.check_agreement("after setup");
        run
    }

    fn step(&mut self, i: usize, step: &Step) {
        let at_ms = self.model.last_at.saturating_add_signed(step.dt);
        self.model.last_at = at_ms;
        let now = self.model.now.max(at_ms);

        let (command, key) = match (step.key, self.model.ledger.is_empty()) {
            (KeyUse::Fresh, _) => {
                self.next_key += 1;
                let key = IdempotencyKey::new(format!("key-{}", self.next_key)).expect("key");
                (self.model.resolve(&step.op, now), Some(key))
            }
            (KeyUse::Same(k), false) => {
                let e = &self.model.ledger[k % self.model.ledger.len()];
                (e.command.clone(), Some(e.key.clone()))
            }
            (KeyUse::Other(k), false) => {
                let e = &self.model.ledger[k % self.model.ledger.len()];
                (self.model.resolve(&step.op, now), Some(e.key.clone()))
            }
            _ => (self.model.resolve(&step.op, now), None),
        };
        let env = CommandEnvelope {
            at_ms,
            idempotency_key: key.clone(),
            command: command.clone(),
        };
        let ctx = format!("step {i}: {} at {at_ms} ms (key {key:?})", command.name());

        // The log encoding round-trips every envelope.
        let encoded = encode_command(&env);
        assert_eq!(
            decode_command(&encoded).as_ref(),
            Ok(&env),
            "INV-12: command codec round trip, {ctx}"
        );

        // The leader skips idle sweeps: a sweep is due exactly when an active lease has expired
        // by command time (no worker goes silent and no idempotency record ages out here).
        let expired_active = self
            .model
            .leases
            .values()
            .any(|l| l.state == MLeaseState::Active && now >= l.expires_at);
        assert_eq!(
            self.core.sweep_due(at_ms),
            expired_active,
            "INV-5/INV-9: sweep_due judges expiry by command time, {ctx}"
        );

        let pre = self.core.clone();
        let pre_live: Vec<(Option<u64>, u64)> = self
            .model
            .profiles
            .iter()
            .map(|p| (p.live, p.generation))
            .collect();
        let response = self.core.apply(env.clone());
        if let Err(e) = self.core.check_invariants() {
            panic!("check_invariants failed ({e}) after {ctx}\ncommand {command:#?}");
        }
        assert_eq!(
            decode_response(&encode_response(&response)).as_ref(),
            Ok(&response),
            "INV-12: response codec round trip, {ctx}"
        );

        // The model's answer.
        self.model.now = now;
        let prior = key
            .as_ref()
            .and_then(|k| self.model.ledger.iter().find(|e| &e.key == k))
            .cloned();
        let expect = match &prior {
            Some(e) if e.command == command => Expect::Replay(e.response.clone()),
            Some(_) => Expect::Rejected(Rej::Kind("IdempotencyKeyReused")),
            None => self.model.apply(&command),
        };
        check_response(&expect, &response, &ctx, &command);
        if let (Expect::CompletedWithNewExitCode(t), true) = (&expect, response.is_ok()) {
            let task = self.core.task(task_id(*t)).expect("reported task");
            self.model.tasks[*t].state = TaskState::Completed;
            self.model.tasks[*t].exit_code = task.exit_code;
        }

        // INV-11: a keyed first attempt records exactly its answer.
        if let (Some(k), None) = (&key, &prior) {
            let mut ledger = pre.idempotency().clone();
            ledger.record(
                k.clone(),
                command_fingerprint(&command),
                response.clone(),
                now,
            );
            assert!(
                self.core.idempotency() == &ledger,
                "INV-11: the ledger must gain exactly this answer, {ctx}"
            );
            self.model.ledger.push(LedgerEntry {
                key: k.clone(),
                command: command.clone(),
                response: response.clone(),
            });
        }

        // A refused command, a replay and a reused key change nothing but the clock (and a
        // refused first attempt its ledger record, checked above).
        let replay = matches!(expect, Expect::Replay(_));
        self.check_step(&pre, &pre_live, &command, &response, replay, &ctx);
        self.check_agreement(&ctx);

        let unchanged = matches!(expect, Expect::Replay(_) | Expect::Rejected(_))
            || (matches!(expect, Expect::CompletedWithNewExitCode(_)) && !response.is_ok());
        if unchanged {
            let mut expected = pre;
            assert!(
                !expected.apply(noop(at_ms)).is_ok(),
                "the clock-moving no-op must be refused"
            );
            if key.is_some() && prior.is_none() {
                assert!(
                    views(&self.core) == views(&expected),
                    "a refused command changed the state, {ctx}\nresponse {response:?}"
                );
            } else {
                // Equal states have equal digests; comparing the values is the same check,
                // cheaper, and names what differs.
                assert!(
                    self.core == expected,
                    "a refused or replayed command changed the state (digest {} vs {}), {ctx}\n\
                     response {response:?}",
                    state_digest(&self.core),
                    state_digest(&expected)
                );
            }
        }

        if self.checks.replicas {
            self.check_replica(
                env,
                &response,
                i % SNAPSHOT_EVERY == SNAPSHOT_EVERY - 1,
                &ctx,
            );
        }
    }

    /// INV-12: the replica applies the same envelope, answers alike and holds byte-identical
    /// state (the snapshot encoding is what `state_digest` hashes). At a `restart`, it is
    /// reinstalled from its own snapshot, which must decode to the same state, and the
    /// digests are compared.
    fn check_replica(
        &mut self,
        env: CommandEnvelope,
        response: &Response,
        restart: bool,
        ctx: &str,
    ) {
        let mut replica = self.replica.take().expect("replica");
        let r2 = replica.apply(env);
        assert_eq!(&r2, response, "INV-12: replicas answer alike, {ctx}");
        let bytes = encode_snapshot(&replica);
        assert!(
            bytes == encode_snapshot(&self.core),
            "INV-12: replicas that applied the same index hold byte-identical state, {ctx}"
        );
        if restart {
            let restored = decode_snapshot(&bytes).expect("INV-12: snapshot decodes");
            assert!(restored == replica, "INV-12: snapshot round trip, {ctx}");
            assert_eq!(
                state_digest(&restored),
                state_digest(&self.core),
                "INV-12: state digests of replicas agree, {ctx}"
            );
            replica = restored;
        }
        self.replica = Some(replica);
    }

    /// Per-step checks that compare the state before and after one command.
    fn check_step(
        &mut self,
        pre: &State,
        pre_live: &[(Option<u64>, u64)],
        command: &Command,
        response: &Response,
        replay: bool,
        ctx: &str,
    ) {
        let post = &self.core;
        // INV-3: a generation moves by at most one per command, and only with a grant.
        let grant = match response {
            Response::Ok(Outcome::LeaseGranted(g)) => Some(*g),
            Response::Ok(Outcome::TookOver { grant, .. }) => Some(*grant),
            _ => None,
        };
        for before in pre.profiles() {
            let after = post.profile(before.id).expect("profiles are never removed");
            let moved = after.generation != before.generation;
            if moved {
                assert_eq!(
                    after.generation,
                    before.generation.successor(),
                    "INV-3: generation rises by exactly one, profile {}, {ctx}",
                    before.id
                );
            }
            let granted_here = grant.is_some_and(|g| g.profile == before.id) && !replay;
            assert_eq!(
                moved, granted_here,
                "INV-3: generation moves exactly when this command granted, profile {}, {ctx}",
                before.id
            );
        }
        if let (Some(g), false) = (grant, replay) {
            let prev = pre.profile(g.profile).expect("granted profile").generation;
            assert_eq!(
                g.generation,
                prev.successor(),
                "INV-3: granted = previous + 1, {ctx}"
            );
            assert!(
                self.model
                    .granted
                    .entry(g.profile)
                    .or_default()
                    .insert(g.generation),
                "INV-3: generation {} of profile {} granted twice, {ctx}",
                g.generation,
                g.profile
            );
        }

        // INV-6: a fenced operation succeeds only with the profile's current active token.
        let token = match command {
            Command::RenewLease(RenewLease { fence, .. })
            | Command::ReleaseLease(ReleaseLease { fence })
            | Command::FenceLease(FenceLease { fence, .. })
            | Command::CommitCapsule(CommitCapsule { fence, .. })
            | Command::GracefulTakeover(GracefulTakeover { fence, .. }) => Some(*fence),
            _ => None,
        };
        if let (Some(t), true, false) = (token, response.is_ok(), replay) {
            let p = self
                .model
                .profile_idx(t.profile)
                .expect("INV-6: known profile");
            let (live, generation) = pre_live[p];
            assert!(
                live == Some(t.lease.get()) && generation == t.generation.get(),
                "INV-6: {} accepted a token that is not the current active lease, {ctx}",
                command.name()
            );
        }

        // INV-10: tasks move only along legal transitions; terminal states are final.
        for before in pre.tasks(None) {
            let after = post.task(before.id).expect("tasks are never removed");
            if after.state != before.state {
                assert!(
                    !is_terminal(before.state),
                    "INV-10: terminal task {} moved {} -> {}, {ctx}",
                    before.id,
                    before.state,
                    after.state
                );
                assert!(
                    lifecycle_allows(before.state, after.state),
                    "INV-10: task {} moved {} -> {} outside the lifecycle, {ctx}",
                    before.id,
                    before.state,
                    after.state
                );
            }
        }
    }

    /// Every view the model keeps equals the core's.
    fn check_agreement(&self, ctx: &str) {
        let (core, model) = (&self.core, &self.model);
        assert_eq!(
            core.clock_ms(),
            model.now,
            "clock: now = max(prev now, at_ms), {ctx}"
        );

        let mut active_per_profile: BTreeMap<ProfileId, u32> = BTreeMap::new();
        let mut slots_per_project: BTreeMap<String, u32> = BTreeMap::new();
        for l in core.leases() {
            if l.state == LeaseState::Active {
                *active_per_profile.entry(l.profile).or_default() += 1;
            }
            if l.state.holds_slot() {
                *slots_per_project.entry(l.project.to_string()).or_default() += 1;
            }
        }
        for (p, n) in &active_per_profile {
            assert!(*n <= 1, "INV-4: profile {p} has {n} active leases, {ctx}");
        }

        for (i, mp) in model.projects.iter().enumerate() {
            let cp = core.project(&tenant(), &project_id(i)).expect("project");
            let counted = slots_per_project
                .get(cp.project.as_str())
                .copied()
                .unwrap_or(0);
            let expected = model.slots(i);
            assert!(
                counted <= cp.max_active && cp.slots_held <= cp.max_active,
                "INV-5: project {i} holds {counted} slots, max_active {}, {ctx}",
                cp.max_active
            );
            assert_eq!(
                (cp.slots_held, counted),
                (expected, expected),
                "INV-5: slots held in project {i} (counter, recount) vs model, {ctx}"
            );
            assert_eq!(cp.max_active, mp.max_active);
        }

        for (i, mp) in model.profiles.iter().enumerate() {
            let cp = core.profile(profile_id(i)).expect("profile");
            assert_eq!(
                cp.generation.get(),
                mp.generation,
                "INV-3: generation of profile {i}, {ctx}"
            );
            assert_eq!(
                cp.live_lease.map(LeaseId::get),
                mp.live,
                "INV-4: live lease of profile {i}, {ctx}"
            );
            assert_eq!(
                cp.capsule_head.map(|h| (h.sequence, h.digest)),
                mp.head,
                "INV-7: capsule chain head of profile {i}, {ctx}"
            );
            if let Some(last) = cp.capsules.back() {
                assert!(last.verify(), "INV-7: head capsule verifies, {ctx}");
                assert_eq!(
                    last.digest,
                    capsule_digest(
                        i,
                        last.generation.get(),
                        &CapsuleDraft {
                            sequence: last.sequence,
                            previous: last.previous,
                            schema_version: last.schema_version,
                            payload: last.payload.clone(),
                            expected_digest: None,
                        }
                    ),
                    "INV-7: digest is SHA-256 of the canonical encoding, {ctx}"
                );
            }
            let fenced: BTreeSet<u64> = model
                .leases
                .values()
                .filter(|l| l.profile == i && l.state == MLeaseState::Fenced)
                .map(|l| l.id)
                .collect();
            assert_eq!(
                cp.fenced_unreaped
                    .iter()
                    .map(|l| l.get())
                    .collect::<BTreeSet<_>>(),
                fenced,
                "INV-5/INV-9: fenced, unreaped leases of profile {i}, {ctx}"
            );
        }

        assert_eq!(
            core.leases().count(),
            model.leases.len(),
            "leases kept (terminal ones pruned past {TERMINAL_LEASES_PER_PROFILE_KEPT}), {ctx}"
        );
        for ml in model.leases.values() {
            let cl = core
                .lease(lease_id(ml.id))
                .unwrap_or_else(|| panic!("lease {} missing from the core, {ctx}", ml.id));
            assert_eq!(
                (
                    cl.profile,
                    cl.generation.get(),
                    cl.expires_at_ms,
                    MLeaseState::of(&cl.state)
                ),
                (
                    profile_id(ml.profile),
                    ml.generation,
                    ml.expires_at,
                    ml.state
                ),
                "INV-4/INV-9: lease {} (profile, generation, expiry, state), {ctx}",
                ml.id
            );
        }

        assert_eq!(
            core.tasks(None).count(),
            model.tasks.len(),
            "INV-10: task count, {ctx}"
        );
        for (i, mt) in model.tasks.iter().enumerate() {
            let ct = core.task(task_id(i)).expect("task");
            assert_eq!(
                (
                    ct.state,
                    ct.worker.as_ref().map(|w| w.to_string()),
                    ct.exit_code,
                    ct.cancel_requested.is_some(),
                    ct.attempt
                ),
                (
                    mt.state,
                    mt.worker.map(|w| WORKERS[w].to_string()),
                    mt.exit_code,
                    mt.cancel_requested,
                    1
                ),
                "INV-10: task {} (state, worker, exit code, cancel requested, attempt), {ctx}",
                i + 1
            );
        }
        for t in core.tasks(Some(TaskState::Completed)) {
            assert!(
                t.spec
                    .lifecycle
                    .is_success_exit_code(t.exit_code.unwrap_or(-1)),
                "INV-10: task {} is COMPLETED with exit code {:?}, not a success code, {ctx}",
                t.id,
                t.exit_code
            );
        }
        assert_eq!(
            core.pending_queue().collect::<Vec<_>>(),
            model.pending_queue(),
            "INV-10: pending queue order (priority, then submission), {ctx}"
        );
        for (w, _) in WORKERS.iter().enumerate() {
            let cw = core.worker(&worker_id(w)).expect("worker");
            assert_eq!(
                cw.tasks.len(),
                model.assigned_count(w),
                "INV-10: tasks assigned to worker {w}, {ctx}"
            );
        }
    }
}

fn invariant_of(command: &Command) -> &'static str {
    match command {
        Command::AcquireLease(_) => "INV-3/INV-4/INV-5 (acquire)",
        Command::RenewLease(_) | Command::ReleaseLease(_) | Command::FenceLease(_) => {
            "INV-6 (fenced lease operation)"
        }
        Command::RecordReapEvidence(_) => "INV-5/INV-9 (reap evidence)",
        Command::GracefulTakeover(_) => "INV-8/INV-7/INV-6 (graceful takeover)",
        Command::CrashTakeover(_) => "INV-9 (crash takeover)",
        Command::CommitCapsule(_) => "INV-7/INV-6 (capsule commit)",
        Command::Sweep => "INV-5/INV-9 (sweep: expiry by command time)",
        _ => "INV-10 (task lifecycle)",
    }
}

fn check_response(expect: &Expect, got: &Response, ctx: &str, command: &Command) {
    let inv = invariant_of(command);
    match (expect, got) {
        (Expect::Replay(first), _) => assert_eq!(
            got, first,
            "INV-11: an idempotent retry must return the identical first Response, {ctx}"
        ),
        (Expect::Rejected(Rej::Kind("IdempotencyKeyReused")), _) => assert_eq!(
            got,
            &Response::Rejected(Rejection::IdempotencyKeyReused),
            "INV-11: a key reused for another command is refused, {ctx}"
        ),
        (Expect::CompletedWithNewExitCode(_), Response::Ok(o)) => assert_eq!(
            o,
            &Outcome::TransitionRecorded {
                state: TaskState::Completed
            },
            "INV-10: {ctx}"
        ),
        (Expect::CompletedWithNewExitCode(_), Response::Rejected(r)) => assert_eq!(
            kind(r),
            "IllegalTransition",
            "INV-10: a COMPLETED report with a new exit code may only be refused as illegal, {ctx}"
        ),
        (Expect::Ok(o), Response::Ok(g)) => {
            assert_eq!(g, o, "{inv}: core and model disagree on the outcome, {ctx}")
        }
        (Expect::Assigned(v), Response::Ok(Outcome::TasksAssigned { results })) => {
            let got: Vec<(TaskId, Result<(), String>)> = results
                .iter()
                .map(|r| (r.task, r.result.as_ref().map(|_| ()).map_err(kind)))
                .collect();
            let want: Vec<(TaskId, Result<(), String>)> = v
                .iter()
                .map(|(t, r)| (*t, r.map_err(str::to_string)))
                .collect();
            assert_eq!(got, want, "INV-10: assignment results, {ctx}");
        }
        (Expect::Rejected(Rej::Kind(k)), Response::Rejected(r)) => assert_eq!(
            kind(r),
            *k,
            "{inv}: core refused differently than the model, {ctx}\ncore: {r}\ncommand {command:#?}"
        ),
        (Expect::Rejected(Rej::Exact(e)), Response::Rejected(r)) => assert_eq!(
            r, e,
            "{inv}: core refused differently than the model, {ctx}\ncommand {command:#?}"
        ),
        _ => panic!(
            "{inv}: core and model disagree on ok vs rejected, {ctx}\nmodel: {expect:?}\n\
             core: {got:?}\ncommand {command:#?}"
        ),
    }
}

fn run(u: &Universe, steps: &[Step], checks: Checks) {
    let mut r = Run::new(u, checks);
    for (i, s) in steps.iter().enumerate() {
        r.step(i, s);
    }
    if let Some(replica) = &r.replica {
        assert_eq!(
            state_digest(replica),
            state_digest(&r.core),
            "INV-12: final state digests of replicas agree"
        );
        let back = decode_snapshot(&encode_snapshot(&r.core)).expect("INV-12: snapshot decodes");
        assert_eq!(
            state_digest(&back),
            state_digest(&r.core),
            "INV-12: snapshot round trip keeps the digest"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Generations (INV-3), the single writer (INV-4), capacity (INV-5) and fencing (INV-6),
    /// with expiry, reap evidence and both takeovers driving leases through every state.
    #[test]
    fn inv_03_04_05_06_leases_agree_with_model(u in universe(), s in steps(LEASES)) {
        run(&u, &s, Checks::default());
    }

    /// Capsule chains (INV-7) through commits and graceful takeovers (INV-8).
    #[test]
    fn inv_07_capsule_chain_agrees_with_model(u in universe(), s in steps(CAPSULES)) {
        run(&u, &s, Checks::default());
    }

    /// The task lifecycle (INV-10): submission, assignment, worker reports, cancellation.
    #[test]
    fn inv_10_task_lifecycle_agrees_with_model(u in universe(), s in steps(TASKS)) {
        run(&u, &s, Checks::default());
    }

    /// Idempotent retries (INV-11): same key and command replays the first answer and changes
    /// nothing; same key on another command is refused.
    #[test]
    fn inv_11_idempotent_retries_replay_first_answer(u in universe(), s in steps(IDEMPOTENT)) {
        run(&u, &s, Checks::default());
    }

    /// Determinism (INV-12): a second replica, restored from its own snapshot before every
    /// command, answers alike and holds the same digest; every envelope and response
    /// round-trips through the log codec.
    #[test]
    fn inv_12_replicas_agree_and_snapshots_round_trip(u in universe(), s in steps(REPLICAS)) {
        run(&u, &s, Checks { replicas: true });
    }
}

/// INV-10, found by the model test: a worker reports COMPLETING -> COMPLETED with an exit code
/// other than the success code it recorded on leaving RUNNING. The report must be refused, or
/// the task must still end with a success exit code; a COMPLETED task with exit code 1 breaks
/// the invariant `check_invariants` enforces.
#[test]
fn inv_10_completed_task_keeps_a_success_exit_code() {
    let mut s = State::new();
    let mut apply = |command: Command| {
        s.apply(CommandEnvelope {
            at_ms: SETUP_AT_MS,
            idempotency_key: None,
            command,
        })
    };
    let w = worker_id(0);
    assert!(apply(Command::RegisterWorker(RegisterWorker {
        worker: w.clone(),
        address: "10.0.0.0:7000".into(),
        runtimes: vec![RuntimeKind::Process],
        capacity: WORKER_CAPACITY,
        labels: BTreeMap::new(),
        heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS,
    }))
    .is_ok());
    assert!(apply(Command::SubmitTask(SubmitTask {
        spec: Box::new(specs()[0].clone()),
    }))
    .is_ok());
    assert!(apply(Command::AssignTasks(AssignTasks {
        assignments: vec![Assignment {
            task: task_id(0),
            worker: w.clone(),
        }],
    }))
    .is_ok());
    let mut report = |from, to, exit_code| {
        apply(Command::ReportTransition(ReportTransition {
            task: task_id(0),
            worker: w.clone(),
            attempt: 1,
            from,
            to,
            detail: TransitionDetail {
                exit_code,
                error: None,
                artifacts: Vec::new(),
            },
        }))
    };
    use TaskState::*;
    for (from, to, exit) in [
        (Staging, Provisioning, None),
        (Provisioning, Ready, None),
        (Ready, Running, None),
        (Running, Completing, Some(0)),
    ] {
        assert!(report(from, to, exit).is_ok(), "{from} -> {to}");
    }
    let last = report(Completing, Completed, Some(1));
    let task = s.task(task_id(0)).expect("task");
    assert!(
        !last.is_ok() || task.exit_code == Some(0),
        "INV-10: COMPLETED accepted with exit code {:?}: {last:?}",
        task.exit_code
    );
    assert_eq!(s.check_invariants(), Ok(()));
}
