//! The worker's link to the control plane: REST to any node for registration, heartbeats and
//! reports (a follower forwards them), and the gRPC assignment stream from the leader.
//!
//! Reports carry idempotency keys derived from what they report (task, attempt, transition),
//! so a report whose answer was lost is resent safely and answered with the first result.

use backon::Retryable;
use squadron_client::types::{RegisterWorker, ReportProgress, ReportTransition};
use squadron_client::{ClientError, Consistency, GrpcLeader, SquadronClient};
use squadron_core::command::TransitionDetail;
use squadron_core::ids::{IdempotencyKey, TaskId};
use squadron_core::task::{Task, TaskState};
use squadron_core::Outcome;
use squadron_proto::v1 as pb;
use squadron_proto::v1::worker_service_client::WorkerServiceClient;

use crate::config::WorkerConfig;
use crate::error::WorkerError;
use crate::retry;
use crate::task::output_counter::OutputCounts;

/// Attempts of one report before the driver gives up on this pass.
pub(crate) const REPORT_ATTEMPTS_MAX: u32 = 8;
/// First pause between report attempts; doubled each time up to the max (`retry`).
pub(crate) const REPORT_BACKOFF_MS_MIN: u64 = 200;
pub(crate) const REPORT_BACKOFF_MS_MAX: u64 = 5_000;

/// What became of a report.
#[derive(Debug)]
pub(crate) enum ReportAnswer {
    /// Committed: the task is now in the returned state.
    Recorded(TaskState),
    /// The control plane refused it (another attempt owns the task, the state moved on).
    Refused(String),
}

#[derive(Debug, Clone)]
pub(crate) struct ControlLink {
    config: WorkerConfig,
    rest: SquadronClient,
    grpc: GrpcLeader,
}

impl ControlLink {
    /// Presents the worker's certificate on REST and gRPC and accepts only control nodes.
    pub(crate) fn new(
        config: WorkerConfig,
        tls: squadron_pki::TlsIdentity,
    ) -> Result<Self, WorkerError> {
        let credentials = squadron_client::Credentials::identity(tls);
        let rest =
            SquadronClient::secured(config.control.clone(), &credentials).map_err(control)?;
        let grpc = GrpcLeader::new(rest.clone());
        Ok(Self { config, rest, grpc })
    }

    pub(crate) fn rest(&self) -> &SquadronClient {
        &self.rest
    }

    pub(crate) async fn register(&self) -> Result<(), WorkerError> {
        let req = RegisterWorker {
            worker: self.config.id.clone(),
            address: self.config.advertised_url(),
            runtimes: self.config.runtimes.iter().copied().collect(),
            capacity: self.config.capacity,
            labels: Default::default(),
            heartbeat_interval_ms: Some(self.config.heartbeat_interval_ms),
        };
        let key = key(format!(
            "register-{}-{}",
            self.config.id,
            squadron_client::now_ms()
        ));
        self.rest
            .register_worker(&req, key.as_ref())
            .await
            .map(|_| ())
            .map_err(control)
    }

    /// A heartbeat; a refusal (the worker was declared lost) is answered by registering again.
    pub(crate) async fn heartbeat(&self) -> Result<(), WorkerError> {
        match self.rest.worker_heartbeat(&self.config.id, None).await {
            Ok(_) => Ok(()),
            Err(ClientError::Api { status, .. }) if status != 503 => self.register().await,
            Err(e) => Err(control(e)),
        }
    }

    /// Opens the assignment stream on the leader, following a follower's redirect.
    pub(crate) async fn watch(&self) -> Result<tonic::Streaming<pb::AssignmentEvent>, WorkerError> {
        let mut last = String::new();
        for _ in 0..3 {
            let (_, channel) = self.grpc.channel().await.map_err(control)?;
            let mut client = WorkerServiceClient::new(channel);
            let req = pb::WatchAssignmentsRequest {
                worker: self.config.id.to_string(),
            };
            match client.watch_assignments(req).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(status) => {
                    last = status.message().to_string();
                    if !self.grpc.on_error(&status).await {
                        break;
                    }
                }
            }
        }
        Err(WorkerError::Control(format!(
            "assignment stream refused: {last}"
        )))
    }

    /// Forgets the leader channel after the stream broke.
    pub(crate) async fn reset(&self) {
        self.grpc.reset().await;
    }

    pub(crate) async fn task(&self, id: TaskId) -> Result<Task, WorkerError> {
        self.rest
            .get_task(id, Consistency::Linearizable)
            .await
            .map_err(control)
    }

    /// Reports a transition, resending under the same key until it is answered.
    pub(crate) async fn transition(
        &self,
        task: TaskId,
        attempt: u32,
        from: TaskState,
        to: TaskState,
        detail: TransitionDetail,
    ) -> Result<ReportAnswer, WorkerError> {
        let req = ReportTransition {
            worker: self.config.id.clone(),
            attempt,
            from,
            to,
            detail,
        };
        let key = key(format!("t{task}-a{attempt}-{from}-{to}"));
        // Keyed by what it reports, so a resend whose first answer was lost is answered
        // with that first answer; only a transport failure or 503 is resent.
        let answer = (|| self.rest.report_transition(task, &req, key.as_ref()))
            .retry(retry::doubling(
                REPORT_BACKOFF_MS_MIN,
                REPORT_BACKOFF_MS_MAX,
                Some(REPORT_ATTEMPTS_MAX as usize - 1),
            ))
            .when(|e| !is_answer(e))
            .await;
        match answer {
            Ok(Outcome::TransitionRecorded { state }) => Ok(ReportAnswer::Recorded(state)),
            Ok(other) => Ok(ReportAnswer::Refused(format!(
                "unexpected answer {other:?}"
            ))),
            Err(ClientError::Api { status, body, .. }) if status != 503 => {
                Ok(ReportAnswer::Refused(body.message))
            }
            Err(e) => Err(WorkerError::Control(format!(
                "transition {from} → {to} of task {task} not answered after {REPORT_ATTEMPTS_MAX} attempts: {e}"
            ))),
        }
    }

    /// Best effort: a lost counter update is replaced by the next one.
    pub(crate) async fn progress(&self, task: TaskId, attempt: u32, c: OutputCounts) -> bool {
        let req = ReportProgress {
            worker: self.config.id.clone(),
            attempt,
            stdout_bytes: c.stdout_bytes,
            stderr_bytes: c.stderr_bytes,
            lines: c.lines,
            events: c.events,
        };
        self.rest.report_progress(task, &req, None).await.is_ok()
    }
}

fn key(s: String) -> Option<IdempotencyKey> {
    IdempotencyKey::new(s).ok()
}

/// The control plane decided (a refusal other than "unavailable"): resending changes nothing.
fn is_answer(e: &ClientError) -> bool {
    matches!(e, ClientError::Api { status, .. } if *status != 503)
}

fn control(e: ClientError) -> WorkerError {
    WorkerError::Control(e.to_string())
}
