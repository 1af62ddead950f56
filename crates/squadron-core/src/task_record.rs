//! A task as the state holds it: whole while it is live, as its encoding once it ended.
//!
//! An ended task never changes again and is read rarely (a `GET`, a page of a list, a prune),
//! while at DESIGN §7's scale nearly every task held is an ended one. Whole, a task is about
//! 1.3 KB of memory (its manifest's struct alone is 776 bytes, most of it empty options);
//! encoded, about 200 bytes. So an ended task is kept as its bincode encoding, with its state
//! and end time beside it for the scans that filter by state and the retention index, and
//! decoded when read. The snapshot encodes a record exactly as it encodes the task, so
//! snapshots, digests and the replicas' agreement are unchanged.

use std::borrow::Cow;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::{ProjectId, TenantId};
use crate::manifest::Placement;
use crate::task::{Task, TaskState};

/// One task of the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskRecord {
    /// A task that has not ended: whole, shared with copies of the state until it changes.
    Live(Arc<Task>),
    /// A task in a terminal state, encoded.
    Ended(EndedTask),
}

/// An ended task's encoding, and what the state reads of it without decoding.
#[derive(Clone, PartialEq, Eq)]
pub struct EndedTask {
    state: TaskState,
    ended_at_ms: u64,
    /// The project of a `placement: project` task, so a listing scoped to projects skips the
    /// others without decoding them.
    project: Option<Arc<(TenantId, ProjectId)>>,
    /// Shared by copies of the state, as a live task's `Arc` is.
    bytes: Arc<[u8]>,
}

/// The encoding of an ended task: the snapshot's, without its size limit (the task came
/// through a command, which had one).
fn config() -> bincode::config::Configuration<bincode::config::BigEndian> {
    bincode::config::standard().with_big_endian()
}

impl TaskRecord {
    /// The record of `task`: encoded when it has ended.
    pub(crate) fn new(task: Task) -> Self {
        if task.state.is_terminal() {
            TaskRecord::Ended(EndedTask::of(&task))
        } else {
            TaskRecord::Live(Arc::new(task))
        }
    }

    pub fn state(&self) -> TaskState {
        match self {
            TaskRecord::Live(t) => t.state,
            TaskRecord::Ended(e) => e.state,
        }
    }

    /// When an ended task entered its end state; `None` for a live one.
    pub fn ended_at_ms(&self) -> Option<u64> {
        match self {
            TaskRecord::Live(_) => None,
            TaskRecord::Ended(e) => Some(e.ended_at_ms),
        }
    }

    /// The project the task belongs to (`placement: project`), without decoding.
    pub fn project(&self) -> Option<(&TenantId, &ProjectId)> {
        match self {
            TaskRecord::Live(t) => match &t.spec.placement {
                Placement::Dedicated => None,
                Placement::Project {
                    tenant, project, ..
                } => Some((tenant, project)),
            },
            TaskRecord::Ended(e) => e.project.as_deref().map(|(t, p)| (t, p)),
        }
    }

    /// The task if it is live (nothing to decode).
    pub fn live(&self) -> Option<&Task> {
        match self {
            TaskRecord::Live(t) => Some(t),
            TaskRecord::Ended(_) => None,
        }
    }

    /// The task to read: borrowed while live, decoded if it ended. Apply's handlers read
    /// through this, not [`TaskRecord::task`]: a borrow holds no second reference to a live
    /// task, so the change that follows a check does not copy the task (`Arc::make_mut`), and
    /// the borrow checker sees that the view is gone before the change.
    pub fn view(&self) -> Cow<'_, Task> {
        match self {
            TaskRecord::Live(t) => Cow::Borrowed(t),
            TaskRecord::Ended(e) => Cow::Owned(e.decode()),
        }
    }

    /// The task, decoded if it ended.
    pub fn task(&self) -> Arc<Task> {
        match self {
            TaskRecord::Live(t) => Arc::clone(t),
            TaskRecord::Ended(e) => Arc::new(e.decode()),
        }
    }

    /// The live task, to change. An ended task never changes: a handler that tries is a bug
    /// that would make this replica's record differ from the others', so it stops here.
    pub(crate) fn live_mut(&mut self) -> &mut Task {
        match self {
            TaskRecord::Live(t) => Arc::make_mut(t),
            TaskRecord::Ended(e) => panic!("ended task in {} changed after its end", e.state),
        }
    }

    /// Encodes the task once it has ended (every handler that ends one calls this through
    /// `note_ended`).
    pub(crate) fn seal(&mut self) {
        if let TaskRecord::Live(t) = self {
            if t.state.is_terminal() {
                *self = TaskRecord::Ended(EndedTask::of(t));
            }
        }
    }
}

impl EndedTask {
    fn of(task: &Task) -> Self {
        assert!(
            task.state.is_terminal(),
            "task {} sealed in {}",
            task.id,
            task.state
        );
        // Plain data: encoding fails only on a bug (an unsupported serde shape).
        let bytes = bincode::serde::encode_to_vec(task, config())
            .unwrap_or_else(|e| panic!("encoding task {} failed: {e}", task.id));
        EndedTask {
            state: task.state,
            ended_at_ms: crate::apply_retention::ended_at_ms(task),
            project: task.spec.placement.project().map(Arc::new),
            bytes: bytes.into(),
        }
    }

    fn decode(&self) -> Task {
        // The bytes are this process's own encoding: failing to read them back means memory
        // is not what it wrote, and a crash beats serving it.
        let (task, _): (Task, usize) = bincode::serde::decode_from_slice(&self.bytes, config())
            .unwrap_or_else(|e| panic!("an ended task's encoding does not decode: {e}"));
        task
    }
}

impl std::fmt::Debug for EndedTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndedTask")
            .field("state", &self.state)
            .field("ended_at_ms", &self.ended_at_ms)
            .field("project", &self.project)
            .field("encoded_bytes", &self.bytes.len())
            .finish()
    }
}

impl Serialize for TaskRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TaskRecord::Live(t) => t.serialize(s),
            TaskRecord::Ended(e) => e.decode().serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for TaskRecord {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Task::deserialize(d).map(TaskRecord::new)
    }
}
