//! The network of a process-runtime boundary (tasks and agent attempts), by network mode:
//! `isolated` a namespace with loopback only (bubblewrap's `--unshare-net`); `outbound` a
//! namespace of its own with NAT and the egress filter (`squadron_isolation::sandbox_network`),
//! whose name is recorded beside the attempt so a restarted worker tears down what it made;
//! `gateway` a namespace of its own without NAT or forwarding, whose one way out is the
//! worker's proxy on its host end (recorded as `outbound` is, with the mode, so a restarted
//! worker serves an adopted sandbox's proxy again); `full` the host's own, only where the
//! worker allows it (`--allow-full-network`).

use std::fs;
use std::io::{ErrorKind, Read};
use std::path::Path;

use squadron_core::manifest::NetworkMode;
use squadron_isolation::{BubblewrapCommand, NetworkConfig, SandboxNetwork};

use crate::error::WorkerError;
use crate::runtime::gateway::GATEWAY_PORT;
use crate::support::{remove_path, write_atomic};

/// Longest network record read back (a namespace name).
const NETWORK_RECORD_BYTES_MAX: u64 = 256;

/// What the boundary is put into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BoundaryNetwork {
    Loopback,
    Own(SandboxNetwork),
    /// The namespace of a `gateway` sandbox; its proxy is the runtime's to run.
    Gateway(SandboxNetwork),
    Host,
}

/// What a worker lets manifests ask for beyond `isolated` and `outbound`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NetworkPermits {
    /// `full`: `--allow-full-network`.
    pub(crate) full: bool,
    /// `gateway`: the worker has a gateway allow list (`--gateway-allow`).
    pub(crate) gateway: bool,
}

/// The mode word a gateway sandbox's record carries after its namespace's name.
const GATEWAY_RECORD_WORD: &str = "gateway";

impl BoundaryNetwork {
    /// `full` and `gateway` are refused unless the worker allows them, naming the field.
    pub(crate) fn check_mode(
        mode: NetworkMode,
        permits: NetworkPermits,
    ) -> Result<(), WorkerError> {
        let refusal = match mode {
            NetworkMode::Full if !permits.full => {
                "full (the host's network) is not allowed on this worker; use outbound, or \
                 start the worker with --allow-full-network"
            }
            NetworkMode::Gateway if !permits.gateway => {
                "gateway needs the worker's allow list of destinations (--gateway-allow), \
                 and this worker has none"
            }
            _ => return Ok(()),
        };
        Err(WorkerError::Invalid {
            field: "network_mode".to_owned(),
            message: refusal.to_owned(),
        })
    }

    /// Sets up the network of one attempt; an `outbound` namespace's name is written to
    /// `record` (a file the sandbox cannot reach) once it exists. `listen_inside`: the
    /// worker will listen in the namespace (egress injection), so an `isolated` one is made
    /// ahead too, with loopback only, rather than by bubblewrap at the start.
    pub(crate) fn prepare(
        config: &NetworkConfig,
        mode: NetworkMode,
        permits: NetworkPermits,
        seed: &str,
        record: &Path,
        listen_inside: bool,
    ) -> Result<BoundaryNetwork, WorkerError> {
        Self::check_mode(mode, permits)?;
        let started = std::time::Instant::now();
        let (net, text) = match mode {
            NetworkMode::Isolated if listen_inside => {
                let net = SandboxNetwork::create_loopback(config, seed).map_err(network)?;
                let text = net.netns_name();
                (net, text)
            }
            NetworkMode::Isolated => return Ok(BoundaryNetwork::Loopback),
            NetworkMode::Full => return Ok(BoundaryNetwork::Host),
            NetworkMode::Outbound => {
                let net = SandboxNetwork::create(config, seed).map_err(network)?;
                let text = net.netns_name();
                (net, text)
            }
            NetworkMode::Gateway => {
                let net =
                    SandboxNetwork::create_gateway(config, seed, GATEWAY_PORT).map_err(network)?;
                let text = Self::record_text(&net, true);
                (net, text)
            }
        };
        if let Err(e) = write_atomic(record, text.as_bytes()) {
            let _ = net.destroy();
            return Err(e);
        }
        tracing::debug!(netns = %net.netns_name(), address = %net.sandbox_address(), ?mode, ms = started.elapsed().as_millis() as u64, "sandbox network ready");
        Ok(match mode {
            NetworkMode::Gateway => BoundaryNetwork::Gateway(net),
            _ => BoundaryNetwork::Own(net),
        })
    }

    /// What a network's record holds: its name, and for a `gateway` network the mode's word
    /// (`recorded_gateway` reads it back).
    pub(crate) fn record_text(net: &SandboxNetwork, gateway: bool) -> String {
        if gateway {
            format!("{}\n{GATEWAY_RECORD_WORD}\n", net.netns_name())
        } else {
            net.netns_name()
        }
    }

    /// The gateway network `record` names, if the attempt has one: what a restarted worker
    /// serves a proxy for again.
    pub(crate) fn recorded_gateway(
        config: &NetworkConfig,
        record: &Path,
    ) -> Result<Option<SandboxNetwork>, WorkerError> {
        let Some(text) = read_record(record)? else {
            return Ok(None);
        };
        if text.split_whitespace().nth(1) != Some(GATEWAY_RECORD_WORD) {
            return Ok(None);
        }
        Self::recorded(config, record)
    }

    /// The attempt's own network that `record` names, whatever its mode: where a restarted
    /// worker serves egress injection's proxy again.
    pub(crate) fn recorded(
        config: &NetworkConfig,
        record: &Path,
    ) -> Result<Option<SandboxNetwork>, WorkerError> {
        let Some(text) = read_record(record)? else {
            return Ok(None);
        };
        let name = text.split_whitespace().next().unwrap_or_default();
        Ok(SandboxNetwork::from_name(config, name))
    }

    pub(crate) fn apply(&self, command: BubblewrapCommand) -> BubblewrapCommand {
        match self {
            BoundaryNetwork::Loopback => command.isolate_network(true),
            BoundaryNetwork::Own(net) | BoundaryNetwork::Gateway(net) => {
                command.join_network(Some(net.netns_path()))
            }
            BoundaryNetwork::Host => command,
        }
    }

    /// Tears down the network `record` names, if any, and removes the record.
    pub(crate) fn tear_down(config: &NetworkConfig, record: &Path) -> Result<(), WorkerError> {
        let Some(text) = read_record(record)? else {
            return Ok(());
        };
        let name = text.split_whitespace().next().unwrap_or_default();
        if let Some(net) = SandboxNetwork::from_name(config, name) {
            net.destroy().map_err(network)?;
        }
        remove_path(record)
    }
}

/// The record's text; `None` when there is none.
fn read_record(record: &Path) -> Result<Option<String>, WorkerError> {
    let mut text = String::new();
    match fs::File::open(record) {
        Ok(file) => {
            file.take(NETWORK_RECORD_BYTES_MAX)
                .read_to_string(&mut text)
                .map_err(|e| WorkerError::io("reading", record, e))?;
            Ok(Some(text))
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(WorkerError::io("reading", record, e)),
    }
}

fn network(e: squadron_isolation::IsolationError) -> WorkerError {
    WorkerError::runtime("sandbox network", e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_and_gateway_are_refused_naming_network_mode_unless_allowed() {
        let none = NetworkPermits::default();
        for mode in [NetworkMode::Full, NetworkMode::Gateway] {
            let e = BoundaryNetwork::check_mode(mode, none).unwrap_err();
            assert!(e.to_string().contains("network_mode"), "{e}");
        }
        let full = NetworkPermits {
            full: true,
            gateway: false,
        };
        BoundaryNetwork::check_mode(NetworkMode::Full, full).unwrap();
        BoundaryNetwork::check_mode(NetworkMode::Gateway, full).unwrap_err();
        let gateway = NetworkPermits {
            full: false,
            gateway: true,
        };
        BoundaryNetwork::check_mode(NetworkMode::Gateway, gateway).unwrap();
        BoundaryNetwork::check_mode(NetworkMode::Outbound, none).unwrap();
        BoundaryNetwork::check_mode(NetworkMode::Isolated, none).unwrap();
    }

    #[test]
    fn only_a_gateway_record_names_a_gateway() {
        let tmp = tempfile::tempdir().unwrap();
        let config = NetworkConfig::new("w1");
        let record = tmp.path().join("network-a1");
        assert_eq!(
            BoundaryNetwork::recorded_gateway(&config, &record).unwrap(),
            None
        );
        let name = format!("sq-{}-00ab", config.owner);
        std::fs::write(&record, &name).unwrap();
        assert_eq!(
            BoundaryNetwork::recorded_gateway(&config, &record).unwrap(),
            None
        );
        std::fs::write(&record, format!("{name}\ngateway\n")).unwrap();
        let net = BoundaryNetwork::recorded_gateway(&config, &record)
            .unwrap()
            .expect("a gateway");
        assert_eq!(net.netns_name(), name);
    }
}
