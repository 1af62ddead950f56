//! The agent's end of a VM's channel (DESIGN §5, "The KVM runtime"). A VM has no socket its
//! worker can bind into it, only a virtio-serial port that libvirt joins to a Unix socket on
//! the worker. The bridge offers the agent the same two local sockets a container gets, and
//! carries each connection to one of them as a yamux stream over the port whose first byte
//! names the target (`squadron_api::agent_channel`). It also accepts on the guest's loopback at
//! the egress-injection port, for the worker's proxy of the sandbox's injected credentials: the
//! provider calls its own loopback there, as in a container. When the session ends (the worker
//! restarted, the port was reset), a new one is started on the same port.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use squadron_api::agent_channel::{
    CHANNEL_STREAMS_MAX, EGRESS_PORT, EGRESS_STREAMS_MAX, TARGET_EGRESS, TARGET_GRPC, TARGET_REST,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_yamux::{Config, Control, Session};

use crate::error::AgentError;
use crate::virtio_port::VirtioPort;

/// The pause before a new session after one ended or the port could not be opened.
const SESSION_RESTART_MS: u64 = 200;
/// The pause after a failed accept (out of file descriptors, say).
const ACCEPT_RETRY_MS: u64 = 100;

/// The running bridge.
#[derive(Debug)]
pub struct ChannelBridge {
    rest_path: PathBuf,
    rest_open: tokio::sync::watch::Sender<bool>,
}

impl ChannelBridge {
    /// Binds the two local sockets and the egress port and serves them until the process
    /// ends. The egress port is best effort: a guest where it is taken still gets its agent,
    /// and a provider with credentials injected at egress meets whatever holds the port.
    pub fn start(port: PathBuf, rest: &Path, grpc: &Path) -> Result<Self, AgentError> {
        let (rest_open, open) = tokio::sync::watch::channel(true);
        let egress = bind_egress(SocketAddr::from((Ipv4Addr::LOCALHOST, EGRESS_PORT)));
        let listeners = Listeners {
            rest: Some(bind(rest)?),
            grpc: bind(grpc)?,
            egress,
        };
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

/// What the bridge accepts on: REST until enrollment is over, gRPC, and the egress port.
#[derive(Debug)]
struct Listeners {
    rest: Option<UnixListener>,
    grpc: UnixListener,
    egress: Option<TcpListener>,
}

fn bind_egress(address: SocketAddr) -> Option<TcpListener> {
    let bound = std::net::TcpListener::bind(address)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .and_then(TcpListener::from_std);
    match bound {
        Ok(listener) => Some(listener),
        Err(e) => {
            tracing::warn!(%address, error = %e, "channel: cannot listen for egress injection");
            None
        }
    }
}

async fn serve(
    port: PathBuf,
    mut listeners: Listeners,
    mut rest_open: tokio::sync::watch::Receiver<bool>,
) {
    let mut watching = true;
    let egress_slots = Arc::new(Semaphore::new(EGRESS_STREAMS_MAX));
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
                    let carried = tokio::select! {
                        a = accept_unix(&listeners.rest) => carry_accepted(&control, a, TARGET_REST, None),
                        a = listeners.grpc.accept() => carry_accepted(&control, a.map(|(s, _)| s), TARGET_GRPC, None),
                        a = accept_tcp(&listeners.egress) => match egress_slots.clone().try_acquire_owned() {
                            Ok(slot) => carry_accepted(&control, a, TARGET_EGRESS, Some(slot)),
                            // Beyond the egress share the worker would refuse it anyway: closed
                            // here, it never takes one of the session's streams from the agent.
                            Err(_) => true,
                        },
                        changed = rest_open.changed(), if watching => {
                            match changed {
                                Ok(()) if !*rest_open.borrow() => listeners.rest = None,
                                Ok(()) => {}
                                Err(_) => watching = false,
                            }
                            true
                        }
                        _ = &mut driver => break,
                    };
                    if !carried {
                        // Out of file descriptors and the like: do not spin.
                        tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
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
async fn accept_unix(listener: &Option<UnixListener>) -> std::io::Result<tokio::net::UnixStream> {
    match listener {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// Accepts on `listener`, or waits forever where there is none.
async fn accept_tcp(listener: &Option<TcpListener>) -> std::io::Result<tokio::net::TcpStream> {
    match listener {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// Carries an accepted connection over the port, holding `slot` until it ends; false when
/// the accept failed.
fn carry_accepted<S>(
    control: &Control,
    accepted: std::io::Result<S>,
    target: u8,
    slot: Option<OwnedSemaphorePermit>,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match accepted {
        Ok(stream) => {
            let control = control.clone();
            tokio::spawn(async move {
                carry(control, stream, target).await;
                drop(slot);
            });
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "channel: accept failed");
            false
        }
    }
}

pub(crate) fn config() -> Config {
    Config {
        max_stream_count: CHANNEL_STREAMS_MAX,
        ..Config::default()
    }
}

async fn carry<S>(mut control: Control, mut local: S, target: u8)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
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
