//! The networks of this runtime's guests: `isolated` is no NIC at all; `outbound` is one
//! virtio NIC on a tap the worker makes, addresses and filters exactly as a process sandbox's
//! host end (`SandboxNetwork::create_tap`: the same /30 of 100.64.0.0/14, the same egress
//! filter, deny and allow lists, NAT through the host); `gateway` is the same tap forwarding
//! nothing, whose one way out is the worker's HTTP CONNECT proxy on its host address (served
//! per guest, again for a guest a restarted worker adopts), named in the agent's proxy
//! variables. The tap's name is recorded in the domain's directory, so `destroy` (also after
//! a restart) removes it; the worker's sweep at start keeps the taps those records name or a
//! running guest holds open.
//!
//! The tables and namespaces are tagged with the worker's id and `/kvm`, apart from the
//! process runtime's and the agent profiles' of the same worker, whose sweeps would otherwise
//! take a running guest's tap for a leftover.

use std::collections::HashMap;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::sync::Arc;

use squadron_core::manifest::NetworkMode;
use squadron_isolation::{NetworkConfig, SandboxNetwork};

use super::domain_xml::GuestNic;
use crate::error::WorkerError;
use crate::runtime::boundary_network::BoundaryNetwork;
use crate::runtime::gateway::{Destinations, GatewayProxy, GATEWAY_PORT};
use crate::support::write_atomic;
use crate::task::task_dir::TaskDir;

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
    /// What `gateway` guests may reach (`--gateway-allow`); none, no `gateway`.
    gateway: Option<Arc<Destinations>>,
    /// The proxy of each running `gateway` guest, by domain name.
    proxies: Arc<tokio::sync::Mutex<HashMap<String, GatewayProxy>>>,
}

impl GuestNetworks {
    /// Checks the host for tap networks and sweeps what a previous life of the worker left,
    /// but for the networks the records in `domains` (the domains' directories) name.
    pub(crate) fn new(
        config: NetworkConfig,
        gateway: Option<Arc<Destinations>>,
        domains: &Path,
    ) -> GuestNetworks {
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
        GuestNetworks {
            config,
            dns,
            gateway,
            proxies: Arc::default(),
        }
    }

    /// `isolated` always; `outbound` where the host makes tap networks, `gateway` where it
    /// does and the worker has an allow list; `full` never; a refusal names the field.
    pub(crate) fn check(&self, mode: NetworkMode) -> Result<(), WorkerError> {
        let refusal = match (mode, &self.config) {
            (NetworkMode::Isolated, _) | (NetworkMode::Outbound, Ok(_)) => return Ok(()),
            (NetworkMode::Gateway, Ok(_)) if self.gateway.is_some() => return Ok(()),
            (NetworkMode::Gateway, Ok(_)) => "gateway needs the worker's allow list of \
                 destinations (--gateway-allow), and this worker has none"
                .to_owned(),
            (NetworkMode::Outbound | NetworkMode::Gateway, Err(why)) => {
                format!("{mode} needs sandbox networks, which this host cannot make: {why}")
            }
            (NetworkMode::Full, _) => "the KVM runtime offers `isolated`, `outbound` and \
                 `gateway`; `full` (the host's network) needs the process or Docker runtime"
                .to_owned(),
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
        let gateway = match mode {
            NetworkMode::Outbound => false,
            NetworkMode::Gateway => true,
            NetworkMode::Isolated | NetworkMode::Full => return Ok(None),
        };
        let made = if gateway {
            SandboxNetwork::create_tap_gateway(config, seed, GATEWAY_PORT)
        } else {
            SandboxNetwork::create_tap(config, seed)
        };
        let net = made.map_err(|e| WorkerError::runtime("guest network", e.to_string()))?;
        let text = BoundaryNetwork::record_text(&net, gateway);
        if let Err(e) = write_atomic(record, text.as_bytes()) {
            let _ = net.destroy();
            return Err(e);
        }
        tracing::debug!(tap = %net.host_interface(), address = %net.sandbox_address(), ?mode, "guest network ready");
        Ok(Some(GuestNic {
            tap: net.host_interface(),
            address: net.sandbox_address(),
            gateway: net.host_address(),
            // Behind the proxy the guest resolves nothing itself.
            dns: if gateway {
                Vec::new()
            } else {
                self.dns.clone()
            },
            proxy: gateway.then(|| SocketAddrV4::new(net.host_address(), GATEWAY_PORT)),
        }))
    }

    /// Serves `domain`'s proxy at `proxy` for connections from `guest` (events to the task's
    /// `events.jsonl`), replacing one this life served before.
    pub(crate) async fn serve_gateway(
        &self,
        domain: &str,
        proxy: SocketAddrV4,
        guest: Ipv4Addr,
        dir: &TaskDir,
    ) -> Result<(), WorkerError> {
        let mut proxies = self.proxies.lock().await;
        // An earlier proxy of this domain holds the address: dropped (stopped) first.
        proxies.remove(domain);
        self.start_proxy(&mut proxies, domain, proxy, guest, dir)
            .await
    }

    async fn start_proxy(
        &self,
        proxies: &mut HashMap<String, GatewayProxy>,
        domain: &str,
        proxy: SocketAddrV4,
        guest: Ipv4Addr,
        dir: &TaskDir,
    ) -> Result<(), WorkerError> {
        let destinations = self.gateway.clone().ok_or_else(|| {
            WorkerError::runtime("guest network", "gateway guest without an allow list")
        })?;
        let served = GatewayProxy::start(proxy.into(), destinations).await?;
        served.admit(guest, dir.clone());
        proxies.insert(domain.to_owned(), served);
        Ok(())
    }

    /// A guest adopted after a restart whose `record` names a `gateway` network gets its
    /// proxy again (the last life's went with it); one this life serves is kept (the driver
    /// adopts a running guest more than once).
    pub(crate) async fn serve_adopted(
        &self,
        domain: &str,
        record: &Path,
        dir: &TaskDir,
    ) -> Result<(), WorkerError> {
        let Ok(config) = &self.config else {
            return Ok(());
        };
        let mut proxies = self.proxies.lock().await;
        if proxies.contains_key(domain) {
            return Ok(());
        }
        if let Some(net) = BoundaryNetwork::recorded_gateway(config, record)? {
            let proxy = SocketAddrV4::new(net.host_address(), GATEWAY_PORT);
            self.start_proxy(&mut proxies, domain, proxy, net.sandbox_address(), dir)
                .await?;
            tracing::info!(domain, "gateway proxy served again for an adopted guest");
        }
        Ok(())
    }

    /// Stops `domain`'s proxy, if it has one.
    pub(crate) async fn stop_gateway(&self, domain: &str) {
        self.proxies.lock().await.remove(domain);
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
    fn each_mode_is_offered_where_the_worker_can_and_refused_naming_the_field() {
        let networks = GuestNetworks {
            config: Ok(NetworkConfig::new("w1")),
            dns: Vec::new(),
            gateway: None,
            proxies: Arc::default(),
        };
        networks.check(NetworkMode::Isolated).unwrap();
        networks.check(NetworkMode::Outbound).unwrap();
        let e = networks.check(NetworkMode::Full).unwrap_err().to_string();
        assert!(e.contains("network_mode") && e.contains("isolated"), "{e}");
        let e = networks
            .check(NetworkMode::Gateway)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("network_mode") && e.contains("--gateway-allow"),
            "{e}"
        );
        let with_allow_list = GuestNetworks {
            gateway: Some(Arc::new(Destinations {
                allow: crate::runtime::gateway::AllowList::parse(&["198.51.100.0/24".to_owned()])
                    .unwrap(),
                deny: Vec::new(),
            })),
            ..networks.clone()
        };
        with_allow_list.check(NetworkMode::Gateway).unwrap();
        let without = GuestNetworks {
            config: Err("/usr/sbin/nft not found".into()),
            ..with_allow_list
        };
        without.check(NetworkMode::Isolated).unwrap();
        for mode in [NetworkMode::Outbound, NetworkMode::Gateway] {
            let e = without.check(mode).unwrap_err().to_string();
            assert!(e.contains("network_mode") && e.contains("nft"), "{e}");
        }
    }
}
