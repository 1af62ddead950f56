//! Mailboxes, roster deltas and the scheduling function.

use super::*;
use crate::access::Subject;
use crate::command::Assignment;
use crate::limits::MAILBOX_MESSAGES_MAX;
use crate::mailbox::{MessageKind, MessagePayload, MessageSender};
use crate::roster::RosterStatus;
use crate::scheduler::schedule;
use crate::task::TaskState;

fn post(to: ProfileId, kind: MessageKind, body: &str) -> Command {
    Command::PostMessage(PostMessage {
        to,
        sender: MessageSender::Operator("alice".into()),
        kind,
        body: body.into(),
    })
}

#[test]
fn mailbox_sequence_is_monotonic_and_ack_is_fenced() {
    let mut fx = Fx::new();
    let a = fx.profile("a");
    let g = fx.acquire(a);
    let s1 = fx.ok(post(a, MessageKind::Handoff, "review auth.rs"));
    let s2 = fx.ok(post(a, MessageKind::Note, "tests are red"));
    assert_eq!(s1, Outcome::MessagePosted { seq: 1 });
    assert_eq!(s2, Outcome::MessagePosted { seq: 2 });
    let r = fx.rejected(Command::AckMessages(AckMessages {
        fence: token(&g),
        through_seq: 3,
    }));
    assert_eq!(r, Rejection::AckBeyondHead { last_seq: 2 });
    fx.ok(Command::AckMessages(AckMessages {
        fence: token(&g),
        through_seq: 1,
    }));
    let m = fx.state.mailbox(a).unwrap();
    assert_eq!(m.acked_through, 1);
    assert_eq!(m.messages.keys().copied().collect::<Vec<_>>(), vec![2]);
    // Acknowledged messages stay acknowledged; the sequence never goes back.
    fx.ok(Command::AckMessages(AckMessages {
        fence: token(&g),
        through_seq: 0,
    }));
    assert_eq!(fx.state.mailbox(a).unwrap().acked_through, 1);
    assert_eq!(
        fx.ok(post(a, MessageKind::Note, "more")),
        Outcome::MessagePosted { seq: 3 }
    );
}

#[test]
fn lifecycle_noise_is_not_relayed() {
    let mut fx = Fx::new();
    let a = fx.profile("a");
    assert_eq!(
        fx.rejected(post(a, MessageKind::Handoff, "Waiting for first tool...")),
        Rejection::LifecycleNoise
    );
    assert_eq!(
        fx.rejected(post(a, MessageKind::Lifecycle, "compiling")),
        Rejection::LifecycleNoise
    );
    assert!(matches!(
        fx.rejected(post(a, MessageKind::RosterDelta, "forged")),
        Rejection::Invalid(_)
    ));
}

#[test]
fn mailbox_is_bounded() {
    let mut fx = Fx::new();
    let a = fx.profile("a");
    for i in 0..MAILBOX_MESSAGES_MAX {
        fx.state.apply(CommandEnvelope {
            subject: Subject::Legacy,
            at_ms: fx.now,
            idempotency_key: None,
            command: post(a, MessageKind::Note, &format!("note {i}")),
        });
    }
    assert_eq!(
        fx.rejected(post(a, MessageKind::Note, "one too many")),
        Rejection::MailboxFull {
            max: MAILBOX_MESSAGES_MAX
        }
    );
}

#[test]
fn roster_deltas_reach_every_peer_mailbox_by_revision() {
    let mut fx = Fx::new();
    let a = fx.profile("a");
    let b = fx.profile("b");
    let c = fx.profile("c");
    let rev_before = fx
        .state
        .project(&tenant(), &project())
        .unwrap()
        .roster
        .revision;
    let g = fx.acquire(a);
    let roster = &fx.state.project(&tenant(), &project()).unwrap().roster;
    assert_eq!(roster.revision, rev_before + 1);
    for peer in [b, c] {
        let last = fx
            .state
            .mailbox(peer)
            .unwrap()
            .messages
            .values()
            .last()
            .unwrap();
        let MessagePayload::Roster(delta) = &last.payload else {
            panic!("{last:?}")
        };
        assert_eq!(delta.revision, rev_before + 1);
        assert_eq!(
            delta.entry.status,
            RosterStatus::Active {
                provider: Provider::Codex,
                generation: g.generation
            }
        );
    }
    // The subject itself is not told about its own change.
    assert!(fx
        .state
        .mailbox(a)
        .unwrap()
        .messages
        .values()
        .all(|m| !matches!(&m.payload, MessagePayload::Roster(d) if d.entry.profile == a)));
    // A renewal is not a roster change.
    fx.ok(Command::RenewLease(RenewLease {
        fence: token(&g),
        ttl_ms: TTL,
    }));
    assert_eq!(
        fx.state
            .project(&tenant(), &project())
            .unwrap()
            .roster
            .revision,
        rev_before + 1
    );
    let roster = &fx.state.project(&tenant(), &project()).unwrap().roster;
    assert_eq!(roster.deltas_since(rev_before).unwrap().len(), 1);
    assert_eq!(roster.snapshot().entries.len(), 3);
}

#[test]
fn scheduler_takes_priority_then_age_and_matches_runtime() {
    let mut fx = Fx::new();
    let low = fx.submit("metadata:\n  name: low\n  labels: {priority: low}\n");
    let normal = fx.submit("");
    let high = fx.submit("metadata:\n  name: hi\n  labels: {priority: high}\n");
    let kvm = fx.submit("vm:\n  runtime: kvm\n");
    let queue: Vec<_> = fx.state.pending_queue().collect();
    assert_eq!(queue, vec![high, normal, kvm, low]);
    // w1 has two free slots and no kvm: high and normal go, kvm is skipped, low waits.
    let plan = schedule(&fx.state, fx.now, 10).dedicated;
    assert_eq!(
        plan,
        vec![
            Assignment {
                task: high,
                worker: worker()
            },
            Assignment {
                task: normal,
                worker: worker()
            }
        ]
    );
    fx.ok(Command::AssignTasks(AssignTasks { assignments: plan }));
    assert!(
        schedule(&fx.state, fx.now, 10).is_empty(),
        "the worker is full"
    );
}

#[test]
fn scheduler_spreads_by_free_slots_and_skips_silent_workers() {
    let mut fx = Fx::new();
    let w2 = WorkerId::new("w2").unwrap();
    fx.register_worker(w2.clone());
    let t1 = fx.submit("");
    let t2 = fx.submit("");
    let plan = schedule(&fx.state, fx.now, 10).dedicated;
    assert_eq!(plan.len(), 2);
    assert_ne!(plan[0].worker, plan[1].worker, "{plan:?}");
    assert_eq!((plan[0].task, plan[1].task), (t1, t2));
    fx.advance(WORKER_TTL);
    fx.apply(Command::WorkerHeartbeat(WorkerHeartbeat {
        worker: w2.clone(),
    }));
    let plan = schedule(&fx.state, fx.now, 10).dedicated;
    assert!(plan.iter().all(|a| a.worker == w2), "{plan:?}");
}

#[test]
fn project_placed_tasks_go_to_the_sandbox_worker_only() {
    let mut fx = Fx::new();
    fx.profile("a");
    let w2 = WorkerId::new("w2").unwrap();
    fx.register_worker(w2.clone());
    let t =
        fx.submit("placement:\n  kind: project\n  tenant: acme\n  project: web\n  profile: a\n");
    let Outcome::TasksAssigned { results } = fx.ok(Command::AssignTasks(AssignTasks {
        assignments: vec![Assignment {
            task: t,
            worker: w2,
        }],
    })) else {
        panic!()
    };
    assert!(matches!(
        results[0].result,
        Err(Rejection::SandboxMismatch { .. })
    ));
    let plan = schedule(&fx.state, fx.now, 10).project;
    assert_eq!(
        plan,
        vec![Assignment {
            task: t,
            worker: worker()
        }]
    );
    // A project-placed task must name an existing profile.
    let r = fx.rejected(Command::SubmitTask(SubmitTask {
        spec: Box::new(spec(
            "placement:\n  kind: project\n  tenant: acme\n  project: web\n  profile: ghost\n",
        )),
    }));
    assert!(matches!(r, Rejection::NotFound { .. }));
}

#[test]
fn sweep_is_due_only_when_it_would_change_something() {
    let mut fx = Fx::new();
    let p = fx.profile("a");
    assert!(!fx.state.sweep_due(fx.now, 0));
    let g = fx.acquire(p);
    assert!(!fx.state.sweep_due(fx.now + TTL - 1, 0));
    assert!(fx.state.sweep_due(g.expires_at_ms, 0));
    fx.advance(TTL);
    fx.register_worker(worker());
    fx.ok(Command::Sweep);
    assert!(!fx.state.sweep_due(fx.now, 0));
    assert!(
        fx.state.sweep_due(fx.now + WORKER_TTL, 0),
        "a silent worker is due"
    );
}

#[test]
fn tasks_after_pages_from_the_given_id_and_filters_by_state() {
    let mut fx = Fx::new();
    let ids: Vec<TaskId> = (0..5).map(|_| fx.submit("")).collect();
    let after = |a: u64, s: Option<TaskState>| -> Vec<TaskId> {
        fx.state.tasks_after(a, s).map(|t| t.id).collect()
    };
    assert_eq!(after(0, None), ids);
    assert_eq!(after(ids[1].get(), None), ids[2..].to_vec());
    assert_eq!(after(ids[4].get(), None), Vec::<TaskId>::new());
    assert_eq!(after(u64::MAX, None), Vec::<TaskId>::new());
    assert_eq!(
        after(ids[2].get(), Some(TaskState::Pending)),
        ids[3..].to_vec()
    );
    assert_eq!(after(0, Some(TaskState::Running)), Vec::<TaskId>::new());
    // The same answer as walking every task.
    let walked: Vec<TaskId> = fx
        .state
        .tasks(None)
        .filter(|t| t.id.get() > ids[0].get())
        .map(|t| t.id)
        .collect();
    assert_eq!(after(ids[0].get(), None), walked);
}

#[test]
fn tasks_before_pages_newest_first_and_filters_by_state() {
    let mut fx = Fx::new();
    let ids: Vec<TaskId> = (0..5).map(|_| fx.submit("")).collect();
    let before = |b: u64, s: Option<TaskState>| -> Vec<TaskId> {
        fx.state.tasks_before(b, s).map(|t| t.id).collect()
    };
    let newest_first: Vec<TaskId> = ids.iter().rev().copied().collect();
    assert_eq!(before(u64::MAX, None), newest_first);
    assert_eq!(before(ids[3].get(), None), vec![ids[2], ids[1], ids[0]]);
    assert_eq!(before(ids[0].get(), None), Vec::<TaskId>::new());
    assert_eq!(before(0, None), Vec::<TaskId>::new());
    assert_eq!(
        before(ids[3].get(), Some(TaskState::Pending)),
        vec![ids[2], ids[1], ids[0]]
    );
    assert_eq!(
        before(u64::MAX, Some(TaskState::Running)),
        Vec::<TaskId>::new()
    );
}

#[test]
fn commands_that_may_allow_a_placement_wake_the_scheduler_and_others_do_not() {
    let submit = Command::SubmitTask(SubmitTask {
        spec: Box::new(spec("")),
    });
    let cancel = Command::CancelTask(crate::command::CancelTask {
        task: TaskId::new(1).unwrap(),
        reason: "no longer needed".into(),
    });
    assert!(submit.wakes_scheduler());
    assert!(cancel.wakes_scheduler());
    // The scheduler's own commands and the lease traffic never wake it: a round would
    // follow each of its own assignments, and writes that free no slot only cost a scan.
    let assign = Command::AssignTasks(crate::command::AssignTasks {
        assignments: Vec::new(),
    });
    assert!(!assign.wakes_scheduler());
    assert!(!Command::Sweep.wakes_scheduler());
    let batch = |commands: Vec<Command>| {
        Command::Batch(crate::command::Batch {
            commands: commands
                .into_iter()
                .map(|command| crate::command::BatchedCommand {
                    subject: Subject::Legacy,
                    idempotency_key: None,
                    command,
                })
                .collect(),
        })
    };
    assert!(batch(vec![Command::Sweep, submit]).wakes_scheduler());
    assert!(!batch(vec![Command::Sweep, assign]).wakes_scheduler());
}
