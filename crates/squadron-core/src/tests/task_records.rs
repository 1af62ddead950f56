//! How the state holds its tasks (`task_record.rs`): a live task whole, an ended one encoded,
//! read back whole, encoded in a snapshot exactly as the task itself, and never changed.

use super::*;
use crate::command::CancelTask;
use crate::snapshot::{decode_snapshot, encode_snapshot};
use crate::task::TaskState::*;
use crate::task_record::TaskRecord;

fn cancel(fx: &mut Fx, task: TaskId) {
    fx.ok(Command::CancelTask(CancelTask {
        task,
        reason: "no longer wanted".into(),
    }));
}

fn snapshot_bytes<T: serde::Serialize>(value: &T) -> Vec<u8> {
    let config = bincode::config::standard().with_big_endian();
    bincode::serde::encode_to_vec(value, config).expect("encode")
}

#[test]
fn a_live_task_is_held_whole_and_an_ended_one_encoded() {
    let mut fx = Fx::new();
    let queued = fx.submit("");
    let ended = fx.submit("metadata:\n  name: labelled\n  labels:\n    team: web\n");
    let before = fx.state.task(ended).expect("held");
    cancel(&mut fx, ended);

    assert!(matches!(fx.state.tasks[&queued], TaskRecord::Live(_)));
    let record = &fx.state.tasks[&ended];
    assert!(matches!(record, TaskRecord::Ended(_)), "{record:?}");
    assert_eq!(record.state(), Cancelled);
    assert_eq!(fx.state.task_state(ended), Some(Cancelled));
    assert!(record.live().is_none());
    let after = fx.state.task(ended).expect("read back");
    assert_eq!(after.spec, before.spec, "the manifest comes back whole");
    assert_eq!(after.state, Cancelled);
    assert_eq!(after.cancel_requested.as_deref(), Some("no longer wanted"));
    assert_eq!(
        record.ended_at_ms(),
        after.entered_at_ms.get(&Cancelled).copied()
    );
    assert_eq!(record.project(), None, "a dedicated task is no project's");

    // A project's task keeps its project beside its encoding, for scoped listings.
    fx.profile("alpha");
    let placed = fx
        .submit("placement:\n  kind: project\n  tenant: acme\n  project: web\n  profile: alpha\n");
    assert_eq!(
        fx.state.tasks[&placed].project(),
        Some((&tenant(), &project()))
    );
    cancel(&mut fx, placed);
    assert!(matches!(fx.state.tasks[&placed], TaskRecord::Ended(_)));
    assert_eq!(
        fx.state.tasks[&placed].project(),
        Some((&tenant(), &project()))
    );

    // The listings filter by state before decoding, and decode what they yield.
    let listed: Vec<TaskId> = fx.state.tasks(Some(Cancelled)).map(|t| t.id).collect();
    assert_eq!(listed, vec![ended, placed]);
    let listed: Vec<TaskId> = fx
        .state
        .tasks_before(u64::MAX, None)
        .map(|t| t.id)
        .collect();
    assert_eq!(listed, vec![placed, ended, queued]);
    let listed: Vec<TaskId> = fx
        .state
        .tasks_after(0, Some(Pending))
        .map(|t| t.id)
        .collect();
    assert_eq!(listed, vec![queued]);
}

#[test]
fn an_ended_task_is_encoded_in_a_snapshot_as_the_task_itself() {
    let mut fx = Fx::new();
    let task = fx.submit("");
    cancel(&mut fx, task);
    let whole = fx.state.task(task).expect("held");
    let record = &fx.state.tasks[&task];
    assert_eq!(snapshot_bytes(record), snapshot_bytes(&*whole));
    assert_eq!(
        snapshot_bytes(&TaskRecord::Live(whole.clone())),
        snapshot_bytes(&*whole),
        "a live record encodes as its task too"
    );
    let decoded = decode_snapshot(&encode_snapshot(&fx.state)).expect("decode");
    assert_eq!(
        decoded, fx.state,
        "an ended task decodes into an ended record"
    );
    assert!(matches!(decoded.tasks[&task], TaskRecord::Ended(_)));
}

#[test]
#[should_panic(expected = "changed after its end")]
fn an_ended_task_never_changes() {
    let mut fx = Fx::new();
    let task = fx.submit("");
    cancel(&mut fx, task);
    let mut state = fx.state.clone();
    state.tasks.get_mut(&task).expect("held").live_mut().attempt = 2;
}

#[test]
fn the_checker_catches_an_ended_task_held_whole_and_wrong_figures() {
    let mut fx = Fx::new();
    let task = fx.submit("");
    cancel(&mut fx, task);

    let mut broken = fx.state.clone();
    let whole = broken.task(task).expect("held");
    broken.tasks.insert(task, TaskRecord::Live(whole));
    let e = broken.check_invariants().unwrap_err();
    assert!(e.contains("held unlike"), "{e}");

    let mut broken = fx.state.clone();
    broken.rebuild_ended_index();
    assert_eq!(
        broken, fx.state,
        "the figures kept as tasks end are the rebuilt ones"
    );
    broken.pruned_tasks.count += 1;
    broken.next_task_id = TaskId::new(broken.next_task_id.get() + 1).unwrap();
    let e = broken.check_invariants().unwrap_err();
    assert!(e.contains("figures disagree"), "{e}");
}
