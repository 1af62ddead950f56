//! The worker's link to the control plane: gRPC to the leader (following a follower's
//! redirect) for everything — registration, the policy, heartbeats, the assignment stream,
//! the reports (transitions, progress), the agent supervisor's renewals and reap evidence
//! (`WorkerService`, protobuf), and the calls REST serves too (`WorkerControl`, in the API's
//! own types: `calls`). REST is used only to find the leader.
//!
//! Reports carry idempotency keys derived from what they report (task, attempt, transition),
//! so a report whose answer was lost is resent safely and answered with the first result.

mod calls;

use backon::Retryable;
use squadron_api::error_body::{ERROR_BODY_METADATA, ERROR_CODE_METADATA};
use squadron_api::{TraceId, TRACEPARENT_HEADER};
use squadron_client::ErrorBody;
use squadron_client::{ClientError, GrpcLeader, SquadronClient};
use squadron_core::command::TransitionDetail;
use squadron_core::error_code::{ErrorCode, ERROR_CODE_TABLE};
use squadron_core::ids::TaskId;
use squadron_core::lease::FencingToken;
use squadron_core::manifest::Keyword as _;
use squadron_core::task::{ProviderProgress, TaskState};
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
    /// The leader channel; it asks any node over REST only to find the leader.
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
        let grpc = GrpcLeader::new(rest);
        Ok(Self { config, grpc })
    }

    /// Registers with the policy in the same entry: the scheduler places tasks here only as
    /// it allows, from the first moment the worker is alive.
    pub(crate) async fn register(&self) -> Result<(), WorkerError> {
        let req = pb::RegisterWorkerRequest {
            worker: self.config.id.to_string(),
            address: self.config.advertised_url(),
            runtimes: self
                .config
                .runtimes
                .iter()
                .map(|r| r.as_str().to_owned())
                .collect(),
            capacity: self.config.capacity,
            labels: Default::default(),
            heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            policy: Some((&self.config.policy).into()),
        };
        // A fresh key per registration: registering again after being declared lost is a
        // new registration, not a resend of the first.
        let key = format!("register-{}-{}", self.config.id, squadron_client::now_ms());
        self.call_leader(CONTROL_ATTEMPTS_MAX, |mut client| {
            let mut request = tonic::Request::new(req.clone());
            keyed(&mut request, &key);
            async move { client.register(request).await }
        })
        .await
        .map(|_| ())
        .map_err(|e| e.into_error("registration"))
    }

    /// A heartbeat; the refusal that says the worker is not alive (declared lost, or unknown
    /// to the control plane) is answered by registering again. Any other refusal — a write
    /// whose outcome is unknown after a leader change, an overloaded leader — is an error
    /// for the next tick to retry: registering again would start a new registration of a
    /// worker that was never lost.
    pub(crate) async fn heartbeat(&self) -> Result<(), WorkerError> {
        let req = pb::WorkerHeartbeatRequest {
            worker: self.config.id.to_string(),
        };
        let answer = self
            .call_leader(CONTROL_ATTEMPTS_MAX, |mut client| {
                let request = tonic::Request::new(req.clone());
                async move { client.heartbeat(request).await }
            })
            .await;
        match answer {
            Ok(_) => Ok(()),
            Err(LeaderCall::Refused(status))
                if matches!(
                    status.code(),
                    tonic::Code::FailedPrecondition | tonic::Code::NotFound
                ) =>
            {
                tracing::info!(
                    refusal = status.message(),
                    "heartbeat refused; registering again"
                );
                self.register().await
            }
            Err(e) => Err(e.into_error("heartbeat")),
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

    /// Reports a transition to the leader over gRPC, resending under the same key (and trace
    /// id) until it is answered (a follower's refusal names the leader; the next attempt goes
    /// there).
    pub(crate) async fn transition(
        &self,
        trace: TraceId,
        task: TaskId,
        attempt: u32,
        from: TaskState,
        to: TaskState,
        detail: TransitionDetail,
    ) -> Result<ReportAnswer, WorkerError> {
        let req = pb::ReportTransitionRequest {
            task: task.get(),
            worker: self.config.id.to_string(),
            attempt,
            from: from.as_str().into(),
            to: to.as_str().into(),
            exit_code: detail.exit_code.unwrap_or_default(),
            has_exit_code: detail.exit_code.is_some(),
            error: detail.error.unwrap_or_default(),
            artifacts: detail.artifacts,
        };
        // Keyed by what it reports, so a resend whose first answer was lost is answered
        // with that first answer; only a transport failure or UNAVAILABLE is resent.
        let key = format!("t{task}-a{attempt}-{from}-{to}");
        let answer = self
            .call_leader(REPORT_ATTEMPTS_MAX, |mut client| {
                let mut request = tonic::Request::new(req.clone());
                keyed(&mut request, &key);
                traced(&mut request, trace);
                async move { client.report_transition(request).await }
            })
            .await;
        match answer {
            Ok(reply) => match TaskState::parse("state", &reply.state) {
                Ok(state) => Ok(ReportAnswer::Recorded(state)),
                Err(e) => Ok(ReportAnswer::Refused(format!("unexpected answer: {e}"))),
            },
            Err(LeaderCall::Refused(status)) => {
                Ok(ReportAnswer::Refused(status.message().to_string()))
            }
            Err(LeaderCall::Unanswered(e)) => Err(WorkerError::Control(format!(
                "transition {from} → {to} of task {task} not answered after {REPORT_ATTEMPTS_MAX} attempts: {e}"
            ))),
        }
    }

    /// Best effort: a lost counter update is replaced by the next one.
    pub(crate) async fn progress(
        &self,
        task: TaskId,
        attempt: u32,
        c: OutputCounts,
        provider: Option<ProviderProgress>,
    ) -> bool {
        let req = pb::ReportProgressRequest {
            task: task.get(),
            worker: self.config.id.to_string(),
            attempt,
            stdout_bytes: c.stdout_bytes,
            stderr_bytes: c.stderr_bytes,
            lines: c.lines,
            events: c.events,
            provider: provider.as_ref().map(Into::into),
        };
        self.call_leader(PROGRESS_ATTEMPTS_MAX, |mut client| {
            let request = tonic::Request::new(req.clone());
            async move { client.report_progress(request).await }
        })
        .await
        .is_ok()
    }

    /// Renews the agent supervisor's leases in one batch. Not keyed: a later batch of the
    /// same leases is a new renewal, not a resend.
    pub(crate) async fn renew_leases(
        &self,
        fences: &[FencingToken],
        ttl_ms: u64,
    ) -> Result<pb::RenewLeasesReply, CallError> {
        let req = pb::RenewLeasesRequest {
            worker: self.config.id.to_string(),
            fences: fences.iter().map(fence).collect(),
            ttl_ms,
        };
        self.call_leader(CONTROL_ATTEMPTS_MAX, |mut client| {
            let request = tonic::Request::new(req.clone());
            async move { client.renew_leases(request).await }
        })
        .await
        .map_err(CallError::from)
    }

    /// Records reap evidence; `Ok(slot_freed)`. Keyed by what it proves (lease, generation,
    /// observation), so a resend whose answer was lost is answered with the first answer.
    pub(crate) async fn record_evidence(
        &self,
        req: pb::ReapEvidenceRequest,
    ) -> Result<bool, CallError> {
        let key = format!(
            "evidence-l{}-g{}-{}",
            req.lease, req.generation, req.observed_at_ms
        );
        self.call_leader(CONTROL_ATTEMPTS_MAX, |mut client| {
            let mut request = tonic::Request::new(req.clone());
            keyed(&mut request, &key);
            async move { client.record_reap_evidence(request).await }
        })
        .await
        .map(|reply| reply.slot_freed)
        .map_err(CallError::from)
    }

    /// One call to the leader's `WorkerService`, retried with doubling pauses (`retry`) while
    /// it is not answered (no channel, a broken connection, UNAVAILABLE — a follower's refusal
    /// or no leader yet); any other status is the control plane's answer, returned as is.
    async fn call_leader<T, F, Fut>(&self, attempts: u32, call: F) -> Result<T, LeaderCall>
    where
        F: Fn(WorkerServiceClient<tonic::transport::Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_channel(attempts, |channel| call(WorkerServiceClient::new(channel)))
            .await
    }

    /// [`ControlLink::call_leader`] for any service on the leader channel.
    async fn call_channel<T, F, Fut>(&self, attempts: u32, call: F) -> Result<T, LeaderCall>
    where
        F: Fn(tonic::transport::Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let once = || async {
            let (_, channel) = self
                .grpc
                .channel()
                .await
                .map_err(|e| LeaderCall::Unanswered(e.to_string()))?;
            match call(channel).await {
                Ok(reply) => Ok(reply.into_inner()),
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    // Follows a redirect when the refusal names the leader, else rediscovers.
                    self.grpc.on_error(&status).await;
                    Err(LeaderCall::Unanswered(status.message().to_string()))
                }
                Err(status) if status.code() == tonic::Code::Unknown => {
                    // A broken connection surfaces as UNKNOWN: rediscover and resend.
                    self.grpc.reset().await;
                    Err(LeaderCall::Unanswered(status.message().to_string()))
                }
                Err(status) => Err(LeaderCall::Refused(status)),
            }
        };
        once.retry(retry::doubling(
            REPORT_BACKOFF_MS_MIN,
            REPORT_BACKOFF_MS_MAX,
            Some(attempts.saturating_sub(1) as usize),
        ))
        .when(|e| matches!(e, LeaderCall::Unanswered(_)))
        .await
    }
}

/// What became of a call to the leader.
#[derive(Debug)]
pub(crate) enum LeaderCall {
    /// The control plane answered with a refusal.
    Refused(tonic::Status),
    /// No answer after every attempt: the last failure.
    Unanswered(String),
}

/// Why a call to the leader did not succeed, as the agent supervisor acts on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The control plane refused: the error body it would have answered over REST.
    Refused(ErrorBody),
    /// No answer after every attempt: the last failure.
    Unanswered(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Refused(body) => write!(f, "{}: {}", body.code.as_str(), body.message),
            CallError::Unanswered(e) => write!(f, "the leader did not answer: {e}"),
        }
    }
}

impl From<CallError> for WorkerError {
    fn from(e: CallError) -> Self {
        WorkerError::Control(e.to_string())
    }
}

impl From<LeaderCall> for CallError {
    fn from(e: LeaderCall) -> Self {
        match e {
            LeaderCall::Refused(status) => CallError::Refused(error_body(&status)),
            LeaderCall::Unanswered(e) => CallError::Unanswered(e),
        }
    }
}

/// The refusal's error body from its metadata; for a refusal without one (the listener's
/// guard, a body too large to carry) one made of its code and message.
pub(crate) fn error_body(status: &tonic::Status) -> ErrorBody {
    let carried = status
        .metadata()
        .get_bin(ERROR_BODY_METADATA)
        .and_then(|v| v.to_bytes().ok())
        .and_then(|bytes| serde_json::from_slice::<ErrorBody>(&bytes).ok());
    if let Some(body) = carried {
        return body;
    }
    let named = status
        .metadata()
        .get(ERROR_CODE_METADATA)
        .and_then(|v| v.to_str().ok())
        .and_then(|name| serde_json::from_value::<ErrorCode>(name.into()).ok());
    let by_number = || {
        ERROR_CODE_TABLE
            .iter()
            .find(|row| row.grpc_code == status.code() as i32)
            .map(|row| row.code)
    };
    ErrorBody {
        code: named.or_else(by_number).unwrap_or(ErrorCode::Internal),
        message: status.message().to_string(),
        field: None,
        rejection: None,
    }
}

fn fence(t: &FencingToken) -> pb::FencingToken {
    pb::FencingToken {
        profile: t.profile.get(),
        lease: t.lease.get(),
        generation: t.generation.get(),
    }
}

impl LeaderCall {
    fn into_error(self, what: &str) -> WorkerError {
        match self {
            LeaderCall::Refused(status) => {
                WorkerError::Control(format!("{what} refused: {}", status.message()))
            }
            LeaderCall::Unanswered(e) => WorkerError::Control(format!("{what} not answered: {e}")),
        }
    }
}

/// Attempts of one progress report (best effort: the next one replaces it).
const PROGRESS_ATTEMPTS_MAX: u32 = 2;
/// Attempts of a registration, a policy or a heartbeat: enough to follow a follower's
/// redirect; the callers try again (registration at start-up, the next heartbeat).
const CONTROL_ATTEMPTS_MAX: u32 = 3;
/// Attempts of a `WorkerControl` call: pauses of 0.2 + 0.4 + 0.8 + 1.6 s outlast an election,
/// so an operator's launch or a broker's fence check waits out a leader change.
const CALL_ATTEMPTS_MAX: u32 = 5;

/// The idempotency key of a call, in the metadata the server reads it from.
/// Sends the call's trace id as W3C `traceparent` metadata: the leader names it in the log line
/// of the command the call proposed, as the worker does in its own.
fn traced<T>(request: &mut tonic::Request<T>, trace: TraceId) {
    if let Ok(value) = tonic::metadata::MetadataValue::try_from(trace.traceparent()) {
        request.metadata_mut().insert(TRACEPARENT_HEADER, value);
    }
}

fn keyed<T>(request: &mut tonic::Request<T>, key: &str) {
    // The REST header's name; gRPC metadata keys are lowercase.
    let name = squadron_client::IDEMPOTENCY_HEADER.to_ascii_lowercase();
    if let (Ok(name), Ok(value)) = (
        tonic::metadata::AsciiMetadataKey::from_bytes(name.as_bytes()),
        tonic::metadata::MetadataValue::try_from(key),
    ) {
        request.metadata_mut().insert(name, value);
    }
}

fn control(e: ClientError) -> WorkerError {
    WorkerError::Control(e.to_string())
}

#[cfg(test)]
mod tests {
    use squadron_core::ids::Generation;
    use squadron_core::Rejection;

    use super::*;

    #[test]
    fn a_refusal_is_read_as_the_error_body_it_carries() {
        let body = ErrorBody {
            code: ErrorCode::FailedPrecondition,
            message: "stale generation: expected 1, current is 2".into(),
            field: None,
            rejection: Some(Rejection::StaleGeneration {
                expected: Generation::new(1),
                current: Generation::new(2),
            }),
        };
        let mut status = tonic::Status::failed_precondition("what the message says");
        status.metadata_mut().insert_bin(
            ERROR_BODY_METADATA,
            tonic::metadata::MetadataValue::from_bytes(&serde_json::to_vec(&body).unwrap()),
        );
        assert_eq!(error_body(&status), body);
    }

    #[test]
    fn a_refusal_without_a_body_keeps_its_code_and_message() {
        let mut status = tonic::Status::resource_exhausted("too large");
        status
            .metadata_mut()
            .insert(ERROR_CODE_METADATA, "payload_too_large".parse().unwrap());
        let body = error_body(&status);
        assert_eq!(
            (body.code, body.message.as_str(), body.rejection),
            (ErrorCode::PayloadTooLarge, "too large", None)
        );
        let bare = error_body(&tonic::Status::permission_denied("not yours"));
        assert_eq!(bare.code, ErrorCode::PermissionDenied);
        assert_eq!(
            error_body(&tonic::Status::data_loss("?")).code,
            ErrorCode::Internal
        );
    }
}
