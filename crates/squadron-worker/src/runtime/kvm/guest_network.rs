//! The networks of this runtime's guests: `isolated` is no NIC at all; `outbound` is one
//! virtio NIC on a tap the worker makes, addresses and filters exactly as a process sandbox's
//! host end (`SandboxNetwork::create_tap`: the same /30 of 100.64.0.0/14, the same egress
//! filter, deny and allow lists, NAT through the host). The tap's name is recorded in the
//! domain's directory, so `destroy` (also after a restart) removes it; the worker's sweep at
//! start skips a tap a running guest holds open, which a restarted worker adopts.
//!
//! The tables and namespaces are tagged with the worker's id and `/kvm`, apart from the
//! process runtime's and the agent profiles' of the same worker, whose sweeps would otherwise
//! take a running guest's tap for a leftover.

use std::io::Read;
use std::net::Ipv4Addr;
use std::path::Path;

use squadron_core::manifest::NetworkMode;
use squadron_isolation::{NetworkConfig, SandboxNetwork};

use super::domain_xml::GuestNic;
use crate::error::WorkerError;
use crate::runtime::boundary_network::BoundaryNetwork;
use crate::support::write_atomic;

/// Name servers passed to a guest at most (what a resolver reads, `resolv.conf`'s MAXNS).
const GUEST_DNS_SERVERS_MAX: usize = 3;
/// The file naming an `outbound` guest's tap, in its domain's directory.
pub(crate) const NETWORK_RECORD_NAME: &str = "network";
/// The longest network record read back (a network's name).
const NETWORK_RECORD_BYTES_MAX: u64 = 256;
/// The most domain directories read for records at start.
const DOMAIN_RECORDS_READ_MAX: usize = 100_000;
/// The longest `resolv.conf` read.
const RESOLV_CONF_BYTES_MAX: usize = 64 * 1024;

/// What this runtime's guests may have for a network.
#[derive(Debug, Clone)]
pub(crate) struct GuestNetworks {
    /// The tap networks' programs and policy, or why there are none on this host.
    config: Result<NetworkConfig, String>,
    dns: Vec<Ipv4Addr>,
}

impl GuestNetworks {
    /// Checks the host for tap networks and sweeps what a previous life of the worker left,
    /// but for the networks the records in `domains` (the domains' directories) name.
    pub(crate) fn new(config: NetworkConfig, domains: &Path) -> GuestNetworks {
        let config = match config.probe() {
            Ok(()) => {
                match SandboxNetwork::sweep_keeping(&config, &recorded_names(domains)) {
                    Ok(removed) if !removed.is_empty() => {
                        tracing::info!(?removed, "removed leftover guest networks");
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "cannot sweep leftover guest networks"),
                }
                Ok(config)
            }
            Err(e) => {
                tracing::warn!(error = %e, "KVM guests get `isolated` networks only");
                Err(e.to_string())
            }
        };
        let dns = std::fs::read("/etc/resolv.conf")
            .map(|bytes| guest_name_servers(&bytes[..bytes.len().min(RESOLV_CONF_BYTES_MAX)]))
            .unwrap_or_default();
        GuestNetworks { config, dns }
    }

    /// `isolated` always; `outbound` where the host makes tap networks; the other modes
    /// are refused naming the field.
    pub(crate) fn check(&self, mode: NetworkMode) -> Result<(), WorkerError> {
        let refusal = match (mode, &self.config) {
            (NetworkMode::Isolated, _) | (NetworkMode::Outbound, Ok(_)) => return Ok(()),
            (NetworkMode::Outbound, Err(why)) => {
                format!("outbound needs sandbox networks, which this host cannot make: {why}")
            }
            (other, _) => format!(
                "the KVM runtime offers `isolated` and `outbound`; `{other}` needs the \
                 process or Docker runtime"
            ),
        };
        Err(WorkerError::Invalid {
            field: "network_mode".to_owned(),
            message: refusal,
        })
    }

    /// The NIC of an attempt in `mode`, its tap made and recorded in `record` (`None` for
    /// `isolated`).
    pub(crate) fn prepare(
        &self,
        mode: NetworkMode,
        seed: &str,
        record: &Path,
    ) -> Result<Option<GuestNic>, WorkerError> {
        self.check(mode)?;
        let Ok(config) = &self.config else {
            return Ok(None);
        };
        if mode != NetworkMode::Outbound {
            return Ok(None);
        }
        let net = SandboxNetwork::create_tap(config, seed)
            .map_err(|e| WorkerError::runtime("guest network", e.to_string()))?;
        if let Err(e) = write_atomic(record, net.netns_name().as_bytes()) {
            let _ = net.destroy();
            return Err(e);
        }
        tracing::debug!(tap = %net.host_interface(), address = %net.sandbox_address(), "guest network ready");
        Ok(Some(GuestNic {
            tap: net.host_interface(),
            address: net.sandbox_address(),
            gateway: net.host_address(),
            dns: self.dns.clone(),
        }))
    }

    /// Removes the tap `record` names and the record; nothing when there is none.
    pub(crate) fn tear_down(&self, record: &Path) -> Result<(), WorkerError> {
        match &self.config {
            Ok(config) => BoundaryNetwork::tear_down(config, record),
            Err(_) => Ok(()),
        }
    }
}

/// The network names the records under `domains` hold (`<domain>/network`).
fn recorded_names(domains: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(domains) else {
        return Vec::new();
    };
    entries
        .flatten()
        .take(DOMAIN_RECORDS_READ_MAX)
        .filter_map(|e| {
            let mut text = String::new();
            std::fs::File::open(e.path().join(NETWORK_RECORD_NAME))
                .ok()?
                .take(NETWORK_RECORD_BYTES_MAX)
                .read_to_string(&mut text)
                .ok()?;
            Some(text.split_whitespace().next()?.to_owned())
        })
        .collect()
}

/// The IPv4 name servers of a `resolv.conf` a guest could reach: none on loopback (the
/// host's own resolver, which the egress filter keeps from every sandbox) or link-local.
fn guest_name_servers(resolv_conf: &[u8]) -> Vec<Ipv4Addr> {
    String::from_utf8_lossy(resolv_conf)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next()?.parse::<Ipv4Addr>().ok())
                .flatten()
        })
        .filter(|a| !a.is_loopback() && !a.is_link_local() && !a.is_unspecified())
        .take(GUEST_DNS_SERVERS_MAX)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_servers_a_guest_cannot_reach_are_left_out() {
        let text = b"# made by hand\nsearch example.org\nnameserver 127.0.0.53\n\
            nameserver 198.51.100.53\nnameserver ::1\nnameserver 169.254.1.1\n\
            nameserver 203.0.113.9\nnameserver 203.0.113.10\nnameserver 203.0.113.11\n";
        assert_eq!(
            guest_name_servers(text),
            ["198.51.100.53", "203.0.113.9", "203.0.113.10"]
                .map(|a| a.parse::<Ipv4Addr>().unwrap())
        );
        assert!(guest_name_servers(b"nameserver\n\xff\xfe").is_empty());
    }

    #[test]
    fn the_records_of_the_domains_name_the_networks_kept() {
        let domains = tempfile::tempdir().unwrap();
        for (domain, record) in [
            ("a", Some("sq-0000abcd-0001\n")),
            ("b", None),
            ("c", Some("sq-0000abcd-00ff")),
        ] {
            let dir = domains.path().join(domain);
            std::fs::create_dir(&dir).unwrap();
            if let Some(text) = record {
                std::fs::write(dir.join(NETWORK_RECORD_NAME), text).unwrap();
            }
        }
        let mut names = recorded_names(domains.path());
        names.sort();
        assert_eq!(names, ["sq-0000abcd-0001", "sq-0000abcd-00ff"]);
        assert!(recorded_names(&domains.path().join("missing")).is_empty());
    }

    #[test]
    fn only_isolated_and_outbound_are_offered_naming_the_field() {
        let networks = GuestNetworks {
            config: Ok(NetworkConfig::new("w1")),
            dns: Vec::new(),
        };
        networks.check(NetworkMode::Isolated).unwrap();
        networks.check(NetworkMode::Outbound).unwrap();
        for mode in [NetworkMode::Gateway, NetworkMode::Full] {
            let e = networks.check(mode).unwrap_err().to_string();
            assert!(e.contains("network_mode") && e.contains("isolated"), "{e}");
        }
        let without = GuestNetworks {
            config: Err("/usr/sbin/nft not found".into()),
            dns: Vec::new(),
        };
        without.check(NetworkMode::Isolated).unwrap();
        let e = without
            .check(NetworkMode::Outbound)
            .unwrap_err()
            .to_string();
        assert!(e.contains("network_mode") && e.contains("nft"), "{e}");
    }
}
