//! The evidence counters that outlive the worker process (issue 20: "counters survive worker
//! and node restarts"): each project's peak processes, deliveries and self-fencings, and the
//! Git broker's commit counters. They are kept in memory as they change and saved to
//! `{data_dir}/agent-evidence.json` by the supervisor's tick when they changed (at most
//! [`SUPERVISOR_TICK_MS`](crate::agent::supervisor::SUPERVISOR_TICK_MS) of counts can be lost to
//! a kill -9), and read back at start: a restarted worker goes on counting from what its
//! previous life saw, so a crash never makes a peak of 5 processes or a dual write vanish from
//! the release evidence.
//!
//! The broker counts from zero in each life; the ledger keeps what earlier lives counted as
//! its base and reports base plus the live counts.

use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use squadron_client::BrokerEvidence;
use squadron_core::ids::{ProjectId, TenantId};
use squadron_isolation::BrokerStats;

use crate::agent::registry::{ProjectCounters, ProjectKey};
use crate::error::WorkerError;
use crate::support::write_atomic;

/// The file the counters are saved in, below the worker's data directory.
pub(crate) const EVIDENCE_FILE_NAME: &str = "agent-evidence.json";
/// Largest ledger file read back.
const EVIDENCE_FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;
/// Projects whose counters are kept; the counters of further projects are not saved.
pub(crate) const EVIDENCE_PROJECTS_MAX: usize = 100_000;

/// One project's counters as saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedProject {
    pub(crate) tenant: TenantId,
    pub(crate) project: ProjectId,
    #[serde(flatten)]
    pub(crate) counters: ProjectCounters,
}

/// Everything saved: every project's counters and the broker's, as evidence shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EvidenceLedger {
    pub(crate) projects: Vec<SavedProject>,
    pub(crate) broker: BrokerEvidence,
}

impl EvidenceLedger {
    pub(crate) fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(EVIDENCE_FILE_NAME)
    }

    /// What an earlier life saved; nothing when there is no file. A file that cannot be read
    /// or parsed stops the start: evidence that silently restarts from zero is worse than a
    /// worker that says why it will not start.
    pub(crate) fn load(data_dir: &Path) -> Result<EvidenceLedger, WorkerError> {
        let path = Self::path(data_dir);
        let file = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(EvidenceLedger::default())
            }
            Err(e) => return Err(ledger_error(&path, e.to_string())),
        };
        let mut bytes = Vec::new();
        file.take(EVIDENCE_FILE_BYTES_MAX + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| ledger_error(&path, e.to_string()))?;
        if bytes.len() as u64 > EVIDENCE_FILE_BYTES_MAX {
            return Err(ledger_error(
                &path,
                format!("larger than {EVIDENCE_FILE_BYTES_MAX} bytes"),
            ));
        }
        serde_json::from_slice(&bytes).map_err(|e| ledger_error(&path, e.to_string()))
    }

    pub(crate) fn save(&self, data_dir: &Path) -> Result<(), WorkerError> {
        let bytes = serde_json::to_vec_pretty(self)
            .map_err(|e| ledger_error(&Self::path(data_dir), e.to_string()))?;
        write_atomic(&Self::path(data_dir), &bytes)
    }

    /// The projects' counters, as the registry keeps them.
    pub(crate) fn project_counters(&self) -> Vec<(ProjectKey, ProjectCounters)> {
        self.projects
            .iter()
            .take(EVIDENCE_PROJECTS_MAX)
            .map(|p| ((p.tenant.clone(), p.project.clone()), p.counters))
            .collect()
    }

    /// A ledger of the registry's counters now and the broker's base plus its live counts.
    pub(crate) fn of(
        projects: impl Iterator<Item = (ProjectKey, ProjectCounters)>,
        broker: BrokerEvidence,
    ) -> EvidenceLedger {
        EvidenceLedger {
            projects: projects
                .take(EVIDENCE_PROJECTS_MAX)
                .map(|((tenant, project), counters)| SavedProject {
                    tenant,
                    project,
                    counters,
                })
                .collect(),
            broker,
        }
    }
}

/// The broker's counters as evidence shows them: what earlier lives counted plus this one's.
pub(crate) fn broker_evidence(base: &BrokerEvidence, live: &BrokerStats) -> BrokerEvidence {
    BrokerEvidence {
        commits_accepted: base.commits_accepted + live.accepted,
        accepted_from_non_current: base.accepted_from_non_current + live.accepted_from_non_current,
        ended_during_commit: base.ended_during_commit + live.ended_during_commit,
        refused_stale_generation: base.refused_stale_generation + live.refused_stale,
        refused_other: base.refused_other
            + live.refused_head_moved
            + live.refused_invalid
            + live.refused_conflict
            + live.refused_forbidden
            + live.refused_other,
    }
}

fn ledger_error(path: &Path, message: String) -> WorkerError {
    WorkerError::runtime(
        "evidence counters",
        format!("{}: {message}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(t: &str, p: &str) -> ProjectKey {
        (TenantId::new(t).unwrap(), ProjectId::new(p).unwrap())
    }

    #[test]
    fn counters_saved_are_the_counters_loaded() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            EvidenceLedger::load(dir.path()).unwrap(),
            EvidenceLedger::default()
        );
        let counters = ProjectCounters {
            peak_processes: 4,
            messages_delivered: 9,
            roster_deltas_delivered: 7,
            self_fenced: 1,
        };
        let base = BrokerEvidence {
            commits_accepted: 3,
            accepted_from_non_current: 0,
            ended_during_commit: 1,
            refused_stale_generation: 1,
            refused_other: 2,
        };
        let live = BrokerStats {
            accepted: 2,
            refused_stale: 1,
            refused_conflict: 1,
            ..BrokerStats::default()
        };
        let ledger = EvidenceLedger::of(
            [(key("acme", "web"), counters)].into_iter(),
            broker_evidence(&base, &live),
        );
        ledger.save(dir.path()).unwrap();
        let text = fs::read_to_string(EvidenceLedger::path(dir.path())).unwrap();
        assert!(
            text.contains("\"peak_processes\": 4"),
            "flat per project: {text}"
        );
        let back = EvidenceLedger::load(dir.path()).unwrap();
        assert_eq!(back, ledger);
        assert_eq!(back.project_counters()[0].0, key("acme", "web"));
        assert_eq!(back.project_counters()[0].1.peak_processes, 4);
        assert_eq!(back.broker.commits_accepted, 5);
        assert_eq!(back.broker.refused_stale_generation, 2);
        assert_eq!(back.broker.refused_other, 3);
    }

    #[test]
    fn a_damaged_ledger_stops_the_start_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(EvidenceLedger::path(dir.path()), b"{not json").unwrap();
        let err = EvidenceLedger::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains(EVIDENCE_FILE_NAME), "{err}");
    }
}
