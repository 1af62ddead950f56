//! `WorkerService`.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use squadron_core::command::{
    RecordReapEvidence, RegisterWorker, RegisterWorkerWithPolicy, RenewLeases, ReportProgress,
    ReportProgressV2, ReportTransition, SetWorkerPolicy, TransitionDetail, WorkerHeartbeat,
};
use squadron_core::ids::{Generation, LeaseId, ProfileId, TaskId, WorkerId};
use squadron_core::lease::{EvidenceSource, FencingToken, ReapEvidence};
use squadron_core::manifest::{Keyword as _, RuntimeKind};
use squadron_core::task::TaskState;
use squadron_core::worker_policy::WorkerPolicy;
use squadron_core::{Command, Outcome, ValidationError};
use squadron_proto::v1 as pb;
use squadron_proto::v1::worker_service_server::WorkerService;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::{caller_of, invalid, key_of, propose, require_leader, unexpected};
use crate::node::ControlNode;

/// How often an assignment stream looks for new assignments when nothing was applied.
pub const ASSIGNMENT_POLL_MS: u64 = 200;
/// Assignments buffered per stream before the sender waits for the worker.
pub const ASSIGNMENT_STREAM_BUFFER: usize = 64;

#[derive(Debug, Clone)]
pub struct WorkerGrpc {
    node: Arc<ControlNode>,
}

impl WorkerGrpc {
    pub fn new(node: Arc<ControlNode>) -> Self {
        Self { node }
    }
}

fn worker_id(raw: &str) -> Result<WorkerId, Status> {
    WorkerId::new(raw).map_err(invalid)
}

pub(crate) fn fence_of(f: &pb::FencingToken) -> Result<FencingToken, Status> {
    Ok(FencingToken {
        profile: ProfileId::new(f.profile).map_err(invalid)?,
        lease: LeaseId::new(f.lease).map_err(invalid)?,
        generation: Generation::new(f.generation),
    })
}

type AssignmentStream = Pin<Box<dyn Stream<Item = Result<pb::AssignmentEvent, Status>> + Send>>;

#[tonic::async_trait]
impl WorkerService for WorkerGrpc {
    async fn register(
        &self,
        request: Request<pb::RegisterWorkerRequest>,
    ) -> Result<Response<pb::RegisterWorkerReply>, Status> {
        let caller = caller_of(&request)?;
        let key = key_of(&request)?;
        let r = request.into_inner();
        let runtimes = r
            .runtimes
            .iter()
            .map(|s| RuntimeKind::parse("runtimes", s).map_err(invalid))
            .collect::<Result<Vec<_>, _>>()?;
        let registration = RegisterWorker {
            worker: worker_id(&r.worker)?,
            address: r.address,
            runtimes,
            capacity: r.capacity,
            labels: r.labels.into_iter().collect(),
            heartbeat_interval_ms: r.heartbeat_interval_ms,
        };
        let command = match r.policy {
            Some(policy) => Command::RegisterWorkerWithPolicy(RegisterWorkerWithPolicy {
                registration,
                policy: WorkerPolicy::try_from(policy).map_err(|e| invalid(e.into()))?,
            }),
            None => Command::RegisterWorker(registration),
        };
        propose(&self.node, &caller, key, command).await?;
        Ok(Response::new(pb::RegisterWorkerReply {}))
    }

    async fn set_worker_policy(
        &self,
        request: Request<pb::SetWorkerPolicyRequest>,
    ) -> Result<Response<pb::SetWorkerPolicyReply>, Status> {
        let caller = caller_of(&request)?;
        let key = key_of(&request)?;
        let r = request.into_inner();
        let policy = r
            .policy
            .ok_or_else(|| invalid(ValidationError::new("policy", "missing")))?;
        let command = Command::SetWorkerPolicy(SetWorkerPolicy {
            worker: worker_id(&r.worker)?,
            policy: WorkerPolicy::try_from(policy).map_err(|e| invalid(e.into()))?,
        });
        propose(&self.node, &caller, key, command).await?;
        Ok(Response::new(pb::SetWorkerPolicyReply {}))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::WorkerHeartbeatRequest>,
    ) -> Result<Response<pb::WorkerHeartbeatReply>, Status> {
        let caller = caller_of(&request)?;
        let worker = worker_id(&request.into_inner().worker)?;
        propose(
            &self.node,
            &caller,
            None,
            Command::WorkerHeartbeat(WorkerHeartbeat { worker }),
        )
        .await?;
        Ok(Response::new(pb::WorkerHeartbeatReply {}))
    }

    type WatchAssignmentsStream = AssignmentStream;

    async fn watch_assignments(
        &self,
        request: Request<pb::WatchAssignmentsRequest>,
    ) -> Result<Response<Self::WatchAssignmentsStream>, Status> {
        let caller = caller_of(&request)?;
        require_leader(&self.node)?;
        let worker = worker_id(&request.into_inner().worker)?;
        // A stream of assignments carries prompts and specs: only to the worker they are for.
        super::itself(&caller, &worker, "watch its assignments")?;
        let node = self.node.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(ASSIGNMENT_STREAM_BUFFER);
        tokio::spawn(async move {
            // Keyed with the cancel flag, so a cancellation re-sends the task's event.
            let mut sent: BTreeSet<(TaskId, u32, bool)> = BTreeSet::new();
            let mut applied = node.raft.metrics();
            loop {
                if let Err(s) = require_leader(&node) {
                    let _ = tx.send(Err(s)).await;
                    return;
                }
                let events: Vec<pb::AssignmentEvent> = node.state.with_state(|s| {
                    let Some(w) = s.worker(&worker) else {
                        return Vec::new();
                    };
                    let current: BTreeSet<(TaskId, u32, bool)> = w
                        .tasks
                        .iter()
                        .filter_map(|id| {
                            s.task(*id)
                                .map(|t| (t.id, t.attempt, t.cancel_requested.is_some()))
                        })
                        .collect();
                    sent.retain(|k| current.contains(k));
                    current
                        .iter()
                        .filter(|k| !sent.contains(k))
                        .filter_map(|(id, _, _)| s.task(*id))
                        .map(|t| {
                            let lease = s.task_lease(t.id).and_then(|l| s.lease(l));
                            pb::AssignmentEvent {
                                task: t.id.get(),
                                attempt: t.attempt,
                                state: t.state.as_str().to_string(),
                                cancel_requested: t.cancel_requested.clone().unwrap_or_default(),
                                spec: Some((&t.spec).into()),
                                lease: lease.map_or(0, |l| l.id.get()),
                                generation: lease.map_or(0, |l| l.generation.get()),
                            }
                        })
                        .collect()
                });
                for e in events {
                    let key = match TaskId::new(e.task) {
                        Ok(id) => (id, e.attempt, !e.cancel_requested.is_empty()),
                        Err(_) => continue,
                    };
                    if tx.send(Ok(e)).await.is_err() {
                        return;
                    }
                    sent.insert(key);
                }
                tokio::select! {
                    changed = applied.changed() => if changed.is_err() { return },
                    _ = tokio::time::sleep(Duration::from_millis(ASSIGNMENT_POLL_MS)) => {}
                }
                if tx.is_closed() {
                    return;
                }
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn report_transition(
        &self,
        request: Request<pb::ReportTransitionRequest>,
    ) -> Result<Response<pb::ReportTransitionReply>, Status> {
        let caller = caller_of(&request)?;
        let key = key_of(&request)?;
        let r = request.into_inner();
        let command = Command::ReportTransition(ReportTransition {
            task: TaskId::new(r.task).map_err(invalid)?,
            worker: worker_id(&r.worker)?,
            attempt: r.attempt,
            from: TaskState::parse("from", &r.from).map_err(invalid)?,
            to: TaskState::parse("to", &r.to).map_err(invalid)?,
            detail: TransitionDetail {
                exit_code: r.has_exit_code.then_some(r.exit_code),
                error: (!r.error.is_empty()).then_some(r.error),
                artifacts: r.artifacts,
            },
        });
        match propose(&self.node, &caller, key, command).await? {
            Outcome::TransitionRecorded { state } => Ok(Response::new(pb::ReportTransitionReply {
                state: state.as_str().into(),
            })),
            o => Err(unexpected(&o)),
        }
    }

    async fn report_progress(
        &self,
        request: Request<pb::ReportProgressRequest>,
    ) -> Result<Response<pb::ReportProgressReply>, Status> {
        let caller = caller_of(&request)?;
        let key = key_of(&request)?;
        let r = request.into_inner();
        let command = Command::ReportProgressV2(ReportProgressV2 {
            counts: ReportProgress {
                task: TaskId::new(r.task).map_err(invalid)?,
                worker: worker_id(&r.worker)?,
                attempt: r.attempt,
                stdout_bytes: r.stdout_bytes,
                stderr_bytes: r.stderr_bytes,
                lines: r.lines,
                events: r.events,
            },
            provider: r.provider.map(Into::into),
        });
        propose(&self.node, &caller, key, command).await?;
        Ok(Response::new(pb::ReportProgressReply {}))
    }

    async fn renew_leases(
        &self,
        request: Request<pb::RenewLeasesRequest>,
    ) -> Result<Response<pb::RenewLeasesReply>, Status> {
        let caller = caller_of(&request)?;
        let r = request.into_inner();
        let fences = r
            .fences
            .iter()
            .map(fence_of)
            .collect::<Result<Vec<_>, _>>()?;
        let command = Command::RenewLeases(RenewLeases {
            worker: worker_id(&r.worker)?,
            fences,
            ttl_ms: r.ttl_ms,
        });
        match propose(&self.node, &caller, None, command).await? {
            Outcome::LeasesRenewed { results } => Ok(Response::new(pb::RenewLeasesReply {
                results: results
                    .into_iter()
                    .map(|x| match x.result {
                        Ok(expires_at_ms) => pb::RenewalResult {
                            lease: x.lease.get(),
                            renewed: true,
                            expires_at_ms,
                            code: String::new(),
                            message: String::new(),
                        },
                        Err(e) => pb::RenewalResult {
                            lease: x.lease.get(),
                            renewed: false,
                            expires_at_ms: 0,
                            code: e.code().as_str().into(),
                            message: e.to_string(),
                        },
                    })
                    .collect(),
            })),
            o => Err(unexpected(&o)),
        }
    }

    async fn record_reap_evidence(
        &self,
        request: Request<pb::ReapEvidenceRequest>,
    ) -> Result<Response<pb::ReapEvidenceReply>, Status> {
        let caller = caller_of(&request)?;
        let key = key_of(&request)?;
        let r = request.into_inner();
        let command = Command::RecordReapEvidence(RecordReapEvidence {
            profile: ProfileId::new(r.profile).map_err(invalid)?,
            evidence: ReapEvidence {
                lease: LeaseId::new(r.lease).map_err(invalid)?,
                generation: Generation::new(r.generation),
                cgroup: r.cgroup,
                populated: r.populated,
                observed_at_ms: r.observed_at_ms,
                source: EvidenceSource::CgroupEvents,
            },
        });
        match propose(&self.node, &caller, key, command).await? {
            Outcome::EvidenceRecorded { slot_freed } => {
                Ok(Response::new(pb::ReapEvidenceReply { slot_freed }))
            }
            o => Err(unexpected(&o)),
        }
    }
}
