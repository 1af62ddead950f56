//! State-machine tests: a fixture, then one file per concern. Invariant tests are named after
//! the invariant id they would catch breaking.

mod access;
mod agents;
mod bad_input;
mod batching;
mod credential_egress;
mod credentials;
mod determinism;
mod invariants_01_06;
mod invariants_07_09;
mod invariants_10_14;
mod mailboxes_and_scheduling;
mod profile_credentials;
mod project_tasks;
mod retention;
mod task_records;
mod worker_grace;
mod worker_policy;

use crate::access::Subject;
use std::collections::BTreeMap;

use crate::capsule::{CapsuleDraft, CapsulePayload};
use crate::command::*;
use crate::ids::{
    Digest, Generation, IdempotencyKey, ProfileId, ProfileKey, ProjectId, TaskId, TenantId,
    WorkerId,
};
use crate::lease::{EvidenceSource, FencingToken, LeaseHolder, ReapEvidence};
use crate::manifest::{parse_manifest_yaml, RuntimeKind, TaskSpec};
use crate::provider::Provider;
use crate::rejection::Rejection;
use crate::response::{LeaseGrant, Outcome, Response};
use crate::state::State;
use crate::task::TaskState;

pub(crate) const TTL: u64 = 10_000;

pub(crate) fn tenant() -> TenantId {
    TenantId::new("acme").unwrap()
}

pub(crate) fn project() -> ProjectId {
    ProjectId::new("web").unwrap()
}

pub(crate) fn worker() -> WorkerId {
    WorkerId::new("w1").unwrap()
}

pub(crate) fn holder() -> LeaseHolder {
    holder_on(worker())
}

pub(crate) fn holder_on(worker: WorkerId) -> LeaseHolder {
    LeaseHolder {
        worker,
        process: "pid 100".into(),
        cgroup: Some("squadron/acme/web/leaf".into()),
    }
}

pub(crate) fn evidence(grant: &LeaseGrant, at: u64) -> ReapEvidence {
    ReapEvidence {
        lease: grant.lease,
        generation: grant.generation,
        cgroup: "squadron/acme/web/leaf".into(),
        populated: false,
        observed_at_ms: at,
        source: EvidenceSource::CgroupEvents,
    }
}

pub(crate) fn token(grant: &LeaseGrant) -> FencingToken {
    FencingToken {
        profile: grant.profile,
        lease: grant.lease,
        generation: grant.generation,
    }
}

pub(crate) fn payload(note: &str) -> CapsulePayload {
    CapsulePayload {
        task_state: note.into(),
        decisions: vec!["keep the public api".into()],
        pending_work: vec!["tests".into()],
        repository_revision: "abc1234".into(),
        mailbox_cursor: 0,
        context_ref: "ctx-1".into(),
    }
}

pub(crate) fn draft(sequence: u64, previous: Option<Digest>, note: &str) -> CapsuleDraft {
    CapsuleDraft {
        sequence,
        previous,
        schema_version: 1,
        payload: payload(note),
        expected_digest: None,
    }
}

pub(crate) fn next(provider: Provider) -> NextHolder {
    NextHolder {
        provider,
        holder: holder(),
        ttl_ms: TTL,
    }
}

/// A minimal manifest plus `extra` YAML; `extra` may bring its own `metadata`.
pub(crate) fn spec(extra: &str) -> TaskSpec {
    let metadata = if extra.contains("metadata:") {
        ""
    } else {
        "metadata:\n  name: t\n"
    };
    parse_manifest_yaml(&format!(
        "version: \"1\"\nkind: Task\n{metadata}repository:\n  url: file:///srv/repo\n\
         agent:\n  prompt: do it\n{extra}"
    ))
    .unwrap()
}

/// The fixture's worker reports `from -> to` for the task's current attempt.
pub(crate) fn report(
    fx: &mut Fx,
    task: TaskId,
    from: TaskState,
    to: TaskState,
    exit: Option<i32>,
) -> Response {
    let attempt = fx.state.task(task).unwrap().attempt;
    fx.apply(Command::ReportTransition(ReportTransition {
        task,
        worker: worker(),
        attempt,
        from,
        to,
        detail: TransitionDetail {
            exit_code: exit,
            ..TransitionDetail::default()
        },
    }))
}

/// How long the fixture's workers may stay silent before they are lost.
pub(crate) const WORKER_TTL: u64 = 15_000;

/// A state with one worker (process runtime) and one project whose sandbox is on it.
pub(crate) struct Fx {
    pub state: State,
    pub now: u64,
}

impl Fx {
    pub fn new() -> Self {
        let mut fx = Self {
            state: State::new(),
            now: 1_000,
        };
        fx.register_worker(worker());
        fx.ok(Command::CreateProject(CreateProject {
            tenant: tenant(),
            project: project(),
            max_profiles: None,
            max_active: None,
        }));
        fx.ok(Command::AttachSandbox(AttachSandbox {
            tenant: tenant(),
            project: project(),
            worker: worker(),
            runtime: RuntimeKind::Process,
            sandbox_ref: "sandbox-1".into(),
        }));
        fx
    }

    pub fn register_worker(&mut self, id: WorkerId) {
        self.ok(Command::RegisterWorker(RegisterWorker {
            worker: id,
            address: "127.0.0.1:9000".into(),
            runtimes: vec![RuntimeKind::Process, RuntimeKind::Docker],
            capacity: 2,
            labels: BTreeMap::new(),
            heartbeat_interval_ms: WORKER_TTL / 3,
        }));
    }

    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
    }

    pub fn apply(&mut self, command: Command) -> Response {
        let r = self.state.apply(CommandEnvelope {
            subject: Subject::Legacy,
            at_ms: self.now,
            idempotency_key: None,
            command,
        });
        self.state
            .check_invariants()
            .unwrap_or_else(|e| panic!("invariant broken: {e}"));
        r
    }

    /// Applies a command as `subject` asked for it.
    pub fn apply_as(&mut self, subject: &Subject, command: Command) -> Response {
        let r = self.state.apply(CommandEnvelope {
            subject: subject.clone(),
            at_ms: self.now,
            idempotency_key: None,
            command,
        });
        self.state
            .check_invariants()
            .unwrap_or_else(|e| panic!("invariant broken: {e}"));
        r
    }

    #[track_caller]
    pub fn ok_as(&mut self, subject: &Subject, command: Command) -> Outcome {
        match self.apply_as(subject, command) {
            Response::Ok(o) => o,
            Response::Rejected(r) => panic!("expected success, got {r:?}"),
        }
    }

    /// Like [`Fx::rejected`], as `subject`.
    #[track_caller]
    pub fn rejected_as(&mut self, subject: &Subject, command: Command) -> Rejection {
        let mut before = self.state.clone();
        let r = match self.apply_as(subject, command) {
            Response::Rejected(r) => r,
            Response::Ok(o) => panic!("expected a rejection, got {o:?}"),
        };
        before.clock_ms = self.state.clock_ms;
        assert!(before == self.state, "a rejected command changed the state");
        r
    }

    pub fn apply_keyed(&mut self, key: &str, command: Command) -> Response {
        let r = self.state.apply(CommandEnvelope {
            subject: Subject::Legacy,
            at_ms: self.now,
            idempotency_key: Some(IdempotencyKey::new(key).unwrap()),
            command,
        });
        self.state.check_invariants().unwrap();
        r
    }

    #[track_caller]
    pub fn ok(&mut self, command: Command) -> Outcome {
        match self.apply(command) {
            Response::Ok(o) => o,
            Response::Rejected(r) => panic!("expected success, got {r:?}"),
        }
    }

    /// Applies a command that must be refused and checks that it changed nothing but the
    /// clock.
    #[track_caller]
    pub fn rejected(&mut self, command: Command) -> Rejection {
        let mut before = self.state.clone();
        let r = match self.apply(command) {
            Response::Rejected(r) => r,
            Response::Ok(o) => panic!("expected a rejection, got {o:?}"),
        };
        before.clock_ms = self.state.clock_ms;
        assert!(before == self.state, "a rejected command changed the state");
        r
    }

    pub fn profile(&mut self, key: &str) -> ProfileId {
        self.profile_with(key, vec![Provider::Codex, Provider::Claude])
    }

    pub fn profile_with(&mut self, key: &str, providers: Vec<Provider>) -> ProfileId {
        match self.ok(Command::CreateProfile(CreateProfile {
            tenant: tenant(),
            project: project(),
            key: ProfileKey::new(key).unwrap(),
            providers,
            context_ref: None,
        })) {
            Outcome::ProfileCreated { profile } => profile,
            o => panic!("unexpected {o:?}"),
        }
    }

    pub fn acquire_cmd(&self, profile: ProfileId, expected: u64) -> Command {
        Command::AcquireLease(AcquireLease {
            profile,
            expected_generation: Generation::new(expected),
            provider: Provider::Codex,
            holder: holder(),
            ttl_ms: TTL,
        })
    }

    #[track_caller]
    pub fn acquire(&mut self, profile: ProfileId) -> LeaseGrant {
        let expected = self.state.profile(profile).unwrap().generation.get();
        match self.ok(self.acquire_cmd(profile, expected)) {
            Outcome::LeaseGranted(g) => g,
            o => panic!("unexpected {o:?}"),
        }
    }

    pub fn slots_held(&self) -> u32 {
        self.state
            .project(&tenant(), &project())
            .unwrap()
            .slots_held
    }

    pub fn submit(&mut self, extra: &str) -> TaskId {
        match self.ok(Command::SubmitTask(SubmitTask {
            spec: Box::new(spec(extra)),
        })) {
            Outcome::TaskSubmitted { task } => task,
            o => panic!("unexpected {o:?}"),
        }
    }
}
