//! Running a sequence on the core and the model side by side, and checking them after every
//! step.

use crate::*;
use squadron_core::access::Subject;

/// INV-12: how often (in steps) the replica is reinstalled from its snapshot.
pub(crate) const SNAPSHOT_EVERY: usize = 4;

/// What one test checks beyond the model.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Checks {
    /// INV-12: a second replica, reinstalled from its own snapshot before every command,
    /// applies the same envelopes and must stay byte-identical; snapshots round-trip.
    pub(crate) replicas: bool,
}

/// The public views of a state that the "refused means unchanged" check compares when the
/// idempotency ledger legitimately differs.
#[derive(Debug, PartialEq)]
pub(crate) struct Views {
    pub(crate) clock: u64,
    pub(crate) projects: Vec<squadron_core::project::Project>,
    pub(crate) profiles: Vec<squadron_core::profile::AgentProfile>,
    pub(crate) leases: Vec<squadron_core::lease::RuntimeLease>,
    pub(crate) mailboxes: Vec<squadron_core::mailbox::Mailbox>,
    pub(crate) tasks: Vec<squadron_core::task::Task>,
    pub(crate) pending: Vec<TaskId>,
    pub(crate) workers: Vec<squadron_core::worker::Worker>,
}

pub(crate) fn views(s: &State) -> Views {
    Views {
        clock: s.clock_ms(),
        projects: s.projects().cloned().collect(),
        profiles: s.profiles().cloned().collect(),
        leases: s.leases().cloned().collect(),
        mailboxes: s
            .profiles()
            .filter_map(|p| s.mailbox(p.id).cloned())
            .collect(),
        tasks: s.tasks(None).map(|t| (*t).clone()).collect(),
        pending: s.pending_queue().collect(),
        workers: s.workers().cloned().collect(),
    }
}

/// One command the core applied, as the per-step checks see it.
pub(crate) struct Applied<'a> {
    /// The core before the command.
    pub(crate) pre: &'a State,
    pub(crate) command: &'a Command,
    pub(crate) response: &'a Response,
    pub(crate) at_ms: u64,
    /// The time the core applied it at: `max(clock, at_ms)`.
    pub(crate) now: u64,
    pub(crate) ctx: &'a str,
}

pub(crate) struct Run {
    pub(crate) core: State,
    pub(crate) model: Model,
    pub(crate) replica: Option<State>,
    pub(crate) checks: Checks,
    pub(crate) next_key: usize,
}

impl Run {
    pub(crate) fn new(u: &Universe, checks: Checks) -> Self {
        let setup = setup_commands(u);
        let mut core = State::new();
        let mut replica = checks.replicas.then(State::new);
        for command in setup {
            let env = CommandEnvelope {
                subject: Subject::Legacy,
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
        let model = Model::for_universe(u);
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

    pub(crate) fn step(&mut self, i: usize, step: &Step) {
        let (env, now) = self.next_envelope(step);
        let (at_ms, key, command) = (env.at_ms, env.idempotency_key.clone(), env.command.clone());
        let ctx = format!("step {i}: {} at {at_ms} ms (key {key:?})", command.name());
        self.check_before_apply(&env, now, &ctx);

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
        let applied = Applied {
            pre: &pre,
            command: &command,
            response: &response,
            at_ms,
            now,
            ctx: &ctx,
        };

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
            self.model.tasks[*t].agent = None;
        }

        // INV-11: a keyed first attempt records exactly its answer.
        if let (Some(k), None) = (&key, &prior) {
            self.check_first_answer_recorded(&applied, k);
        }

        // A refused command, a replay and a reused key change nothing but the clock (and a
        // refused first attempt its ledger record, checked above).
        let replay = matches!(expect, Expect::Replay(_));
        self.check_step(&applied, &pre_live, replay);
        self.check_agreement(&ctx);

        let unchanged = matches!(expect, Expect::Replay(_) | Expect::Rejected(_))
            || (matches!(expect, Expect::CompletedWithNewExitCode(_)) && !response.is_ok());
        if unchanged {
            self.check_unchanged(&applied, key.is_some() && prior.is_none());
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

    /// The envelope a step proposes, and the time the core will apply it at.
    fn next_envelope(&mut self, step: &Step) -> (CommandEnvelope, u64) {
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
            subject: Subject::Legacy,
            at_ms,
            idempotency_key: key,
            command,
        };
        (env, now)
    }

    /// What holds before the core applies `env`: the log encoding round-trips it, and the
    /// leader's idle-sweep shortcut agrees with the model.
    fn check_before_apply(&self, env: &CommandEnvelope, now: u64, ctx: &str) {
        // The log encoding round-trips every envelope.
        let encoded = encode_command(env);
        assert_eq!(
            decode_command(&encoded).as_ref(),
            Ok(env),
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
            self.core.sweep_due(env.at_ms, 0),
            expired_active,
            "INV-5/INV-9: sweep_due judges expiry by command time, {ctx}"
        );
    }

    /// INV-11: a keyed first attempt records exactly its answer.
    fn check_first_answer_recorded(&mut self, a: &Applied<'_>, key: &IdempotencyKey) {
        let ctx = a.ctx;
        let mut ledger = a.pre.idempotency().clone();
        ledger.record(
            key.clone(),
            command_fingerprint(&Subject::Legacy, a.command),
            a.response.clone(),
            a.now,
        );
        assert!(
            self.core.idempotency() == &ledger,
            "INV-11: the ledger must gain exactly this answer, {ctx}"
        );
        self.model.ledger.push(LedgerEntry {
            key: key.clone(),
            command: a.command.clone(),
            response: a.response.clone(),
        });
    }

    /// A refused command, a replay and a reused key change nothing but the clock; a refused
    /// keyed first attempt (`first_keyed`) also its ledger record.
    fn check_unchanged(&self, a: &Applied<'_>, first_keyed: bool) {
        let (ctx, response) = (a.ctx, a.response);
        let mut expected = a.pre.clone();
        assert!(
            !expected.apply(noop(a.at_ms)).is_ok(),
            "the clock-moving no-op must be refused"
        );
        if first_keyed {
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

    /// INV-12: the replica applies the same envelope, answers alike and holds byte-identical
    /// state (the snapshot encoding is what `state_digest` hashes). At a `restart`, it is
    /// reinstalled from its own snapshot, which must decode to the same state, and the
    /// digests are compared.
    pub(crate) fn check_replica(
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

    /// Per-step checks that compare the state before and after one command; a `replay`
    /// changed nothing.
    pub(crate) fn check_step(
        &mut self,
        a: &Applied<'_>,
        pre_live: &[(Option<u64>, u64)],
        replay: bool,
    ) {
        self.check_generations(a, replay);
        self.check_fencing(a, pre_live, replay);
        self.check_task_moves(a);
    }

    fn check_generations(&mut self, a: &Applied<'_>, replay: bool) {
        let (pre, response, ctx) = (a.pre, a.response, a.ctx);
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
    }

    fn check_fencing(&self, a: &Applied<'_>, pre_live: &[(Option<u64>, u64)], replay: bool) {
        let (command, response, ctx) = (a.command, a.response, a.ctx);
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
    }

    fn check_task_moves(&self, a: &Applied<'_>) {
        let (pre, post, ctx) = (a.pre, &self.core, a.ctx);
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
    pub(crate) fn check_agreement(&self, ctx: &str) {
        let (core, model) = (&self.core, &self.model);
        assert_eq!(
            core.clock_ms(),
            model.now,
            "clock: now = max(prev now, at_ms), {ctx}"
        );
        self.agree_on_slots(ctx);
        self.agree_on_profiles(ctx);
        self.agree_on_leases(ctx);
        self.agree_on_tasks(ctx);
    }

    /// INV-4 and INV-5: one active lease per profile; slots counted, recounted and modelled
    /// alike.
    fn agree_on_slots(&self, ctx: &str) {
        let (core, model) = (&self.core, &self.model);
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
    }

    /// INV-3, INV-4, INV-7 and INV-9 per profile: generation, live lease, capsule head,
    /// fenced leases.
    fn agree_on_profiles(&self, ctx: &str) {
        let (core, model) = (&self.core, &self.model);
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
    }

    /// Every lease the model keeps, as the core keeps it.
    fn agree_on_leases(&self, ctx: &str) {
        let (core, model) = (&self.core, &self.model);
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
    }

    /// INV-10: every task, the success codes of completed ones, the queue, assignments.
    fn agree_on_tasks(&self, ctx: &str) {
        let (core, model) = (&self.core, &self.model);
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
            let agent = core.agent_session(task_id(i)).map(|s| {
                assert_eq!(s.attempt, 1, "agent of task {}, {ctx}", i + 1);
                (s.registered_at_ms, s.last_seen_ms, s.check_ins, s.usage)
            });
            let modelled = mt
                .agent
                .map(|a| (a.registered_at_ms, a.last_seen_ms, a.check_ins, a.usage));
            assert_eq!(
                agent,
                modelled,
                "the agent session of task {}, {ctx}",
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

/// The commands that build a universe: its workers, projects with their sandboxes, profiles.
fn setup_commands(u: &Universe) -> Vec<Command> {
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
    setup
}

impl Model {
    /// The model of a universe just set up.
    fn for_universe(u: &Universe) -> Self {
        Model {
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
        }
    }
}

pub(crate) fn invariant_of(command: &Command) -> &'static str {
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

pub(crate) fn check_response(expect: &Expect, got: &Response, ctx: &str, command: &Command) {
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

pub(crate) fn run(u: &Universe, steps: &[Step], checks: Checks) {
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
