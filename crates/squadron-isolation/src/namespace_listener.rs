//! A TCP listener inside a sandbox's network namespace, owned by the worker's process: what
//! the worker serves on the sandbox's own loopback (egress injection's proxy) without a
//! process of its own in there. A socket belongs to the namespace it was created in for its
//! whole life, so only its creation needs the namespace.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};

use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};

use crate::error::IsolationError;

/// Binds `addr` inside the network namespace `netns` (`/run/netns/{name}`), non-blocking.
///
/// `setns` moves only the calling thread, so the bind runs on a thread of its own that ends
/// right after: no thread of the caller's (a tokio worker) ever changes namespace.
pub fn bind_in_namespace(netns: &Path, addr: SocketAddr) -> Result<TcpListener, IsolationError> {
    let path: PathBuf = netns.to_owned();
    let bind = move || -> Result<TcpListener, IsolationError> {
        let ns = File::open(&path).map_err(|e| IsolationError::io("open", &path, e))?;
        move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network))
            .map_err(|e| IsolationError::io("enter the network namespace", &path, e.into()))?;
        let listener = TcpListener::bind(addr)
            .map_err(|e| IsolationError::io("bind in the namespace", &path, e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| IsolationError::io("set non-blocking", &path, e))?;
        Ok(listener)
    };
    std::thread::Builder::new()
        .name("netns-bind".into())
        .spawn(bind)
        .map_err(|e| {
            IsolationError::Launch(format!("a thread to bind in {}: {e}", netns.display()))
        })?
        .join()
        .map_err(|_| IsolationError::Launch(format!("binding in {} panicked", netns.display())))?
}
