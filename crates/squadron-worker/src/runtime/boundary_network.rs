//! The network of a process-runtime boundary (tasks and agent attempts), by network mode:
//! `isolated` a namespace with loopback only (bubblewrap's `--unshare-net`); `outbound` a
//! namespace of its own with NAT and the egress filter (`squadron_isolation::sandbox_network`),
//! whose name is recorded beside the attempt so a restarted worker tears down what it made;
//! `full` the host's own, only where the worker allows it (`--allow-full-network`).

use std::fs;
use std::io::{ErrorKind, Read};
use std::path::Path;

use squadron_core::manifest::NetworkMode;
use squadron_isolation::{BubblewrapCommand, NetworkConfig, SandboxNetwork};

use crate::error::WorkerError;
use crate::support::{remove_path, write_atomic};

/// Longest network record read back (a namespace name).
const NETWORK_RECORD_BYTES_MAX: u64 = 256;

/// What the boundary is put into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BoundaryNetwork {
    Loopback,
    Own(SandboxNetwork),
    Host,
}

impl BoundaryNetwork {
    /// `full` is refused unless the worker allows it, naming the field.
    pub(crate) fn check_mode(mode: NetworkMode, allow_full: bool) -> Result<(), WorkerError> {
        if mode == NetworkMode::Full && !allow_full {
            return Err(WorkerError::Invalid {
                field: "network_mode".to_owned(),
                message: "full (the host's network) is not allowed on this worker; use \
                          outbound, or start the worker with --allow-full-network"
                    .to_owned(),
            });
        }
        Ok(())
    }

    /// Sets up the network of one attempt; an `outbound` namespace's name is written to
    /// `record` (a file the sandbox cannot reach) once it exists.
    pub(crate) fn prepare(
        config: &NetworkConfig,
        mode: NetworkMode,
        allow_full: bool,
        seed: &str,
        record: &Path,
    ) -> Result<BoundaryNetwork, WorkerError> {
        Self::check_mode(mode, allow_full)?;
        match mode {
            NetworkMode::Isolated => Ok(BoundaryNetwork::Loopback),
            NetworkMode::Full => Ok(BoundaryNetwork::Host),
            NetworkMode::Outbound => {
                let started = std::time::Instant::now();
                let net = SandboxNetwork::create(config, seed).map_err(network)?;
                if let Err(e) = write_atomic(record, net.netns_name().as_bytes()) {
                    let _ = net.destroy();
                    return Err(e);
                }
                tracing::debug!(netns = %net.netns_name(), address = %net.sandbox_address(), ms = started.elapsed().as_millis() as u64, "sandbox network ready");
                Ok(BoundaryNetwork::Own(net))
            }
        }
    }

    pub(crate) fn apply(&self, command: BubblewrapCommand) -> BubblewrapCommand {
        match self {
            BoundaryNetwork::Loopback => command.isolate_network(true),
            BoundaryNetwork::Own(net) => command.join_network(Some(net.netns_path())),
            BoundaryNetwork::Host => command,
        }
    }

    /// Tears down the network `record` names, if any, and removes the record.
    pub(crate) fn tear_down(config: &NetworkConfig, record: &Path) -> Result<(), WorkerError> {
        let mut name = String::new();
        match fs::File::open(record) {
            Ok(file) => {
                file.take(NETWORK_RECORD_BYTES_MAX)
                    .read_to_string(&mut name)
                    .map_err(|e| WorkerError::io("reading", record, e))?;
            }
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(WorkerError::io("reading", record, e)),
        }
        if let Some(net) = SandboxNetwork::from_name(config, name.trim()) {
            net.destroy().map_err(network)?;
        }
        remove_path(record)
    }
}

fn network(e: squadron_isolation::IsolationError) -> WorkerError {
    WorkerError::runtime("sandbox network", e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_is_refused_naming_network_mode_unless_allowed() {
        let e = BoundaryNetwork::check_mode(NetworkMode::Full, false).unwrap_err();
        assert!(e.to_string().contains("network_mode"), "{e}");
        BoundaryNetwork::check_mode(NetworkMode::Full, true).unwrap();
        BoundaryNetwork::check_mode(NetworkMode::Outbound, false).unwrap();
        BoundaryNetwork::check_mode(NetworkMode::Isolated, false).unwrap();
    }
}
