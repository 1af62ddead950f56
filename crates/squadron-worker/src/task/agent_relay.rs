//! The relay between a sandbox's agent and the control plane (DESIGN §5, "Sandboxes": a
//! sandbox reaches nothing of the host's network, control ports included). Each sandbox that
//! runs `squadron agent` gets its own directory of two Unix sockets, bound into it and owned by
//! its user:
//!
//! - `rest.sock` → a control node's REST listener (enrollment; any node forwards it);
//! - `grpc.sock` → the leader's gRPC listener, looked up afresh for every connection, so an
//!   agent that reconnects after a leader change reaches the new leader.
//!
//! The relay only moves bytes: TLS runs between the agent and the node, so the worker sees
//! neither the agent's token nor its calls. A sandbox holds at most
//! `RELAY_CONNECTIONS_PER_SANDBOX_MAX` connections at once; more are closed on accept.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use squadron_core::ids::TaskId;
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::{AbortHandle, JoinSet};

use crate::control_link::ControlLink;
use crate::error::WorkerError;

pub(crate) const REST_SOCKET_NAME: &str = "rest.sock";
pub(crate) const GRPC_SOCKET_NAME: &str = "grpc.sock";
/// Connections one sandbox may hold through its relay at once.
pub(crate) const RELAY_CONNECTIONS_PER_SANDBOX_MAX: usize = 8;
/// How long dialing a control node may take.
const DIAL_TIMEOUT_MS: u64 = 5_000;

/// Which listener a socket leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Rest,
    Grpc,
}

/// The open relays of this worker's sandboxes, by task.
#[derive(Debug, Clone)]
pub(crate) struct AgentRelays {
    control: ControlLink,
    /// `host:port` of every configured control node's REST listener.
    rest: Arc<Vec<String>>,
    open: Arc<Mutex<HashMap<TaskId, Vec<AbortHandle>>>>,
}

impl AgentRelays {
    pub(crate) fn new(control: ControlLink, rest_urls: &[String]) -> Self {
        let rest = rest_urls.iter().map(|u| authority(u).to_string()).collect();
        Self {
            control,
            rest: Arc::new(rest),
            open: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Binds the sockets in `dir` for `task`'s sandbox, owned by `owner`; re-binds them after
    /// a worker restart (the sandbox keeps the directory mounted, so it sees the new sockets).
    /// Does nothing if they are open already.
    pub(crate) fn open(
        &self,
        task: TaskId,
        dir: &Path,
        owner: (u32, u32),
    ) -> Result<(), WorkerError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.contains_key(&task) {
            return Ok(());
        }
        let mut handles = Vec::new();
        for (name, target) in [
            (REST_SOCKET_NAME, Target::Rest),
            (GRPC_SOCKET_NAME, Target::Grpc),
        ] {
            let listener = bind(&dir.join(name), owner)?;
            let relay = self.clone();
            handles.push(tokio::spawn(relay.serve(task, listener, target)).abort_handle());
        }
        open.insert(task, handles);
        Ok(())
    }

    /// Closes the relay of `task` and every connection through it.
    pub(crate) fn close(&self, task: TaskId) {
        let handles = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&task);
        for h in handles.into_iter().flatten() {
            h.abort();
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

    async fn carry(&self, mut agent: UnixStream, target: Target) -> Result<(), String> {
        let mut node = self.dial(target).await?;
        tokio::io::copy_bidirectional(&mut agent, &mut node)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn dial(&self, target: Target) -> Result<TcpStream, String> {
        let candidates = match target {
            Target::Grpc => vec![self
                .control
                .leader_grpc_address()
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

/// `host:port` of a URL or address.
fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest)
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
    std::os::unix::fs::chown(path, Some(owner.0), Some(owner.1))
        .map_err(|e| WorkerError::io("give the agent socket to the sandbox user", path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| WorkerError::io("restrict the agent socket", path, e))?;
    Ok(listener)
}
