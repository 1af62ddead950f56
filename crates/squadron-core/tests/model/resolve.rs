//! Turning abstract operations into concrete commands against the model's current view.

use crate::*;

impl Model {
    pub(crate) fn n_profiles(&self) -> usize {
        self.profiles.len()
    }

    /// The first profile, from `p` on, that satisfies `pred`; `p` itself when none does.
    pub(crate) fn pick(&self, p: usize, pred: impl Fn(&Self, usize) -> bool) -> usize {
        let n = self.n_profiles();
        (0..n)
            .map(|k| (p + k) % n)
            .find(|q| pred(self, *q))
            .unwrap_or(p % n)
    }

    pub(crate) fn pick_live(&self, p: usize, tok: Tok) -> usize {
        match tok {
            Tok::Own => p % self.n_profiles(),
            _ => self.pick(p, |m, q| m.profiles[q].live.is_some()),
        }
    }

    pub(crate) fn token(&self, p: usize, tok: Tok) -> FencingToken {
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

    pub(crate) fn target(&self, p: usize, target: Target) -> (usize, u64) {
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

    pub(crate) fn evidence(&self, lease: u64, ev: Ev, now: u64) -> ReapEvidence {
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

    pub(crate) fn holder(&self, p: usize, next: Next) -> LeaseHolder {
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

    pub(crate) fn next_holder(&self, p: usize, next: Next) -> NextHolder {
        NextHolder {
            provider: next.provider,
            holder: self.holder(p, next),
            ttl_ms: next.ttl,
        }
    }

    pub(crate) fn draft(&self, p: usize, chain: Chain, verify: Verify, seed: u8) -> CapsuleDraft {
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
    pub(crate) fn task_sel(&self, t: usize, raw: bool, pred: impl Fn(&MTask) -> bool) -> TaskId {
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
    pub(crate) fn resolve(&self, op: &Op, now: u64) -> Command {
        match op {
            Op::Submit { .. }
            | Op::Assign { .. }
            | Op::Report { .. }
            | Op::Cancel { .. }
            | Op::CheckIn { .. } => self.resolve_task_op(op),
            _ => self.resolve_lease_op(op, now),
        }
    }

    /// An idle profile (or any, unless `idle`), with the generation `gen` says.
    fn resolve_acquire(&self, p: usize, idle: bool, gen: Gen, next: Next) -> Command {
        let p = if idle {
            self.pick(p, |m, q| {
                m.profiles[q].live.is_none() && !m.unreaped_current(q)
            })
        } else {
            p % self.n_profiles()
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
            holder: self.holder(p, next),
            ttl_ms: next.ttl,
        })
    }

    /// Leases, takeovers and capsule commits.
    fn resolve_lease_op(&self, op: &Op, now: u64) -> Command {
        match op {
            Op::Acquire { p, idle, gen, next } => self.resolve_acquire(*p, *idle, *gen, *next),
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
            _ => unreachable!("a task operation"),
        }
    }

    /// Task submission, assignment, reports and cancellation.
    fn resolve_task_op(&self, op: &Op) -> Command {
        match op {
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
            Op::CheckIn {
                t,
                raw,
                attempt_ok,
                usage,
            } => Command::AgentCheckIn(AgentCheckIn {
                task: self.task_sel(*t, *raw, |m| has_sandbox(m.state)),
                attempt: if *attempt_ok { 1 } else { 2 },
                usage: usage.then_some(SandboxUsage {
                    cpu_usec: 1_500,
                    memory_bytes: 4_096,
                    disk_bytes: 100,
                }),
                exit_code: None,
            }),
            Op::Cancel { t } => Command::CancelTask(CancelTask {
                task: self.task_sel(*t, true, |_| true),
                reason: "operator changed their mind".into(),
            }),
            _ => unreachable!("a lease operation"),
        }
    }
}
