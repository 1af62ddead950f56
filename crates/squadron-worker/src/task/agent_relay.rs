//! The relay between a sandbox's agent and the control plane (DESIGN §5, "Sandboxes": a
//! sandbox reaches nothing of the host's network, control ports included). Each sandbox that
//! runs `squadron agent` gets its own directory of two Unix sockets, bound into it and owned by
//! its user:
//!
//! - `rest.sock` → a control node's REST listener, for enrollment only: it is closed once the
//!   agent has registered, so the code the sandbox runs later reaches no REST route;
//! - `grpc.sock` → the leader's gRPC listener, looked up afresh for every connection, so an
//!   agent that reconnects after a leader change reaches the new leader.
//!
//! A VM cannot be given sockets: its agent reaches the relay over one virtio-serial port whose
//! host end is a Unix socket libvirt makes (`open_channel`). The port carries yamux streams the
//! agent opens, each starting with a byte that names its target
//! (`squadron_api::agent_channel`); closing REST refuses such streams from then on. A guest's
//! provider reaches the worker's egress-injection proxy the same way (`serve_egress`): the
//! agent accepts on the guest's loopback and opens an egress stream per connection, which the
//! relay hands to the attempt's proxy while it serves, and refuses otherwise.
//!
//! The relay only moves bytes: TLS runs between the agent and the node, so the worker sees
//! neither the agent's token nor its calls. A sandbox holds at most
//! `RELAY_CONNECTIONS_PER_SANDBOX_MAX` connections at once; more are closed on accept.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use squadron_api::agent_channel::{
    CHANNEL_STREAMS_MAX, CONTROL_STREAMS_MAX, EGRESS_STREAMS_MAX, TARGET_EGRESS, TARGET_GRPC,
    TARGET_REST,
};
use squadron_core::ids::TaskId;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::{AbortHandle, JoinSet};

use crate::control_link::ControlLink;
use crate::egress::EgressSession;
use crate::error::WorkerError;
use crate::http1_server::StreamInbox;
use crate::support::authority;

pub(crate) const REST_SOCKET_NAME: &str = "rest.sock";
pub(crate) const GRPC_SOCKET_NAME: &str = "grpc.sock";
/// Connections one sandbox may hold through its relay at once.
pub(crate) const RELAY_CONNECTIONS_PER_SANDBOX_MAX: usize = CONTROL_STREAMS_MAX;
/// How long dialing a control node may take.
const DIAL_TIMEOUT_MS: u64 = 5_000;
/// How long a channel stream may take to name its target.
const TARGET_BYTE_MS_MAX: u64 = 5_000;
/// The pause before connecting to a channel's socket again.
const CHANNEL_RECONNECT_MS: u64 = 200;

/// The relay of one VM's channel: its socket, its session, the targets it may reach now, and
/// where its egress streams go while the attempt's proxy serves.
#[derive(Debug)]
struct ChannelRelay {
    socket: PathBuf,
    handle: AbortHandle,
    gates: Gates,
}

/// The sending end of the egress proxy's inbox, while one serves the channel.
type EgressSink = Arc<Mutex<Option<mpsc::Sender<SlottedStream>>>>;

/// Which listener a socket leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Target {
    Rest,
    Grpc,
}

/// Where the leader's gRPC listener is now (`host:port`, or a URL), or why it is not known.
pub(crate) type LeaderLookup =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<String, String>> + Send>> + Send + Sync>;

/// The open relays of this worker's sandboxes, by task.
#[derive(Clone)]
pub(crate) struct AgentRelays {
    leader: LeaderLookup,
    /// `host:port` of every configured control node's REST listener.
    rest: Arc<Vec<String>>,
    open: Arc<Mutex<HashMap<(TaskId, Target), AbortHandle>>>,
    channels: Arc<Mutex<HashMap<TaskId, ChannelRelay>>>,
}

impl std::fmt::Debug for AgentRelays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRelays")
            .field("rest", &self.rest)
            .finish_non_exhaustive()
    }
}

impl AgentRelays {
    /// Relays to the leader the control link finds, and to the configured REST endpoints.
    pub(crate) fn for_link(control: ControlLink, rest_urls: &[String]) -> Self {
        let leader: LeaderLookup = Arc::new(move || {
            let control = control.clone();
            Box::pin(async move {
                control
                    .leader_grpc_address()
                    .await
                    .map_err(|e| e.to_string())
            })
        });
        Self::new(leader, rest_urls)
    }

    pub(crate) fn new(leader: LeaderLookup, rest_urls: &[String]) -> Self {
        let rest = rest_urls.iter().map(|u| authority(u).to_string()).collect();
        Self {
            leader,
            rest: Arc::new(rest),
            open: Arc::new(Mutex::new(HashMap::new())),
            channels: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Binds the sockets of `targets` in `dir` for `task`'s sandbox, owned by `owner`;
    /// re-binds them after a worker restart (the sandbox keeps the directory mounted, so it
    /// sees the new sockets). A socket already open is left as it is.
    pub(crate) fn open(
        &self,
        task: TaskId,
        dir: &Path,
        owner: (u32, u32),
        targets: &[Target],
    ) -> Result<(), WorkerError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        for target in targets {
            if open.contains_key(&(task, *target)) {
                continue;
            }
            let listener = bind(&dir.join(target.socket_name()), owner)?;
            let relay = self.clone();
            let handle = tokio::spawn(relay.serve(task, listener, *target)).abort_handle();
            open.insert((task, *target), handle);
        }
        Ok(())
    }

    /// Relays `task`'s VM channel at `socket` (libvirt's end of the port) to `targets`; after
    /// a worker restart the same again. A channel already open keeps its session and gains
    /// `targets`; one at another socket (the domain was started again) is replaced.
    pub(crate) fn open_channel(&self, task: TaskId, socket: PathBuf, targets: &[Target]) {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let mut egress = EgressSink::default();
        if let Some(open) = channels.get(&task) {
            if open.socket == socket {
                let mut allowed = open.gates.allowed.lock().unwrap_or_else(|p| p.into_inner());
                allowed.extend(targets.iter().copied());
                return;
            }
            open.handle.abort();
            // The attempt's proxy serves the domain started again as it served the last one.
            egress = Arc::clone(&open.gates.egress);
        }
        let gates = Gates {
            allowed: Arc::new(Mutex::new(targets.iter().copied().collect())),
            egress,
            control_slots: Arc::new(Semaphore::new(CONTROL_STREAMS_MAX)),
            egress_slots: Arc::new(Semaphore::new(EGRESS_STREAMS_MAX)),
        };
        let relay = self.clone();
        let handle =
            tokio::spawn(relay.serve_channel(task, socket.clone(), gates.clone())).abort_handle();
        channels.insert(
            task,
            ChannelRelay {
                socket,
                handle,
                gates,
            },
        );
    }

    /// Serves `egress` to `task`'s VM: each egress stream its agent opens from now on goes to
    /// the proxy, until the proxy closes (the streams are then refused) or another one is
    /// served. The channel must be open.
    pub(crate) fn serve_egress(
        &self,
        task: TaskId,
        egress: &Arc<EgressSession>,
    ) -> Result<(), WorkerError> {
        let inbox = self.egress_inbox(task)?;
        egress.serve_on(StreamInbox::new(inbox))
    }

    /// Where `task`'s VM's egress streams arrive from now on (an earlier inbox gets no more).
    fn egress_inbox(&self, task: TaskId) -> Result<mpsc::Receiver<SlottedStream>, WorkerError> {
        let channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let open = channels.get(&task).ok_or_else(|| {
            WorkerError::runtime(
                "agent channel",
                format!("task {task} has no open channel to serve egress injection on"),
            )
        })?;
        let (sender, inbox) = mpsc::channel(EGRESS_STREAMS_MAX);
        *open.gates.egress.lock().unwrap_or_else(|p| p.into_inner()) = Some(sender);
        Ok(inbox)
    }

    /// Closes `task`'s socket to `target` (all of them: `None`) and every connection through
    /// it; the socket file goes too. A VM's channel refuses `target` from then on (all: the
    /// session ends).
    pub(crate) fn close(&self, task: TaskId, target: Option<Target>, dir: &Path) {
        {
            let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
            match target {
                None => {
                    if let Some(open) = channels.remove(&task) {
                        open.handle.abort();
                    }
                }
                Some(t) => {
                    if let Some(open) = channels.get(&task) {
                        open.gates
                            .allowed
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&t);
                    }
                }
            }
        }
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        for t in [Target::Rest, Target::Grpc] {
            if target.is_some_and(|only| only != t) {
                continue;
            }
            if let Some(h) = open.remove(&(task, t)) {
                h.abort();
            }
            let _ = std::fs::remove_file(dir.join(t.socket_name()));
        }
    }

    async fn serve(self, task: TaskId, listener: UnixListener, target: Target) {
        let slots = Arc::new(Semaphore::new(RELAY_CONNECTIONS_PER_SANDBOX_MAX));
        // Dropped with this task: closing the relay ends its connections too.
        let mut connections = JoinSet::new();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(%task, error = %e, "agent relay: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::warn!(%task, max = RELAY_CONNECTIONS_PER_SANDBOX_MAX, "agent relay: too many connections; closing one");
                continue;
            };
            let relay = self.clone();
            connections.spawn(async move {
                if let Err(e) = relay.carry(stream, target).await {
                    tracing::info!(%task, ?target, error = %e, "agent relay: connection ended");
                }
                drop(slot);
            });
        }
    }

    async fn serve_channel(self, task: TaskId, socket: PathBuf, gates: Gates) {
        loop {
            match UnixStream::connect(&socket).await {
                Ok(stream) => {
                    self.carry_session(task, stream, &gates).await;
                    tracing::info!(%task, "agent channel: the session ended; connecting again");
                }
                Err(e) => {
                    tracing::debug!(%task, socket = %socket.display(), error = %e, "agent channel: not connected yet")
                }
            }
            tokio::time::sleep(Duration::from_millis(CHANNEL_RECONNECT_MS)).await;
        }
    }

    async fn carry_session(&self, task: TaskId, port: UnixStream, gates: &Gates) {
        let config = tokio_yamux::Config {
            max_stream_count: CHANNEL_STREAMS_MAX,
            ..tokio_yamux::Config::default()
        };
        let mut session = tokio_yamux::Session::new_server(port, config);
        // Dropped with the session: its connections end with it.
        let mut connections = JoinSet::new();
        loop {
            let next = tokio::select! {
                next = session.next() => next,
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            };
            let stream = match next {
                Some(Ok(stream)) => stream,
                Some(Err(e)) => {
                    tracing::info!(%task, error = %e, "agent channel: the session failed");
                    return;
                }
                None => return,
            };
            // yamux holds the session to CHANNEL_STREAMS_MAX streams; each kind to its share
            // once the stream names its target (`Gates`).
            let (relay, gates) = (self.clone(), gates.clone());
            connections.spawn(async move {
                if let Err(e) = relay.carry_stream(stream, &gates).await {
                    tracing::info!(%task, error = %e, "agent channel: stream ended");
                }
            });
        }
    }

    async fn carry_stream(
        &self,
        mut stream: tokio_yamux::StreamHandle,
        gates: &Gates,
    ) -> Result<(), String> {
        let mut first = [0u8; 1];
        tokio::time::timeout(
            Duration::from_millis(TARGET_BYTE_MS_MAX),
            stream.read_exact(&mut first),
        )
        .await
        .map_err(|_| "no target named in time".to_string())?
        .map_err(|e| e.to_string())?;
        let target = match first[0] {
            TARGET_REST => Target::Rest,
            TARGET_GRPC => Target::Grpc,
            TARGET_EGRESS => return gates.to_egress(stream),
            other => return Err(format!("unknown target byte {other:#04x}")),
        };
        let Ok(_slot) = gates.control_slots.clone().try_acquire_owned() else {
            return Err(format!(
                "more than {CONTROL_STREAMS_MAX} control streams at once; this one is closed"
            ));
        };
        if !gates
            .allowed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&target)
        {
            return Err(format!("{target:?} is closed for this sandbox"));
        }
        let mut node = self.dial(target).await?;
        tokio::io::copy_bidirectional(&mut stream, &mut node)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn carry(&self, mut agent: UnixStream, target: Target) -> Result<(), String> {
        let mut node = self.dial(target).await?;
        tokio::io::copy_bidirectional(&mut agent, &mut node)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn dial(&self, target: Target) -> Result<TcpStream, String> {
        let candidates = match target {
            Target::Grpc => vec![(self.leader)()
                .await
                .map_err(|e| format!("no leader: {e}"))?],
            Target::Rest => self.rest.to_vec(),
        };
        let mut last = String::from("no control node configured");
        for address in candidates {
            let address = authority(&address).to_string();
            let dial = TcpStream::connect(address.as_str());
            match tokio::time::timeout(Duration::from_millis(DIAL_TIMEOUT_MS), dial).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Ok(Err(e)) => last = format!("{address}: {e}"),
                Err(_) => last = format!("{address}: no answer in {DIAL_TIMEOUT_MS} ms"),
            }
        }
        Err(last)
    }
}

/// What a VM's channel lets its streams reach now, and how many of each kind it carries at
/// once: control streams and egress streams have shares of their own, so neither kind starves
/// the other of the session's streams.
#[derive(Debug, Clone)]
struct Gates {
    allowed: Arc<Mutex<HashSet<Target>>>,
    egress: EgressSink,
    control_slots: Arc<Semaphore>,
    egress_slots: Arc<Semaphore>,
}

impl Gates {
    /// Hands an egress stream, with one of the channel's egress slots, to the proxy serving
    /// the channel, if one does. Never queues one beyond the slots: a stream nobody reads
    /// would fill its yamux buffer, and a full buffer stops the session reading the port —
    /// every stream of the guest, its agent's gRPC included. The proxy serves as many
    /// connections as there are slots, so each stream handed over is read at once.
    fn to_egress(&self, stream: tokio_yamux::StreamHandle) -> Result<(), String> {
        let sink = self
            .egress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(sink) = sink else {
            return Err("egress injection is not served for this sandbox".to_string());
        };
        let Ok(slot) = self.egress_slots.clone().try_acquire_owned() else {
            return Err(format!(
                "more than {EGRESS_STREAMS_MAX} egress connections at once; this one is closed"
            ));
        };
        sink.try_send(SlottedStream {
            stream,
            _slot: slot,
        })
        .map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => "the sandbox's egress proxy is busy".to_string(),
            mpsc::error::TrySendError::Closed(_) => {
                "the sandbox's egress proxy is closed".to_string()
            }
        })
    }
}

/// An egress stream with the channel slot it holds until the proxy's connection ends.
#[derive(Debug)]
pub(crate) struct SlottedStream {
    stream: tokio_yamux::StreamHandle,
    _slot: OwnedSemaphorePermit,
}

impl AsyncRead for SlottedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for SlottedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Target {
    fn socket_name(self) -> &'static str {
        match self {
            Target::Rest => REST_SOCKET_NAME,
            Target::Grpc => GRPC_SOCKET_NAME,
        }
    }
}

/// A fresh socket at `path` (a stale one from an earlier life is replaced), usable only by
/// `owner`.
fn bind(path: &Path, owner: (u32, u32)) -> Result<UnixListener, WorkerError> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(WorkerError::io("remove the old agent socket", path, e)),
    }
    let listener =
        UnixListener::bind(path).map_err(|e| WorkerError::io("bind the agent socket", path, e))?;
    own_socket(path, owner)
        .map_err(|e| WorkerError::io("give the agent socket to the sandbox user", path, e))?;
    Ok(listener)
}

/// Gives the socket just bound at `path` to `owner`, mode 0600, through a handle on the node
/// itself: the directory is the sandbox's to write (a running container's, for a relay opened
/// again after a restart), so between the bind and a chown by path it could put a link to any
/// host file there, which root would then hand to the sandbox user.
fn own_socket(path: &Path, owner: (u32, u32)) -> std::io::Result<()> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    use std::os::fd::AsRawFd;
    let node = rustix::fs::open(
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if FileType::from_raw_mode(rustix::fs::fstat(&node)?.st_mode) != FileType::Socket {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not the socket just bound (replaced)",
        ));
    }
    rustix::fs::chownat(
        &node,
        "",
        Some(rustix::fs::Uid::from_raw(owner.0)),
        Some(rustix::fs::Gid::from_raw(owner.1)),
        AtFlags::EMPTY_PATH,
    )?;
    // chmod has no empty-path form: the node's own /proc entry names it without a lookup.
    rustix::fs::chmod(
        format!("/proc/self/fd/{}", node.as_raw_fd()),
        Mode::from_raw_mode(0o600),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A stand-in node: answers each connection with its name, then echoes.
    async fn node(name: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    s.write_all(name.as_bytes()).await.unwrap();
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        address
    }

    async fn greeting(stream: &mut UnixStream, len: usize) -> String {
        let mut buf = vec![0u8; len];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut buf))
            .await
            .expect("an answer in time")
            .expect("read");
        String::from_utf8(buf).unwrap()
    }

    fn owner_of(path: &Path) -> (u32, u32) {
        let meta = std::fs::metadata(path).unwrap();
        (meta.uid(), meta.gid())
    }

    fn relays(rest: String, leader: String) -> AgentRelays {
        let lookup: LeaderLookup = Arc::new(move || {
            let leader = leader.clone();
            Box::pin(async move { Ok(format!("https://{leader}")) })
        });
        AgentRelays::new(lookup, &[format!("https://{rest}/")])
    }

    #[tokio::test]
    async fn each_socket_reaches_its_listener_and_carries_bytes_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let me = owner_of(dir.path());
        let relays = relays(node("rest").await, node("grpc").await);
        let task = TaskId::new(7).unwrap();
        relays
            .open(task, dir.path(), me, &[Target::Rest, Target::Grpc])
            .unwrap();
        for (name, expect) in [(REST_SOCKET_NAME, "rest"), (GRPC_SOCKET_NAME, "grpc")] {
            let path = dir.path().join(name);
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!((meta.mode() & 0o777, meta.uid()), (0o600, me.0), "{name}");
            let mut s = UnixStream::connect(&path).await.unwrap();
            assert_eq!(greeting(&mut s, 4).await, expect);
            s.write_all(b"ping").await.unwrap();
            assert_eq!(greeting(&mut s, 4).await, "ping");
        }
        // Opening again (a restarted driver) keeps what is open.
        relays.open(task, dir.path(), me, &[Target::Grpc]).unwrap();
        let mut s = UnixStream::connect(dir.path().join(GRPC_SOCKET_NAME))
            .await
            .unwrap();
        assert_eq!(greeting(&mut s, 4).await, "grpc");
    }

    #[tokio::test]
    async fn a_sandbox_holds_a_bounded_number_of_connections() {
        let dir = tempfile::tempdir().unwrap();
        let me = owner_of(dir.path());
        let relays = relays(node("rest").await, node("grpc").await);
        let task = TaskId::new(8).unwrap();
        relays.open(task, dir.path(), me, &[Target::Grpc]).unwrap();
        let path = dir.path().join(GRPC_SOCKET_NAME);
        let mut held = Vec::new();
        for _ in 0..RELAY_CONNECTIONS_PER_SANDBOX_MAX {
            let mut s = UnixStream::connect(&path).await.unwrap();
            assert_eq!(greeting(&mut s, 4).await, "grpc");
            held.push(s);
        }
        let mut extra = UnixStream::connect(&path).await.unwrap();
        let mut buf = [0u8; 4];
        let n = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut buf))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        assert_eq!(n, 0, "a connection beyond the bound is closed unanswered");
        // A slot freed is a slot for the next.
        drop(held.pop());
        let reached = wait_for_greeting(&path).await;
        assert!(reached, "a freed slot was not given to a new connection");
    }

    async fn wait_for_greeting(path: &Path) -> bool {
        for _ in 0..50 {
            let mut s = UnixStream::connect(path).await.unwrap();
            let mut buf = [0u8; 4];
            let read = tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await;
            if matches!(read, Ok(Ok(4))) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// A link planted where the socket was bound is never followed: the host file it names
    /// keeps its owner and mode.
    #[test]
    fn a_socket_replaced_by_a_link_is_not_given_away() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "host file\n").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path = dir.path().join("rest.sock");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let err = own_socket(&path, (65534, 65534)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
        let meta = std::fs::metadata(&victim).unwrap();
        assert_eq!((meta.mode() & 0o777, meta.uid()), (0o644, nix_uid()));
        // A real socket is given away.
        std::fs::remove_file(&path).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        own_socket(&path, (65534, 65534)).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!((meta.mode() & 0o777, meta.uid()), (0o600, 65534));
    }

    fn nix_uid() -> u32 {
        rustix::process::getuid().as_raw()
    }

    #[tokio::test]
    async fn closing_a_socket_ends_its_connections_and_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let me = owner_of(dir.path());
        let relays = relays(node("rest").await, node("grpc").await);
        let task = TaskId::new(9).unwrap();
        relays
            .open(task, dir.path(), me, &[Target::Rest, Target::Grpc])
            .unwrap();
        let mut rest = UnixStream::connect(dir.path().join(REST_SOCKET_NAME))
            .await
            .unwrap();
        assert_eq!(greeting(&mut rest, 4).await, "rest");
        relays.close(task, Some(Target::Rest), dir.path());
        assert!(!dir.path().join(REST_SOCKET_NAME).exists());
        let mut buf = [0u8; 4];
        let n = tokio::time::timeout(Duration::from_secs(5), rest.read(&mut buf))
            .await
            .expect("ended in time")
            .unwrap_or(0);
        assert_eq!(n, 0, "the open REST connection ended with its socket");
        // The gRPC socket is untouched until the end of the attempt.
        let mut grpc = UnixStream::connect(dir.path().join(GRPC_SOCKET_NAME))
            .await
            .unwrap();
        assert_eq!(greeting(&mut grpc, 4).await, "grpc");
        relays.close(task, None, dir.path());
        assert!(!dir.path().join(GRPC_SOCKET_NAME).exists());
    }

    /// A VM's channel: the test plays QEMU (the socket the relay connects to) and the guest's
    /// agent (a yamux client opening streams that name their target).
    #[tokio::test]
    async fn a_vm_channel_carries_streams_to_their_targets_and_refuses_rest_once_closed() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("org.squadron.agent");
        let qemu = tokio::net::UnixListener::bind(&socket).unwrap();
        let relays = relays(node("rest").await, node("grpc").await);
        let task = TaskId::new(10).unwrap();
        let targets = [Target::Rest, Target::Grpc];
        let control = guest(&relays, task, &socket, &qemu, &targets).await;
        let open = |target: u8| {
            let mut control = control.clone();
            async move {
                let mut s = control.open_stream().await.unwrap();
                s.write_all(&[target]).await.unwrap();
                s
            }
        };
        let mut grpc = open(TARGET_GRPC).await;
        assert_eq!(read_some(&mut grpc).await, "grpc");
        grpc.write_all(b"ping").await.unwrap();
        assert_eq!(read_some(&mut grpc).await, "ping");
        let mut rest = open(TARGET_REST).await;
        assert_eq!(read_some(&mut rest).await, "rest");
        // Registered: REST is refused from now on; gRPC still carried.
        relays.close(task, Some(Target::Rest), dir.path());
        let mut late = open(TARGET_REST).await;
        assert_eq!(
            read_some(&mut late).await,
            "",
            "a REST stream after the close is refused"
        );
        let mut unknown = open(b'X').await;
        assert_eq!(
            read_some(&mut unknown).await,
            "",
            "an unknown target is refused"
        );
        let mut again = open(TARGET_GRPC).await;
        assert_eq!(read_some(&mut again).await, "grpc");
        // The end of the attempt ends the session.
        relays.close(task, None, dir.path());
        let mut after = control.clone();
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match after.open_stream().await {
                    Err(_) => return true,
                    Ok(mut s) => {
                        let _ = s.write_all(&[TARGET_GRPC]).await;
                        if read_some(&mut s).await.is_empty() {
                            return true;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(ended.unwrap_or(false), "the session outlived the attempt");
    }

    /// A guest's egress streams reach the proxy's inbox only while one is served: refused
    /// before, carried both ways while it is, refused once it is gone (the attempt ended).
    #[tokio::test]
    async fn a_vm_channel_hands_egress_streams_to_the_served_proxy_only() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("org.squadron.agent");
        let qemu = tokio::net::UnixListener::bind(&socket).unwrap();
        let relays = relays(node("rest").await, node("grpc").await);
        let task = TaskId::new(11).unwrap();
        assert!(
            relays.egress_inbox(task).is_err(),
            "no channel open: nothing to serve on"
        );
        let control = guest(&relays, task, &socket, &qemu, &[Target::Grpc]).await;
        let open = || {
            let mut control = control.clone();
            async move {
                let mut s = control.open_stream().await.unwrap();
                s.write_all(&[TARGET_EGRESS, b'h', b'i']).await.unwrap();
                s
            }
        };
        let mut early = open().await;
        assert!(closed(&mut early).await, "no proxy served yet");

        let mut inbox = relays.egress_inbox(task).expect("the channel is open");
        let mut guest = open().await;
        let mut proxy = tokio::time::timeout(Duration::from_secs(5), inbox.recv())
            .await
            .expect("the stream reached the inbox")
            .expect("a stream");
        assert_eq!(
            read_some(&mut proxy).await,
            "hi",
            "the bytes after the target"
        );
        proxy.write_all(b"answer").await.unwrap();
        assert_eq!(read_some(&mut guest).await, "answer");

        // The egress share is full: one more is closed at once, never left unread; a
        // connection's end gives its slot back.
        let mut held = vec![proxy];
        let mut guests = vec![guest];
        while held.len() < EGRESS_STREAMS_MAX {
            guests.push(open().await);
            let next = tokio::time::timeout(Duration::from_secs(5), inbox.recv()).await;
            held.push(next.expect("within the share").expect("a stream"));
        }
        let mut over = open().await;
        assert!(closed(&mut over).await, "beyond the egress share");
        held.pop();
        let _again = open().await;
        let freed = tokio::time::timeout(Duration::from_secs(5), inbox.recv()).await;
        assert!(freed.is_ok_and(|s| s.is_some()), "a slot given back");

        drop((inbox, held));
        let mut late = open().await;
        assert!(closed(&mut late).await, "the proxy is gone");
        relays.close(task, None, dir.path());
    }

    /// Opens `task`'s channel at `socket` for `targets` and plays its guest: the control of a
    /// yamux client over the connection the relay made to `qemu`, the test's end of the socket.
    async fn guest(
        relays: &AgentRelays,
        task: TaskId,
        socket: &Path,
        qemu: &tokio::net::UnixListener,
        targets: &[Target],
    ) -> tokio_yamux::Control {
        relays.open_channel(task, socket.to_path_buf(), targets);
        let (port, _) = tokio::time::timeout(Duration::from_secs(5), qemu.accept())
            .await
            .expect("the relay connected to the channel's socket")
            .unwrap();
        let mut session = tokio_yamux::Session::new_client(port, tokio_yamux::Config::default());
        let control = session.control();
        tokio::spawn(async move { while session.next().await.is_some() {} });
        control
    }

    /// Whether the far end closed `s` (end of stream, or reset) within two seconds, as
    /// opposed to leaving it open.
    async fn closed(s: &mut tokio_yamux::StreamHandle) -> bool {
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    /// What arrives within a second, up to 16 bytes; empty once the stream is closed.
    async fn read_some(s: &mut (impl AsyncRead + Unpin)) -> String {
        let mut buf = [0u8; 16];
        match tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
            Ok(Ok(n)) => String::from_utf8_lossy(&buf[..n]).into_owned(),
            _ => String::new(),
        }
    }
}
