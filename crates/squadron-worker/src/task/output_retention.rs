//! How long an ended task's outputs stay on this worker: its manifest names a retention class
//! (`startup_profile.observation.retention_class`; `standard` without a startup profile) and
//! the worker gives each class an age (`--output-retention CLASS=DURATION`). A task's driver
//! writes `retention.json` (its class and end time) once its end is committed and its disk
//! quota retired; a starting worker writes one for each ended task that has none (a driver
//! that died first, a task from before this version), dated by its checkpoint. A sweep every
//! so often removes the files of each task whose age ran out — its logs, events and
//! artifacts, and its clone where no disk quota dropped it at the end — and leaves
//! `outputs-removed.json`, from which the output server answers why nothing is there; that
//! record is written before anything is removed, so nothing half-removed (an outbox without
//! its unredacted mark) is ever served, and a removal cut short is finished by the next
//! sweep. The directory itself goes `TOMBSTONE_KEPT_MS` later. A task kept for break-glass
//! (`FAILED_PRESERVED`) gets no record and is never swept.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use squadron_core::ids::TaskId;
use squadron_core::manifest::{
    TaskSpec, RETENTION_CLASSES, RETENTION_CLASS_CREDENTIALED_SHORT, RETENTION_CLASS_SHORT,
    RETENTION_CLASS_STANDARD,
};
use squadron_core::task::TaskState;

use super::checkpoint::TaskCheckpoint;
use super::task_dir::TaskDir;
use super::task_volume::TaskVolume;
use crate::error::WorkerError;
use crate::support::{read_bounded, remove_path, write_atomic};

/// The default ages: a week for `standard`, a day for the short classes.
pub const OUTPUT_RETENTION_MS_STANDARD_DEFAULT: u64 = 7 * DAY_MS;
pub const OUTPUT_RETENTION_MS_SHORT_DEFAULT: u64 = DAY_MS;
/// The bounds of an age an operator sets.
pub const OUTPUT_RETENTION_MS_MIN: u64 = 1_000;
pub const OUTPUT_RETENTION_MS_MAX: u64 = 3_660 * DAY_MS;
/// The sweep runs a quarter of the shortest age apart, within these bounds.
const SWEEP_INTERVAL_MS_MIN: u64 = 500;
const SWEEP_INTERVAL_MS_MAX: u64 = 60_000;
/// Most task directories one sweep looks at: with tombstones gone after a month, more than
/// the tasks a worker ends in its classes' ages plus that month.
const TASK_DIRS_SWEPT_MAX: usize = 100_000;
/// How long a swept task's directory (its records) stays, answering why its files are gone.
const TOMBSTONE_KEPT_MS: u64 = 30 * DAY_MS;
/// The largest `manifest.yaml` read back for its class.
const MANIFEST_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// Largest record read back.
const RECORD_BYTES_MAX: u64 = 4_096;
const DAY_MS: u64 = 24 * 60 * 60 * 1_000;

/// The files a sweep leaves in a task directory.
const RETENTION_RECORD_NAME: &str = "retention.json";
const REMOVED_RECORD_NAME: &str = "outputs-removed.json";
const KEPT_NAMES: [&str; 3] = ["state.json", RETENTION_RECORD_NAME, REMOVED_RECORD_NAME];

/// Each retention class's age, in ms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRetention {
    ages_ms: BTreeMap<String, u64>,
}

impl Default for OutputRetention {
    fn default() -> Self {
        let ages_ms = [
            (
                RETENTION_CLASS_STANDARD,
                OUTPUT_RETENTION_MS_STANDARD_DEFAULT,
            ),
            (RETENTION_CLASS_SHORT, OUTPUT_RETENTION_MS_SHORT_DEFAULT),
            (
                RETENTION_CLASS_CREDENTIALED_SHORT,
                OUTPUT_RETENTION_MS_SHORT_DEFAULT,
            ),
        ]
        .into_iter()
        .map(|(class, ms)| (class.to_string(), ms))
        .collect();
        Self { ages_ms }
    }
}

impl OutputRetention {
    /// The defaults with `class`'s age set to `age_ms`; an unknown class or an age out of
    /// bounds is refused naming the field.
    pub fn with_age(mut self, class: &str, age_ms: u64) -> Result<Self, WorkerError> {
        let invalid = |message: String| WorkerError::Invalid {
            field: "output_retention".into(),
            message,
        };
        if !RETENTION_CLASSES.contains(&class) {
            return Err(invalid(format!(
                "unknown retention class {class:?}; expected one of {}",
                RETENTION_CLASSES.join(", ")
            )));
        }
        if !(OUTPUT_RETENTION_MS_MIN..=OUTPUT_RETENTION_MS_MAX).contains(&age_ms) {
            return Err(invalid(format!(
                "{class}: {age_ms} ms is outside {OUTPUT_RETENTION_MS_MIN}..={OUTPUT_RETENTION_MS_MAX} ms"
            )));
        }
        self.ages_ms.insert(class.to_string(), age_ms);
        Ok(self)
    }

    /// The age of `class`; a name this build does not know (a task from the log written before
    /// the classes were named) gets `standard`'s.
    pub fn age_ms(&self, class: &str) -> u64 {
        self.ages_ms
            .get(class)
            .or_else(|| self.ages_ms.get(RETENTION_CLASS_STANDARD))
            .copied()
            .unwrap_or(OUTPUT_RETENTION_MS_STANDARD_DEFAULT)
    }

    /// How long the sweep waits between runs: a task's files go at most a quarter of its
    /// class's age late (the age is a floor, never shortened).
    pub fn sweep_interval_ms(&self) -> u64 {
        let shortest = self.ages_ms.values().min().copied().unwrap_or(DAY_MS);
        (shortest / 4).clamp(SWEEP_INTERVAL_MS_MIN, SWEEP_INTERVAL_MS_MAX)
    }
}

/// The retention class a task's manifest names.
pub(crate) fn class_of(spec: &TaskSpec) -> &str {
    spec.startup_profile
        .as_ref()
        .map_or(RETENTION_CLASS_STANDARD, |p| {
            p.observation.retention_class.as_str()
        })
}

/// `retention.json`: written once the task's end is committed and its files retired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RetentionRecord {
    pub(crate) class: String,
    /// This worker's clock.
    pub(crate) ended_at_ms: u64,
}

/// `outputs-removed.json`: what the output server tells a reader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RemovedRecord {
    pub(crate) class: String,
    pub(crate) age_ms: u64,
    pub(crate) removed_at_ms: u64,
}

impl RetentionRecord {
    pub(crate) fn write(&self, dir: &TaskDir) -> Result<(), WorkerError> {
        write_record(&dir.root().join(RETENTION_RECORD_NAME), self)
    }
}

fn write_record(path: &Path, record: &impl Serialize) -> Result<(), WorkerError> {
    let bytes = serde_json::to_vec(record).map_err(|e| WorkerError::Invalid {
        field: path.display().to_string(),
        message: e.to_string(),
    })?;
    write_atomic(path, &bytes)
}

fn read_record<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let bytes = read_bounded(path, RECORD_BYTES_MAX).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// What the output server says of a task whose files a sweep removed, or `None`.
pub(crate) fn removed_message(dir: &TaskDir) -> Option<String> {
    let removed: RemovedRecord = read_record(&dir.root().join(REMOVED_RECORD_NAME))?;
    Some(format!(
        "task {}'s outputs were removed from this worker at {} ms (Unix time), when its retention \
         class {:?} ({} ms after the task ended) ran out",
        dir.task(),
        removed.removed_at_ms,
        removed.class,
        removed.age_ms
    ))
}

/// The task directories of `data_dir`, at most `TASK_DIRS_SWEPT_MAX`.
fn task_dirs(data_dir: &Path) -> Vec<TaskDir> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("tasks")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let task = entry.file_name().to_str()?.parse::<u64>().ok()?;
            Some(TaskDir::new(data_dir, TaskId::new(task).ok()?))
        })
        .take(TASK_DIRS_SWEPT_MAX)
        .collect()
}

/// At worker start, before any driver runs: a `retention.json` for every ended task that has
/// none — its driver died between the end and the record, or it ended before this version —
/// of its manifest's class, ended when its checkpoint was last written. A task whose disk
/// quota is still mounted waits for the volume's own start-up sweep, which runs first.
pub(crate) fn record_unrecorded(data_dir: &Path) -> Vec<TaskId> {
    let mut recorded = Vec::new();
    for dir in task_dirs(data_dir) {
        let root = dir.root();
        if root.join(RETENTION_RECORD_NAME).exists() || root.join(REMOVED_RECORD_NAME).exists() {
            continue;
        }
        let Some(checkpoint) = TaskCheckpoint::load(&dir.state_json()).ok().flatten() else {
            continue;
        };
        if !checkpoint.state.is_terminal() || checkpoint.state == TaskState::FailedPreserved {
            continue;
        }
        if TaskVolume::of(data_dir, &dir).holds_files() {
            continue;
        }
        let spec = read_bounded(&dir.manifest(), MANIFEST_BYTES_MAX)
            .ok()
            .and_then(|bytes| yaml_serde::from_slice::<TaskSpec>(&bytes).ok());
        let record = RetentionRecord {
            class: spec
                .as_ref()
                .map_or(RETENTION_CLASS_STANDARD, class_of)
                .to_string(),
            ended_at_ms: checkpoint.updated_at_ms,
        };
        match record.write(&dir) {
            Ok(()) => recorded.push(dir.task()),
            Err(e) => {
                tracing::warn!(task = %dir.task(), error = %e, "cannot record an ended task's retention")
            }
        }
    }
    recorded
}

/// Removes the files of every ended task in `data_dir` whose class's age ran out by `now_ms`
/// (and finishes removals cut short, and drops tombstones past their month); says which
/// tasks' files went. A removal that fails is logged and tried again at the next sweep.
pub(crate) fn sweep(data_dir: &Path, retention: &OutputRetention, now_ms: u64) -> Vec<TaskId> {
    let mut removed = Vec::new();
    for dir in task_dirs(data_dir) {
        // Files still in a volume are the volume's to retire first (a record written although
        // the retirement failed, say): their turn comes once they are out.
        if TaskVolume::of(data_dir, &dir).holds_files() {
            continue;
        }
        match sweep_one(&dir, retention, now_ms) {
            Ok(true) => removed.push(dir.task()),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(task = %dir.task(), error = %e, "cannot remove an ended task's outputs")
            }
        }
    }
    removed
}

/// One task directory's turn: whether its files went now.
fn sweep_one(dir: &TaskDir, retention: &OutputRetention, now_ms: u64) -> Result<bool, WorkerError> {
    let root = dir.root();
    if let Some(removed) = read_record::<RemovedRecord>(&root.join(REMOVED_RECORD_NAME)) {
        if now_ms >= removed.removed_at_ms.saturating_add(TOMBSTONE_KEPT_MS) {
            remove_path(root)?;
        } else {
            remove_all_but_records(root)?;
        }
        return Ok(false);
    }
    let Some(record) = read_record::<RetentionRecord>(&root.join(RETENTION_RECORD_NAME)) else {
        return Ok(false);
    };
    let age_ms = retention.age_ms(&record.class);
    if now_ms < record.ended_at_ms.saturating_add(age_ms) {
        return Ok(false);
    }
    // First the record: from now on the output server serves nothing of this task, so
    // nothing half-removed is ever read.
    write_record(
        &root.join(REMOVED_RECORD_NAME),
        &RemovedRecord {
            class: record.class,
            age_ms,
            removed_at_ms: now_ms,
        },
    )?;
    remove_all_but_records(root)?;
    Ok(true)
}

fn remove_all_but_records(root: &Path) -> Result<(), WorkerError> {
    let entries =
        std::fs::read_dir(root).map_err(|e| WorkerError::io("list a task directory", root, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !KEPT_NAMES.iter().any(|kept| name == *kept) {
            remove_path(&entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use squadron_core::manifest::RuntimeKind;

    fn task_dir(data: &Path, id: u64, class: &str, ended_at_ms: u64) -> TaskDir {
        let dir = TaskDir::new(data, TaskId::new(id).unwrap());
        std::fs::create_dir_all(dir.stdout_log().parent().unwrap()).unwrap();
        std::fs::create_dir_all(dir.inbox().join(".git")).unwrap();
        std::fs::write(dir.stdout_log(), b"output").unwrap();
        std::fs::write(dir.state_json(), b"{}").unwrap();
        RetentionRecord {
            class: class.into(),
            ended_at_ms,
        }
        .write(&dir)
        .unwrap();
        dir
    }

    fn names(dir: &TaskDir) -> Vec<String> {
        let mut names: Vec<_> = std::fs::read_dir(dir.root())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Each task goes when its own class's age ran out, not before; what stays says why.
    #[test]
    fn a_task_s_files_go_once_its_class_s_age_ran_out() {
        let data = tempfile::tempdir().unwrap();
        let retention = OutputRetention::default()
            .with_age("short", 10_000)
            .unwrap();
        let short = task_dir(data.path(), 1, "short", 1_000);
        let standard = task_dir(data.path(), 2, "standard", 1_000);
        let old_name = task_dir(data.path(), 3, "kept-forever", 1_000);
        let unrecorded = TaskDir::new(data.path(), TaskId::new(4).unwrap());
        std::fs::create_dir_all(unrecorded.outbox()).unwrap();

        assert_eq!(sweep(data.path(), &retention, 10_999), Vec::<TaskId>::new());
        assert!(short.stdout_log().exists());
        assert_eq!(
            sweep(data.path(), &retention, 11_000),
            [TaskId::new(1).unwrap()]
        );
        assert_eq!(
            names(&short),
            ["outputs-removed.json", "retention.json", "state.json"]
        );
        let said = removed_message(&short).expect("a reason");
        assert!(
            said.contains("\"short\" (10000 ms after the task ended)"),
            "{said}"
        );
        assert!(said.contains("at 11000 ms"), "{said}");
        assert!(removed_message(&standard).is_none());
        // A sweep again removes nothing more, and the record keeps its first time.
        assert!(sweep(data.path(), &retention, 20_000).is_empty());
        assert!(removed_message(&short).unwrap().contains("at 11000 ms"));

        let week = OUTPUT_RETENTION_MS_STANDARD_DEFAULT;
        let mut gone = sweep(data.path(), &retention, 1_000 + week);
        gone.sort();
        assert_eq!(gone, [TaskId::new(2).unwrap(), TaskId::new(3).unwrap()]);
        assert!(
            !old_name.stdout_log().exists(),
            "an unknown class ages as standard"
        );
        assert!(
            unrecorded.outbox().exists(),
            "a task without a record stays"
        );
    }

    /// The record goes first: a removal cut short leaves a task that serves nothing, and the
    /// next sweep finishes it; a month later the directory itself goes.
    #[test]
    fn a_removal_cut_short_is_finished_and_the_tombstone_goes_after_a_month() {
        let data = tempfile::tempdir().unwrap();
        let retention = OutputRetention::default();
        let dir = task_dir(data.path(), 5, "short", 0);
        let day = OUTPUT_RETENTION_MS_SHORT_DEFAULT;
        assert_eq!(sweep(data.path(), &retention, day).len(), 1);
        // What a removal cut short would leave: an outbox file back beside the records.
        std::fs::create_dir_all(dir.stdout_log().parent().unwrap()).unwrap();
        std::fs::write(dir.stdout_log(), b"left over").unwrap();
        assert!(
            removed_message(&dir).is_some(),
            "served as removed meanwhile"
        );
        assert!(sweep(data.path(), &retention, day + 1).is_empty());
        assert!(!dir.outbox().exists(), "finished by the next sweep");
        sweep(data.path(), &retention, day + TOMBSTONE_KEPT_MS - 1);
        assert!(dir.root().exists());
        sweep(data.path(), &retention, day + TOMBSTONE_KEPT_MS);
        assert!(!dir.root().exists(), "the tombstone went after its month");
    }

    /// A starting worker records the retention of every ended task that has no record, by its
    /// manifest's class and its checkpoint's time; a preserved, a running and a recorded task
    /// are left as they are.
    #[test]
    fn a_starting_worker_records_the_ended_tasks_a_driver_left_unrecorded() {
        let data = tempfile::tempdir().unwrap();
        let at = |id: u64, state: TaskState, manifest: Option<&str>| {
            let dir = TaskDir::new(data.path(), TaskId::new(id).unwrap());
            std::fs::create_dir_all(dir.root()).unwrap();
            let mut c = TaskCheckpoint::fresh(id, 1, state, RuntimeKind::Process);
            c.updated_at_ms = 4_242;
            c.store(&dir.state_json()).unwrap();
            if let Some(m) = manifest {
                let spec = squadron_core::manifest::parse_manifest_yaml(m).unwrap();
                std::fs::write(dir.manifest(), yaml_serde::to_string(&spec).unwrap()).unwrap();
            }
            dir
        };
        let short = at(1, TaskState::Completed, Some(&manifest_of("short")));
        let unreadable = at(2, TaskState::Failed, None);
        let preserved = at(3, TaskState::FailedPreserved, None);
        let running = at(4, TaskState::Running, None);
        let recorded = task_dir(data.path(), 5, "credentialed-short", 7);

        let mut done = record_unrecorded(data.path());
        done.sort();
        assert_eq!(done, [short.task(), unreadable.task()]);
        let read =
            |dir: &TaskDir| read_record::<RetentionRecord>(&dir.root().join(RETENTION_RECORD_NAME));
        assert_eq!(
            read(&short),
            Some(RetentionRecord {
                class: "short".into(),
                ended_at_ms: 4_242
            })
        );
        assert_eq!(read(&unreadable).unwrap().class, "standard");
        assert_eq!(read(&preserved), None);
        assert_eq!(read(&running), None);
        assert_eq!(read(&recorded).unwrap().ended_at_ms, 7);
    }

    fn manifest_of(class: &str) -> String {
        format!(
            "version: \"1\"\nkind: Task\nmetadata:\n  name: t\nrepository:\n  url: https://h/r\n\
             agent:\n  prompt: p\n  provider: script\n  script: echo\n\
             startup_profile:\n  id: s\n  trigger: on_instance_ready\n  \
             session: {{ launcher: x, workdir: /workspace, cols: 80, rows: 24 }}\n  \
             observation: {{ retention_class: {class}, redaction_profile: credentials }}\n"
        )
    }

    #[test]
    fn an_unknown_class_or_an_age_out_of_bounds_is_refused_naming_the_field() {
        for (class, ms, says) in [
            ("forever", 60_000, "unknown retention class \"forever\""),
            ("short", 999, "999 ms is outside"),
            ("short", OUTPUT_RETENTION_MS_MAX + 1, "is outside"),
        ] {
            let e = OutputRetention::default()
                .with_age(class, ms)
                .unwrap_err()
                .to_string();
            assert!(e.contains("output_retention") && e.contains(says), "{e}");
        }
    }

    #[test]
    fn the_sweep_runs_a_quarter_of_the_shortest_age_apart() {
        assert_eq!(OutputRetention::default().sweep_interval_ms(), 60_000);
        let short = OutputRetention::default().with_age("short", 8_000).unwrap();
        assert_eq!(short.sweep_interval_ms(), 2_000);
        let shortest = OutputRetention::default().with_age("short", 1_000).unwrap();
        assert_eq!(shortest.sweep_interval_ms(), 500);
    }
}
