//! The broker's Unix socket: accept, read one bounded line, answer one line, repeat.

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::broker_answer::{refusal_line, Refusal, RefusalCode};
use super::broker_error::BrokerError;
use super::BrokerRequest;
use super::GitBroker;

/// One request line, newline excluded.
pub const LINE_BYTES_MAX: usize = 64 * 1024;
/// Connections served at once; one more is answered `busy` and closed.
pub const CONNECTIONS_MAX: usize = 64;
/// Waiting for the next request line on an open connection.
pub const REQUEST_READ_TIMEOUT_MS_MAX: u64 = 30_000;
/// Writing one answer line.
pub const ANSWER_WRITE_TIMEOUT_MS_MAX: u64 = 10_000;
/// Waiting, at shutdown, for requests in progress to be answered.
pub const SHUTDOWN_WAIT_MS_MAX: u64 = 30_000;

const SOCKET_MODE: u32 = 0o660;

/// A serving broker socket. Dropping it stops accepting at once; [`BrokerServer::shutdown`]
/// also lets the requests in progress finish and removes the socket file.
#[derive(Debug)]
pub struct BrokerServer {
    socket: PathBuf,
    stop: watch::Sender<bool>,
    accept_loop: Option<tokio::task::JoinHandle<()>>,
}

impl BrokerServer {
    /// Binds `socket` (replacing a stale socket file, refusing any other file there), sets
    /// its mode to 0660 and starts accepting on the current tokio runtime. With
    /// `only_profile`, requests naming any other profile are refused as `forbidden`.
    pub(crate) fn bind(
        broker: GitBroker,
        socket: &Path,
        only_profile: Option<u64>,
    ) -> Result<BrokerServer, BrokerError> {
        match fs::symlink_metadata(socket) {
            Ok(meta) if meta.file_type().is_socket() => fs::remove_file(socket)
                .map_err(|e| BrokerError::io("remove the stale socket", socket, e))?,
            Ok(_) => {
                return Err(BrokerError::invalid(
                    "socket",
                    format!("{} exists and is not a socket", socket.display()),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(BrokerError::io("stat the socket path", socket, e)),
        }
        let listener = UnixListener::bind(socket)
            .map_err(|e| BrokerError::io("bind the socket", socket, e))?;
        fs::set_permissions(socket, fs::Permissions::from_mode(SOCKET_MODE))
            .map_err(|e| BrokerError::io("set the socket mode", socket, e))?;
        let (stop, stopped) = watch::channel(false);
        let accept_loop = tokio::spawn(accept_loop(broker, listener, stopped, only_profile));
        tracing::info!(socket = %socket.display(), ?only_profile, "git broker: serving");
        Ok(BrokerServer {
            socket: socket.to_path_buf(),
            stop,
            accept_loop: Some(accept_loop),
        })
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops accepting, waits (at most [`SHUTDOWN_WAIT_MS_MAX`]) for the requests in
    /// progress to be answered, closes idle connections and removes the socket file.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(accept_loop) = self.accept_loop.take() {
            let _ = accept_loop.await;
        }
        if let Err(e) = fs::remove_file(&self.socket) {
            tracing::warn!(socket = %self.socket.display(), error = %e, "git broker: socket not removed");
        }
    }
}

impl Drop for BrokerServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn accept_loop(
    broker: GitBroker,
    listener: UnixListener,
    mut stopped: watch::Receiver<bool>,
    only_profile: Option<u64>,
) {
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match Arc::clone(&slots).try_acquire_owned() {
                    Ok(slot) => {
                        let broker = broker.clone();
                        let stopped = stopped.clone();
                        connections.spawn(async move {
                            serve_connection(&broker, stream, stopped, only_profile).await;
                            drop(slot);
                        });
                    }
                    Err(_) => {
                        let refusal = Refusal::new(
                            RefusalCode::Busy,
                            format!("{CONNECTIONS_MAX} connections already open"),
                        );
                        broker.count_line_refusal(RefusalCode::Busy);
                        // Best effort and without waiting: a flood of connections must not
                        // become a flood of tasks.
                        let _ = stream.try_write(&refusal_line(&refusal));
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, "git broker: accept failed");
                    // Out of file descriptors and the like: do not spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_millis(SHUTDOWN_WAIT_MS_MAX), drain)
        .await
        .is_err()
    {
        tracing::warn!("git broker: connections still busy at shutdown were aborted");
        connections.abort_all();
    }
}

/// Reads requests until EOF, a bad line, an idle timeout or shutdown. A request in
/// progress is always answered; shutdown is only noticed while waiting for a line.
async fn serve_connection(
    broker: &GitBroker,
    stream: UnixStream,
    mut stopped: watch::Receiver<bool>,
    only_profile: Option<u64>,
) {
    if let Ok(peer) = stream.peer_cred() {
        tracing::debug!(uid = peer.uid(), pid = ?peer.pid(), "git broker: connection");
    }
    let (read_half, mut write_half) = stream.into_split();
    let mut reader = BufReader::new(read_half);
    let mut line = Vec::new();
    loop {
        if *stopped.borrow() {
            return;
        }
        let read = tokio::select! {
            _ = stopped.changed() => return,
            read = tokio::time::timeout(
                Duration::from_millis(REQUEST_READ_TIMEOUT_MS_MAX),
                read_line(&mut reader, &mut line),
            ) => read,
        };
        let answer = match read {
            Err(_) | Ok(Err(_)) | Ok(Ok(LineRead::Eof)) => return,
            Ok(Ok(LineRead::TooLong)) => {
                broker.count_line_refusal(RefusalCode::InvalidArgument);
                let refusal = Refusal::new(
                    RefusalCode::InvalidArgument,
                    format!("request line longer than {LINE_BYTES_MAX} bytes"),
                )
                .with_field("line");
                // The rest of the line cannot be skipped reliably: answer, then close.
                let _ = write_line(&mut write_half, &refusal_line(&refusal)).await;
                return;
            }
            Ok(Ok(LineRead::Line)) => answer(broker, &line, only_profile).await,
        };
        if write_line(&mut write_half, &answer).await.is_err() {
            return;
        }
    }
}

async fn answer(broker: &GitBroker, line: &[u8], only_profile: Option<u64>) -> Vec<u8> {
    let request = BrokerRequest::parse(line).and_then(|request| {
        let profile = match &request {
            BrokerRequest::Commit(commit) => commit.profile,
            BrokerRequest::Head(head) => head.profile,
        };
        match only_profile {
            Some(served) if served != profile => Err(Refusal::new(
                RefusalCode::Forbidden,
                format!("this socket serves profile {served} only"),
            )
            .with_field("profile")),
            _ => Ok(request),
        }
    });
    match request {
        Ok(BrokerRequest::Commit(request)) => broker.commit(request).await.to_line(),
        Ok(BrokerRequest::Head(request)) => broker.head(request).await.to_line(),
        Err(refusal) => {
            broker.count_line_refusal(refusal.code);
            refusal_line(&refusal)
        }
    }
}

enum LineRead {
    Line,
    TooLong,
    Eof,
}

/// One line of at most [`LINE_BYTES_MAX`] bytes into `line`, newline (and a `\r` before it)
/// removed. A last line without a newline counts as a line.
async fn read_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> std::io::Result<LineRead> {
    line.clear();
    let limit = LINE_BYTES_MAX as u64 + 1;
    let read = (&mut *reader).take(limit).read_until(b'\n', line).await?;
    if read == 0 {
        return Ok(LineRead::Eof);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        return Ok(LineRead::Line);
    }
    if line.len() > LINE_BYTES_MAX {
        return Ok(LineRead::TooLong);
    }
    Ok(LineRead::Line)
}

async fn write_line<W: tokio::io::AsyncWrite + Unpin>(
    writer: &mut W,
    line: &[u8],
) -> std::io::Result<()> {
    let write = async {
        writer.write_all(line).await?;
        writer.flush().await
    };
    match tokio::time::timeout(Duration::from_millis(ANSWER_WRITE_TIMEOUT_MS_MAX), write).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "answer write timed out",
        )),
    }
}
