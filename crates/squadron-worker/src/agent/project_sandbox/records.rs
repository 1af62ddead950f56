//! The worker's own durable record of which generations started here and which were proved
//! quiescent: `run/{key}/g{n}.started`, written once and exclusively before a spawn, and
//! `run/{key}/g{n}.reaped`, the evidence of the reap.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use squadron_core::ids::{Generation, ProfileKey};
use squadron_isolation::ReapEvidence;

use super::{
    invalid, list_names, project_error, read_json, unique_sibling, ProfilePaths, ProjectSandbox,
    StartedGeneration,
};
use crate::error::WorkerError;
use crate::support::{now_ms, write_atomic};

impl ProjectSandbox {
    /// The generations of a profile started on this worker, ascending.
    pub(crate) fn started_generations(
        &self,
        key: &ProfileKey,
    ) -> Result<Vec<Generation>, WorkerError> {
        let run = self.profile_paths(key).run;
        let mut generations: Vec<Generation> = list_names(&run)?
            .iter()
            .filter_map(|name| {
                let digits = name.strip_prefix('g')?.strip_suffix(".started")?;
                let valid = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
                valid.then(|| digits.parse().ok().map(Generation::new))?
            })
            .collect();
        generations.sort();
        Ok(generations)
    }

    /// The record of a started generation; `None` if it never started here.
    pub(crate) fn started(
        &self,
        key: &ProfileKey,
        generation: Generation,
    ) -> Result<Option<StartedGeneration>, WorkerError> {
        let path = self.profile_paths(key).started_marker(generation);
        let Some(record) = read_json::<StartedGeneration>(&path)? else {
            if path.exists() {
                return Err(project_error(format!(
                    "{} is unreadable: generation {generation} of {key} started but its leaf \
                     is unknown",
                    path.display()
                )));
            }
            return Ok(None);
        };
        Ok(Some(record))
    }

    /// The last generation of a profile started here, with its leaf.
    #[allow(
        dead_code,
        reason = "no caller yet: a takeover that resets the worktree will use it (ADR-0011 decision 6); the tests prove the proof requirement"
    )]
    pub(crate) fn last_started(
        &self,
        key: &ProfileKey,
    ) -> Result<Option<StartedGeneration>, WorkerError> {
        match self.started_generations(key)?.last() {
            Some(generation) => self.started(key, *generation),
            None => Ok(None),
        }
    }

    /// The reap evidence recorded for a generation (`run/{key}/g{n}.reaped`), if any.
    pub(crate) fn reap_evidence(
        &self,
        key: &ProfileKey,
        generation: Generation,
    ) -> Result<Option<ReapEvidence>, WorkerError> {
        read_json(&self.profile_paths(key).reaped_record(generation))
    }

    /// Records, exclusively and before anything is spawned, that `generation` of the profile
    /// starts in leaf `cgroup`. Refused when this or a newer generation started already, or
    /// when `precheck` (the caller's proof that no other generation runs) fails.
    pub(crate) fn record_start(
        &self,
        paths: &ProfilePaths,
        generation: Generation,
        cgroup: &Path,
        precheck: impl FnOnce() -> Result<(), WorkerError>,
    ) -> Result<StartedGeneration, WorkerError> {
        let _guard = self.guard();
        let key = &paths.key;
        let last = self.started_generations(key)?.last().copied();
        if let Some(last) = last {
            if last == generation {
                return Err(invalid(
                    "generation",
                    format!(
                        "generation {generation} of profile {key} was started already; adopt it"
                    ),
                ));
            }
            if last > generation {
                return Err(invalid(
                    "generation",
                    format!(
                        "generation {generation} of profile {key} is older than generation \
                         {last}, which started already"
                    ),
                ));
            }
        }
        precheck()?;
        if let Some(last) = last {
            // The previous generation may still be between its start record and its leaf:
            // only its exit code or its reap record says it is over.
            let exited = paths.exit_code_file(last).exists();
            let reaped = self
                .reap_evidence(key, last)?
                .is_some_and(|evidence| !evidence.populated);
            if !exited && !reaped {
                return Err(invalid(
                    "generation",
                    format!(
                        "generation {last} of profile {key} has neither exited nor been \
                         reaped; reap it before starting generation {generation}"
                    ),
                ));
            }
        }
        let record = StartedGeneration {
            generation,
            cgroup: cgroup.display().to_string(),
            started_at_ms: now_ms(),
        };
        let json = serde_json::to_vec_pretty(&record)
            .map_err(|e| project_error(format!("cannot encode the start record: {e}")))?;
        let marker = paths.started_marker(generation);
        // Written whole under another name, then linked: the marker appears complete or not at
        // all, and link(2) fails if it exists (the once-only guarantee).
        let tmp = unique_sibling(&marker, ".tmp");
        write_atomic(&tmp, &json)?;
        let linked = fs::hard_link(&tmp, &marker);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(record),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(invalid(
                "generation",
                format!("generation {generation} of profile {key} was started already; adopt it"),
            )),
            Err(e) => Err(WorkerError::io("recording the start at", &marker, e)),
        }
    }
}

/// Keeps the evidence of a reap that proved a generation quiescent, so a restarted worker
/// can still show it (a crash takeover needs it, INV-9); evidence that proves nothing is not
/// kept.
pub(crate) fn record_reap(
    paths: &ProfilePaths,
    generation: Generation,
    evidence: &ReapEvidence,
) -> Result<(), WorkerError> {
    if evidence.populated {
        return Ok(());
    }
    let json = serde_json::to_vec_pretty(evidence)
        .map_err(|e| project_error(format!("cannot encode reap evidence: {e}")))?;
    write_atomic(&paths.reaped_record(generation), &json)
}

/// Removes the launch files (`g{k}/`: prompt, mailbox, capsule, pending work) of the
/// generations before `generation`'s predecessor that were proved quiescent: nothing reads
/// them again (a new generation's catch-up reads only its predecessor's), and `run/` is on the
/// host's filesystem, outside the volume's bound, so they would pile up with every takeover.
/// The start and reap records stay (INV-9's proofs). Returns how many were removed.
pub(crate) fn prune_launch_files(
    paths: &ProfilePaths,
    generation: Generation,
) -> Result<usize, WorkerError> {
    let mut removed = 0;
    for name in list_names(&paths.run)? {
        let Some(k) = name
            .strip_prefix('g')
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<u64>().ok())
        else {
            continue;
        };
        let old = Generation::new(k);
        if k.saturating_add(1) < generation.get() && paths.reaped_record(old).exists() {
            crate::support::remove_path(&paths.generation_run_dir(old))?;
            removed += 1;
        }
    }
    Ok(removed)
}
