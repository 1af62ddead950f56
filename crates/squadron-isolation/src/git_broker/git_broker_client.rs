//! The client side of the broker's socket, for the agent-side tool and the tests.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::broker_answer::{CommitOutcome, HeadOutcome};
use super::broker_error::BrokerError;
use super::broker_request::{CommitRequest, HeadRequest};
use super::broker_server::LINE_BYTES_MAX;
use super::{FENCE_CHECK_TIMEOUT_MS_MAX, REPOSITORY_LOCK_WAIT_MS_MAX};

/// Waiting for one answer: long enough for the broker's own bounded waits (the repository
/// lock, two fence checks) plus the commit itself.
pub const CLIENT_ANSWER_TIMEOUT_MS_MAX: u64 =
    REPOSITORY_LOCK_WAIT_MS_MAX + 2 * FENCE_CHECK_TIMEOUT_MS_MAX + 30_000;

/// One request per connection over the broker's socket.
#[derive(Debug, Clone, Copy, Default)]
pub struct GitBrokerClient;

impl GitBrokerClient {
    /// Sends a commit request and reads its answer. `Err` means no answer was obtained (the
    /// request may or may not have been applied: retry with the same idempotency key).
    pub async fn commit(
        socket: &Path,
        request: &CommitRequest,
    ) -> Result<CommitOutcome, BrokerError> {
        let line = request
            .to_line()
            .map_err(|e| BrokerError::Protocol(format!("encode the commit request: {e}")))?;
        let answer = GitBrokerClient::exchange(socket, &line).await?;
        CommitOutcome::from_line(&answer)
    }

    /// Sends a head request and reads its answer.
    pub async fn head(socket: &Path, request: &HeadRequest) -> Result<HeadOutcome, BrokerError> {
        let line = request
            .to_line()
            .map_err(|e| BrokerError::Protocol(format!("encode the head request: {e}")))?;
        let answer = GitBrokerClient::exchange(socket, &line).await?;
        HeadOutcome::from_line(&answer)
    }

    /// Sends `line` (a newline is appended) and returns the answer line without its newline.
    pub async fn exchange(socket: &Path, line: &[u8]) -> Result<Vec<u8>, BrokerError> {
        let wait = Duration::from_millis(CLIENT_ANSWER_TIMEOUT_MS_MAX);
        match tokio::time::timeout(wait, exchange_unbounded(socket, line)).await {
            Ok(result) => result,
            Err(_) => Err(BrokerError::Protocol(format!(
                "no answer within {CLIENT_ANSWER_TIMEOUT_MS_MAX} ms"
            ))),
        }
    }
}

async fn exchange_unbounded(socket: &Path, line: &[u8]) -> Result<Vec<u8>, BrokerError> {
    let mut stream = UnixStream::connect(socket)
        .await
        .map_err(|e| BrokerError::io("connect to the git broker", socket, e))?;
    let mut request = Vec::with_capacity(line.len() + 1);
    request.extend_from_slice(line);
    request.push(b'\n');
    stream
        .write_all(&request)
        .await
        .map_err(|e| BrokerError::io("send to the git broker", socket, e))?;
    let mut reader = BufReader::new(stream);
    let mut answer = Vec::new();
    // Answers are small; the request bound is a generous bound for them too.
    (&mut reader)
        .take(LINE_BYTES_MAX as u64 + 1)
        .read_until(b'\n', &mut answer)
        .await
        .map_err(|e| BrokerError::io("read from the git broker", socket, e))?;
    if answer.last() != Some(&b'\n') {
        return Err(BrokerError::Protocol(
            "the broker closed the connection without a complete answer".into(),
        ));
    }
    answer.pop();
    Ok(answer)
}
