//! Worker registration, heartbeats, decommissioning and the leader's periodic sweep.

use std::collections::{BTreeMap, BTreeSet};

use crate::access::{Identity, Subject};
use crate::command::{
    DecommissionWorker, RegisterWorker, RegisterWorkerWithPolicy, SetWorkerPolicy, WorkerHeartbeat,
};
use crate::ids::WorkerId;
use crate::lease::check_descriptor;
use crate::limits::{
    ADDRESS_BYTES_MAX, LABELS_MAX, WORKER_CAPACITY_MAX, WORKER_HEARTBEAT_INTERVAL_MS_MAX,
    WORKER_HEARTBEAT_INTERVAL_MS_MIN, WORKER_MISSED_HEARTBEATS_MAX,
};
use crate::manifest::RuntimeKind;
use crate::rejection::Rejection;
use crate::response::{Outcome, SweepReport};
use crate::state::State;
use crate::worker::{Worker, WorkerStatus};

/// Label keys and values as on manifests: short, printable.
fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), Rejection> {
    if labels.len() > LABELS_MAX {
        return Err(Rejection::invalid(
            "labels",
            format!(
                "must hold at most {LABELS_MAX} labels, got {}",
                labels.len()
            ),
        ));
    }
    for (k, v) in labels {
        let ok_key = !k.is_empty()
            && k.len() <= 63
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'));
        if !ok_key {
            return Err(Rejection::invalid(
                format!("labels.{k}"),
                "keys are 1 to 63 characters of a-z, A-Z, 0-9, '.', '_', '-', '/'",
            ));
        }
        if v.len() > 256 || v.chars().any(char::is_control) {
            return Err(Rejection::invalid(
                format!("labels.{k}"),
                "values are at most 256 printable bytes",
            ));
        }
    }
    Ok(())
}

impl State {
    pub(crate) fn register_worker(
        &mut self,
        now: u64,
        subject: &Subject,
        command: RegisterWorker,
    ) -> Result<Outcome, Rejection> {
        self.require_worker(subject, &command.worker)?;
        let RegisterWorker {
            worker: id,
            address,
            runtimes,
            capacity,
            labels,
            heartbeat_interval_ms,
        } = command;
        check_descriptor("address", &address, true)?;
        if address.len() > ADDRESS_BYTES_MAX {
            return Err(Rejection::invalid(
                "address",
                format!("must be at most {ADDRESS_BYTES_MAX} bytes"),
            ));
        }
        if runtimes.is_empty() {
            return Err(Rejection::invalid(
                "runtimes",
                "must offer at least one runtime",
            ));
        }
        if capacity == 0 || capacity > WORKER_CAPACITY_MAX {
            return Err(Rejection::invalid(
                "capacity",
                format!("must be between 1 and {WORKER_CAPACITY_MAX}, got {capacity}"),
            ));
        }
        if !(WORKER_HEARTBEAT_INTERVAL_MS_MIN..=WORKER_HEARTBEAT_INTERVAL_MS_MAX)
            .contains(&heartbeat_interval_ms)
        {
            return Err(Rejection::invalid(
                "heartbeat_interval_ms",
                format!(
                    "must be between {WORKER_HEARTBEAT_INTERVAL_MS_MIN} and \
                     {WORKER_HEARTBEAT_INTERVAL_MS_MAX}, got {heartbeat_interval_ms}"
                ),
            ));
        }
        check_labels(&labels)?;
        let runtimes: BTreeSet<RuntimeKind> = runtimes.into_iter().collect();
        let ttl_ms = heartbeat_interval_ms * WORKER_MISSED_HEARTBEATS_MAX;
        // A restarted worker registers again under its id and keeps its assigned tasks, which
        // it re-adopts; a lost or decommissioned one comes back empty-handed.
        let tasks = self
            .workers
            .remove(&id)
            .map(|w| w.tasks)
            .unwrap_or_default();
        self.workers.insert(
            id.clone(),
            Worker {
                id,
                address,
                runtimes,
                capacity,
                labels,
                status: WorkerStatus::Alive,
                registered_at_ms: now,
                last_heartbeat_ms: now,
                ttl_ms,
                tasks,
            },
        );
        Ok(Outcome::WorkerRegistered)
    }

    /// Registers and sets the policy together; a refused registration sets nothing.
    pub(crate) fn register_worker_with_policy(
        &mut self,
        now: u64,
        subject: &Subject,
        command: RegisterWorkerWithPolicy,
    ) -> Result<Outcome, Rejection> {
        let RegisterWorkerWithPolicy {
            registration,
            policy,
        } = command;
        let worker = registration.worker.clone();
        let outcome = self.register_worker(now, subject, registration)?;
        self.worker_policies.insert(worker, policy);
        Ok(outcome)
    }

    pub(crate) fn worker_heartbeat(
        &mut self,
        now: u64,
        subject: &Subject,
        command: WorkerHeartbeat,
    ) -> Result<Outcome, Rejection> {
        self.require_worker(subject, &command.worker)?;
        let id = &command.worker;
        let w = self.worker_ref(id)?;
        if w.status != WorkerStatus::Alive {
            return Err(Rejection::WorkerUnavailable {
                reason: format!("worker {id} is {:?}; register again", w.status),
            });
        }
        self.workers
            .get_mut(id)
            .expect("checked above")
            .last_heartbeat_ms = now;
        self.renew_task_leases(now, id);
        Ok(Outcome::WorkerHeartbeatRecorded)
    }

    /// A registered worker states what it runs; tasks already assigned to it keep running.
    pub(crate) fn set_worker_policy(
        &mut self,
        subject: &Subject,
        c: SetWorkerPolicy,
    ) -> Result<Outcome, Rejection> {
        self.require_worker(subject, &c.worker)?;
        self.worker_ref(&c.worker)?;
        self.worker_policies.insert(c.worker, c.policy);
        Ok(Outcome::WorkerPolicySet)
    }

    pub(crate) fn decommission_worker(
        &mut self,
        now: u64,
        subject: &Subject,
        command: DecommissionWorker,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(now, subject)?;
        let DecommissionWorker {
            worker,
            operator,
            reason,
        } = command;
        let id = &worker;
        Self::check_reason("operator", &operator)?;
        Self::check_reason("reason", &reason)?;
        let w = self.worker_ref(id)?;
        if w.status == WorkerStatus::Decommissioned {
            return Err(Rejection::WorkerUnavailable {
                reason: format!("worker {id} is already decommissioned"),
            });
        }
        let leases_reaped = self.reap_leases_of_worker(now, id, &operator, &reason);
        // Its certificates stop being believed on every node once this applies.
        self.revoke_certificates_of(now, &Identity::Worker(id.clone()));
        let (tasks_requeued, tasks_failed) = self.orphan_tasks_of(now, id, "was decommissioned");
        // The project sandboxes it hosted are gone with it (INV-1 allows a new one).
        let hosted: Vec<crate::state::ProjectKey> = self
            .projects
            .iter()
            .filter(|(_, p)| p.sandbox.as_ref().is_some_and(|s| &s.worker == id))
            .map(|(key, _)| key.clone())
            .collect();
        for key in hosted {
            let project = self.projects.get_mut(&key).expect("listed above");
            assert_eq!(
                project.slots_held, 0,
                "INV-5: sandbox leases were reaped first"
            );
            project.sandbox = None;
        }
        self.workers.get_mut(id).expect("checked above").status = WorkerStatus::Decommissioned;
        Ok(Outcome::WorkerDecommissioned {
            leases_reaped,
            tasks_requeued,
            tasks_failed,
        })
    }

    /// True when a sweep at `now_ms` by a leader whose term started at `term_started_ms` would
    /// change something; lets the leader skip idle sweeps instead of writing an entry every
    /// interval.
    pub fn sweep_due(&self, now_ms: u64, term_started_ms: u64) -> bool {
        let now = now_ms.max(self.clock_ms);
        self.lease_expiry
            .get_min()
            .is_some_and(|(at, _)| *at <= now)
            || self.silent_workers(now, term_started_ms).next().is_some()
            || self
                .idempotency
                .oldest_at()
                .is_some_and(|at| at.saturating_add(crate::limits::IDEMPOTENCY_RETENTION_MS) <= now)
    }

    /// Alive workers silent past their TTL, counted from no earlier than `term_started_ms`.
    fn silent_workers(&self, now: u64, term_started_ms: u64) -> impl Iterator<Item = &Worker> {
        self.workers.values().filter(move |w| {
            w.status == WorkerStatus::Alive && w.is_silent_since(now, term_started_ms)
        })
    }

    /// `term_started_ms` is the proposing leader's term start (`LeaderSweep`), 0 for the older
    /// `Sweep` that gave no grace.
    pub(crate) fn sweep(&mut self, now: u64, term_started_ms: u64) -> Result<Outcome, Rejection> {
        let leases_fenced = self.fence_expired(now);
        let silent: Vec<WorkerId> = self
            .silent_workers(now, term_started_ms)
            .map(|w| w.id.clone())
            .collect();
        let mut report = SweepReport {
            leases_fenced,
            ..SweepReport::default()
        };
        for id in silent {
            self.workers.get_mut(&id).expect("listed above").status = WorkerStatus::Lost;
            let (requeued, failed) = self.orphan_tasks_of(now, &id, "was lost");
            report.tasks_requeued.extend(requeued);
            report.tasks_failed.extend(failed);
            report.workers_lost.push(id.to_string());
        }
        report.idempotency_pruned = self.idempotency.prune(now);
        self.prune_access(now);
        self.prune_agent_tokens();
        self.prune_credential_leases(now);
        self.prune_agent_credential_leases(now);
        Ok(Outcome::Swept(report))
    }
}
