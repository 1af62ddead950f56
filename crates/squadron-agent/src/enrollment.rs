//! Enrollment through the REST relay: a fresh key that never leaves the agent, the one-time
//! token, and the certificate `spiffe://squadron.local/agent/task-{id}` in return.

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use squadron_api::{EnrollAgent, Enrolled};
use squadron_core::access::AgentIdentity;
use squadron_pki::{
    client_config, AgentSubject, ClusterTrust, ExpectedPeer, IssuedCert, KeyRequest, SpiffeId,
    UnixTlsConnector,
};

use crate::agent_env::AgentEnv;
use crate::error::AgentError;

/// Largest answer read from the enrollment route.
pub const ENROLL_ANSWER_BYTES_MAX: usize = 256 * 1024;
const ENROLL_PATH: &str = "/api/v1/enroll/agent";

/// One enrollment try. A refusal of the token is final (`Enroll`); a transport failure is
/// `Io`, which the caller retries.
pub async fn enroll(env: &AgentEnv, trust: &ClusterTrust) -> Result<IssuedCert, AgentError> {
    let key = KeyRequest::new(&identity(env))?;
    let body = serde_json::to_vec(&EnrollAgent {
        token: env.token.to_string(),
        agent: AgentIdentity::Task(env.task),
        csr_pem: key.csr_pem.clone(),
    })
    .map_err(|e| AgentError::Enroll(e.to_string()))?;
    let (status, answer) = post(env, trust, body).await?;
    if !status.is_success() {
        return Err(AgentError::Enroll(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&answer)
        )));
    }
    let enrolled: Enrolled = serde_json::from_slice(&answer)
        .map_err(|e| AgentError::Enroll(format!("the answer does not decode: {e}")))?;
    Ok(IssuedCert::new(
        enrolled.cert_pem,
        key.key_pem().to_string(),
        &enrolled.ca_pem,
    ))
}

/// The identity this agent holds: its task's.
pub fn identity(env: &AgentEnv) -> SpiffeId {
    SpiffeId::Agent(AgentSubject::Task(env.task.get()))
}

/// HTTP/1.1 over TLS over the relay socket; the node is checked as any node of the cluster.
/// hyper directly, for one POST: the project's REST client (reqwest) cannot dial a Unix
/// socket.
async fn post(
    env: &AgentEnv,
    trust: &ClusterTrust,
    body: Vec<u8>,
) -> Result<(hyper::StatusCode, Bytes), AgentError> {
    let io = |e: std::io::Error| AgentError::io("enroll through", &env.rest_socket, e);
    let mut config = client_config(trust, ExpectedPeer::AnyNode, None)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let stream = UnixTlsConnector::new(env.rest_socket.clone(), config)
        .dial()
        .await
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| io(std::io::Error::other(e)))?;
    tokio::spawn(connection);
    let request = hyper::Request::post(ENROLL_PATH)
        // The node's browser guard admits `localhost`; the relay hides which node this is.
        .header(hyper::header::HOST, "localhost")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| AgentError::Enroll(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| io(std::io::Error::other(e)))?;
    let status = response.status();
    let answer = Limited::new(response.into_body(), ENROLL_ANSWER_BYTES_MAX)
        .collect()
        .await
        .map_err(|e| io(std::io::Error::other(e.to_string())))?
        .to_bytes();
    Ok((status, answer))
}
