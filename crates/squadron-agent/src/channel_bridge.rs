//! The agent's end of a VM's channel (DESIGN §5, "The KVM runtime"). A VM has no socket its
//! worker can bind into it, only a virtio-serial port that libvirt joins to a Unix socket on
//! the worker. The bridge offers the agent the same two local sockets a container gets, and
//! carries each connection to one of them as a yamux stream over the port whose first byte
//! names the target (`squadron_api::agent_channel`). When the session ends (the worker
//! restarted, the port was reset), a new one is started on the same port.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use squadron_api::agent_channel::{TARGET_GRPC, TARGET_REST};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio_yamux::{Config, Control, Session};

use crate::error::AgentError;
use crate::virtio_port::VirtioPort;

/// Streams open over the port at once (the relay's own bound is the same).
pub const CHANNEL_STREAMS_MAX: usize = 8;
/// The pause before a new session after one ended or the port could not be opened.
const SESSION_RESTART_MS: u64 = 200;

/// The running bridge.
#[derive(Debug)]
pub struct ChannelBridge {
    rest_path: PathBuf,
    rest_open: tokio::sync::watch::Sender<bool>,
}

impl ChannelBridge {
    /// Binds the two local sockets and serves them until the process ends.
    pub fn start(port: PathBuf, rest: &Path, grpc: &Path) -> Result<Self, AgentError> {
        let (rest_open, open) = tokio::sync::watch::channel(true);
        let listeners = (bind(rest)?, bind(grpc)?);
        tokio::spawn(serve(port, listeners, open));
        Ok(Self {
            rest_path: rest.to_path_buf(),
            rest_open,
        })
    }

    /// Enrollment is over: the REST socket goes, as a container's does (the worker refuses
    /// REST streams from then on too).
    pub fn close_rest(&self) {
        let _ = self.rest_open.send(false);
        let _ = std::fs::remove_file(&self.rest_path);
    }
}

fn bind(path: &Path) -> Result<UnixListener, AgentError> {
    let io = |e| AgentError::io("bind the channel's socket", path, e);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    UnixListener::bind(path).map_err(io)
}

async fn serve(
    port: PathBuf,
    (rest, grpc): (UnixListener, UnixListener),
    mut rest_open: tokio::sync::watch::Receiver<bool>,
) {
    let mut rest = Some(rest);
    let mut watching = true;
    loop {
        match VirtioPort::open(&port) {
            Ok(opened) => {
                let mut session = Session::new_client(opened, config());
                let control = session.control();
                // The session only moves frames while polled; it yields no inbound streams
                // (the worker never opens one) and ends when the port does.
                let mut driver =
                    tokio::spawn(async move { while session.next().await.is_some() {} });
                loop {
                    let (accepted, target) = tokio::select! {
                        a = accept(&rest) => (a, TARGET_REST),
                        a = grpc.accept() => (a, TARGET_GRPC),
                        changed = rest_open.changed(), if watching => {
                            match changed {
                                Ok(()) if !*rest_open.borrow() => rest = None,
                                Ok(()) => {}
                                Err(_) => watching = false,
                            }
                            continue;
                        }
                        _ = &mut driver => break,
                    };
                    match accepted {
                        Ok((stream, _)) => {
                            tokio::spawn(carry(control.clone(), stream, target));
                        }
                        Err(e) => tracing::warn!(error = %e, "channel: accept failed"),
                    }
                }
                tracing::info!("channel: the session over the port ended; starting another");
            }
            Err(e) => {
                tracing::warn!(port = %port.display(), error = %e, "channel: cannot open the port")
            }
        }
        tokio::time::sleep(Duration::from_millis(SESSION_RESTART_MS)).await;
    }
}

/// Accepts on `listener`, or waits forever once it is closed.
async fn accept(
    listener: &Option<UnixListener>,
) -> std::io::Result<(UnixStream, tokio::net::unix::SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

pub(crate) fn config() -> Config {
    Config {
        max_stream_count: CHANNEL_STREAMS_MAX,
        ..Config::default()
    }
}

async fn carry(mut control: Control, mut local: UnixStream, target: u8) {
    let mut stream = match control.open_stream().await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "channel: cannot open a stream");
            return;
        }
    };
    if let Err(e) = stream.write_all(&[target]).await {
        tracing::warn!(error = %e, "channel: the stream closed at once");
        return;
    }
    if let Err(e) = tokio::io::copy_bidirectional(&mut local, &mut stream).await {
        tracing::debug!(error = %e, "channel: connection ended");
    }
}
