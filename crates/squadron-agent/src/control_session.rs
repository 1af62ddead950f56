//! The agent's gRPC session with the control plane's leader, through the worker's relay and
//! under the agent's own certificate. A call that goes unanswered (no leader yet, a follower
//! answered, a broken connection during a leader change) is retried on the task's agent
//! connect table (`lifecycle.retries.agent_connect`, by default the seed's 30 retries 2 s
//! apart); each new connection goes through the relay again, and the relay dials whichever
//! node leads now.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use backon::Retryable;
use squadron_pki::{
    client_config, ClusterTrust, ExpectedPeer, IssuedCert, ReloadableCert, UnixTlsConnector,
};
use squadron_proto::v1 as pb;
use squadron_proto::v1::agent_service_client::AgentServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::agent_env::AgentEnv;
use crate::error::AgentError;

/// How long the leader may hold an `AwaitRun`; the call's own deadline is longer.
pub const AWAIT_RUN_WAIT_MS: u32 = 15_000;
pub const CALL_TIMEOUT_MS: u64 = 30_000;
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;

/// What became of the wait for the provider's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOrder {
    /// The task is RUNNING: start the provider.
    Run,
    /// The task ended (or moved to another attempt) before it ran.
    Ended { state: String },
}

#[derive(Debug, Clone)]
pub struct ControlSession {
    /// Swapped for a fresh connection when the certificate is renewed: the node checks the
    /// certificate an open connection was made with on every call.
    client: Arc<RwLock<AgentServiceClient<Channel>>>,
    connector: UnixTlsConnector,
    mine: ReloadableCert,
    task: u64,
    attempt: u32,
    pauses: Vec<Duration>,
}

impl ControlSession {
    pub fn new(
        env: &AgentEnv,
        trust: &ClusterTrust,
        cert: &IssuedCert,
    ) -> Result<Self, AgentError> {
        let mine = ReloadableCert::new(trust, cert)?;
        let config = client_config(trust, ExpectedPeer::AnyNode, Some(&mine))?;
        let connector = UnixTlsConnector::new(env.grpc_socket.clone(), config);
        Ok(Self {
            client: Arc::new(RwLock::new(client_over(&connector))),
            connector,
            mine,
            task: env.task.get(),
            attempt: env.attempt,
            pauses: env.connect_pauses.clone(),
        })
    }

    /// Calls from now on present `cert`, over a new connection; calls under way finish on
    /// the old one.
    pub fn use_certificate(&self, cert: &IssuedCert) -> Result<(), AgentError> {
        self.mine.reload(cert)?;
        let fresh = client_over(&self.connector);
        *self.client.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }

    fn client(&self) -> AgentServiceClient<Channel> {
        self.client
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The leader signs a new certificate for this agent's CSR (`csr_pem`).
    pub async fn renew_certificate(
        &self,
        csr_pem: &str,
    ) -> Result<pb::AgentCertificate, AgentError> {
        self.call("RenewCertificate", |mut c| {
            let request = pb::RenewAgentCertificateRequest {
                csr_pem: csr_pem.to_owned(),
            };
            async move { c.renew_certificate(request).await }
        })
        .await
    }

    fn check_in_request(&self, usage: Option<pb::SandboxUsage>) -> pb::AgentCheckInRequest {
        pb::AgentCheckInRequest {
            task: self.task,
            attempt: self.attempt,
            usage,
            exit_code: None,
        }
    }

    /// READY: the worker reports it once this is committed.
    pub async fn register(&self) -> Result<pb::AgentCheckInReply, AgentError> {
        self.call("Register", |mut c| {
            let request = self.check_in_request(None);
            async move { c.register(request).await }
        })
        .await
    }

    pub async fn heartbeat(
        &self,
        usage: pb::SandboxUsage,
    ) -> Result<pb::AgentCheckInReply, AgentError> {
        self.call("Heartbeat", |mut c| {
            let request = self.check_in_request(Some(usage));
            async move { c.heartbeat(request).await }
        })
        .await
    }

    /// The last check-in: the launcher's exit code with the sandbox's last figures.
    pub async fn report_exit(
        &self,
        usage: pb::SandboxUsage,
        code: i32,
    ) -> Result<pb::AgentCheckInReply, AgentError> {
        self.call("Heartbeat", |mut c| {
            let mut request = self.check_in_request(Some(usage));
            request.exit_code = Some(code);
            async move { c.heartbeat(request).await }
        })
        .await
    }

    /// Asks until the task runs or ends.
    pub async fn wait_for_run(&self) -> Result<RunOrder, AgentError> {
        loop {
            let reply = self
                .call("AwaitRun", |mut c| {
                    let request = pb::AwaitRunRequest {
                        task: self.task,
                        attempt: self.attempt,
                        wait_ms: AWAIT_RUN_WAIT_MS,
                    };
                    async move { c.await_run(request).await }
                })
                .await?;
            if reply.run {
                return Ok(RunOrder::Run);
            }
            if reply.ended {
                return Ok(RunOrder::Ended { state: reply.state });
            }
        }
    }

    async fn call<T, F, Fut>(&self, call: &'static str, f: F) -> Result<T, AgentError>
    where
        F: Fn(AgentServiceClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let once = || async { f(self.client()).await.map(tonic::Response::into_inner) };
        once.retry(self.pauses.clone().into_iter())
        .when(unanswered)
        .notify(|status, pause| {
            tracing::info!(call, code = ?status.code(), message = status.message(), ?pause, "no answer yet; asking again");
        })
        .await
        .map_err(|status| {
            if unanswered(&status) {
                AgentError::Unreachable {
                    call,
                    tries: self.pauses.len() + 1,
                    last: status.to_string(),
                }
            } else {
                AgentError::Refused { call, status }
            }
        })
    }
}

/// A lazy channel: it dials through the relay on its first call.
fn client_over(connector: &UnixTlsConnector) -> AgentServiceClient<Channel> {
    let channel = Endpoint::from_static("https://squadron-node")
        .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .timeout(Duration::from_millis(CALL_TIMEOUT_MS))
        .connect_with_connector_lazy(connector.clone());
    AgentServiceClient::new(channel)
}

/// Not an answer of the control plane: the transport failed, or a follower (or a node
/// without a leader) turned the call away.
fn unanswered(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Cancelled
    )
}
