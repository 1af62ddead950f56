//! What the clients of one run share: the workload's project, profiles and writer leases, and
//! the leases the clients hold.

use squadron_client::SquadronClient;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use squadron_client::Consistency;
use squadron_core::ids::{Generation, LeaseId, ProfileId, ProjectId, TaskId, TenantId, WorkerId};
use squadron_core::lease::LeaseHolder;

use crate::workload::Workload;

/// Leases the clients hold (acknowledged), and acquisitions in flight, per profile: a live
/// lease in neither is an orphan of an unknown outcome, and is released.
#[derive(Debug, Default)]
pub struct Holdings {
    pub held: HashMap<ProfileId, Generation>,
    pub in_flight: HashMap<ProfileId, usize>,
}

/// The `tasks` workload's tasks: every one submitted, and those not seen ended yet.
#[derive(Debug, Default)]
pub struct TaskPool {
    pub all: Vec<TaskId>,
    pub live: Vec<TaskId>,
}

/// What the clients of one run share.
#[derive(Debug)]
pub struct WorkloadContext {
    pub workload: Workload,
    pub tenant: TenantId,
    pub project: ProjectId,
    pub worker: WorkerId,
    pub profiles: Vec<ProfileId>,
    /// The writer lease of each profile (capsule workload).
    pub writers: BTreeMap<ProfileId, (LeaseId, Generation)>,
    pub holdings: Mutex<Holdings>,
    /// The consistency of the clients' reads (the quiet phase always reads linearizably).
    pub reads: Consistency,
    /// A client presenting the worker's certificate: registration, heartbeats and reap
    /// evidence are the worker's own, and an operator's token is refused for them.
    pub as_worker: SquadronClient,
    /// The tasks submitted (`tasks` workload).
    pub tasks: Mutex<TaskPool>,
}

impl WorkloadContext {
    pub fn live_tasks(&self) -> Vec<TaskId> {
        self.tasks
            .lock()
            .map(|p| p.live.clone())
            .unwrap_or_default()
    }

    pub fn all_tasks(&self) -> Vec<TaskId> {
        self.tasks.lock().map(|p| p.all.clone()).unwrap_or_default()
    }

    pub fn add_task(&self, task: TaskId) {
        if let Ok(mut p) = self.tasks.lock() {
            p.all.push(task);
            p.live.push(task);
        }
    }

    /// A client saw the task end: nobody moves it any more.
    pub fn end_task(&self, task: TaskId) {
        if let Ok(mut p) = self.tasks.lock() {
            p.live.retain(|t| *t != task);
        }
    }

    pub fn holder(&self, process: u64) -> LeaseHolder {
        LeaseHolder {
            worker: self.worker.clone(),
            process: format!("jepsen process {process}"),
            cgroup: None,
        }
    }
}
