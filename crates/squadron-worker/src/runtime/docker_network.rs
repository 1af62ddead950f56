//! The Docker runtime's managed network for `outbound` containers: one bridge per worker,
//! `squadron-{tag}` on interface `sqd{tag}`, addressed from 100.68.0.0/14 (a /24 per worker;
//! never the private ranges), without inter-container traffic (`enable_icc=false`), with the
//! engine's NAT and the same egress filter as the process runtime's namespaces
//! (`squadron_isolation::egress_filter`) on the bridge: the host itself, link-local and the
//! metadata address, every sandbox range, IPv6 and the deny list are dropped.
//!
//! A worker with a gateway allow list has a second bridge for `gateway` containers,
//! `squadron-{tag}-gw` on `sqg{tag}`, without NAT, forwarding nothing at all: its filter
//! admits only the worker's proxy on the bridge's own address (`runtime::gateway`).
//!
//! The networks live as long as the worker's id: `ensure` makes one (or finds it) and
//! installs its filter afresh at every start; containers join and leave it with their own
//! creation and removal, so nothing per sandbox is left to clean up.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use bollard::models::{Ipam, IpamConfig};
use bollard::network::{CreateNetworkOptions, InspectNetworkOptions};
use bollard::Docker;
use ipnet::Ipv4Net;
use squadron_isolation::{EgressFilter, NetworkConfig};

use crate::error::WorkerError;

/// The Docker bridges' range: 100.68.0.0/14, inside 100.64.0.0/10 beside the process
/// runtime's 100.64.0.0/14.
pub(crate) const DOCKER_BRIDGES_NET: (Ipv4Addr, u8) = (Ipv4Addr::new(100, 68, 0, 0), 14);
/// /24 subnets in it: one per worker.
pub(crate) const DOCKER_BRIDGE_SUBNETS: u32 = 1 << 10;
/// Subnets tried when another network holds the first choice.
pub(crate) const DOCKER_BRIDGE_SUBNET_ATTEMPTS_MAX: u32 = 32;
const RUNTIME_NAME: &str = "docker";

/// A worker's managed network, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ManagedNetwork {
    pub(crate) name: String,
    pub(crate) bridge: String,
    /// The gateway bridge: the port of the proxy on the bridge's address, which is all its
    /// containers may reach.
    pub(crate) proxy_port: Option<u16>,
}

impl ManagedNetwork {
    pub(crate) fn for_owner(owner: &str) -> ManagedNetwork {
        ManagedNetwork {
            name: format!("squadron-{owner}"),
            bridge: format!("sqd{owner}"),
            proxy_port: None,
        }
    }

    /// The bridge of `gateway` containers, whose proxy listens on `proxy_port`.
    pub(crate) fn gateway_for_owner(owner: &str, proxy_port: u16) -> ManagedNetwork {
        ManagedNetwork {
            name: format!("squadron-{owner}-gw"),
            bridge: format!("sqg{owner}"),
            proxy_port: Some(proxy_port),
        }
    }

    /// The filter on the bridge (NAT is the engine's); on the gateway bridge, nothing but
    /// the proxy at `address`.
    pub(crate) fn filter(&self, config: &NetworkConfig, address: Ipv4Addr) -> EgressFilter {
        let suffix = if self.proxy_port.is_some() {
            "dockergw"
        } else {
            "docker"
        };
        EgressFilter {
            table: format!("sq_{}_{suffix}", config.owner),
            interface: self.bridge.clone(),
            deny: config.deny.clone(),
            masquerade: None,
            gateway: self
                .proxy_port
                .map(|port| std::net::SocketAddrV4::new(address, port)),
            allow: config.allow.clone(),
            // Many containers on one bridge, their addresses the engine's to assign: nothing
            // from outside its /24 (a `full_control` container holds NET_RAW).
            source: Ipv4Net::new(address, 24).ok().map(|n| n.trunc()),
        }
    }

    /// Makes the network unless it exists, then installs its filter; returns it with the
    /// bridge's own address (the containers' gateway).
    pub(crate) async fn ensure(
        docker: &Docker,
        config: &NetworkConfig,
        net: ManagedNetwork,
    ) -> Result<(ManagedNetwork, Ipv4Addr), WorkerError> {
        config.probe().map_err(network_error)?;
        let found = docker
            .inspect_network(&net.name, None::<InspectNetworkOptions<String>>)
            .await;
        if found.is_err() {
            if let Err(e) = net.create(docker, config).await {
                // Made by a concurrent start of the same worker id in the meantime?
                docker
                    .inspect_network(&net.name, None::<InspectNetworkOptions<String>>)
                    .await
                    .map_err(|_| e)?;
            }
        }
        let address = net.bridge_address(docker).await?;
        net.filter(config, address)
            .install(&config.nft)
            .map_err(network_error)?;
        Ok((net, address))
    }

    /// The bridge's address: the network's gateway, else the first address of its subnet
    /// (the engine's choice when none is given).
    async fn bridge_address(&self, docker: &Docker) -> Result<Ipv4Addr, WorkerError> {
        let found = docker
            .inspect_network(&self.name, None::<InspectNetworkOptions<String>>)
            .await
            .map_err(|e| {
                WorkerError::runtime(RUNTIME_NAME, format!("inspect network {}: {e}", self.name))
            })?;
        let config = found
            .ipam
            .and_then(|i| i.config)
            .and_then(|c| c.into_iter().next())
            .unwrap_or_default();
        let from_gateway = config.gateway.as_deref().and_then(|g| g.parse().ok());
        let from_subnet = config
            .subnet
            .as_deref()
            .and_then(|s| s.parse::<Ipv4Net>().ok())
            .map(|n| Ipv4Addr::from(u32::from(n.network()) + 1));
        from_gateway.or(from_subnet).ok_or_else(|| {
            WorkerError::runtime(
                RUNTIME_NAME,
                format!("network {} has no IPv4 subnet", self.name),
            )
        })
    }

    async fn create(&self, docker: &Docker, config: &NetworkConfig) -> Result<(), WorkerError> {
        // The gateway bridge starts its search one subnet further, beside the other.
        let first = (u32::from_str_radix(&config.owner, 16).unwrap_or(0)
            + u32::from(self.proxy_port.is_some()))
            % DOCKER_BRIDGE_SUBNETS;
        let mut last = String::new();
        for n in 0..DOCKER_BRIDGE_SUBNET_ATTEMPTS_MAX {
            let subnet = bridge_subnet((first + n) % DOCKER_BRIDGE_SUBNETS);
            let options = CreateNetworkOptions {
                name: self.name.clone(),
                check_duplicate: true,
                driver: "bridge".to_owned(),
                ipam: Ipam {
                    config: Some(vec![IpamConfig {
                        subnet: Some(subnet.to_string()),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                options: HashMap::from([
                    (
                        "com.docker.network.bridge.name".to_owned(),
                        self.bridge.clone(),
                    ),
                    (
                        "com.docker.network.bridge.enable_icc".to_owned(),
                        "false".to_owned(),
                    ),
                    // The gateway bridge forwards nothing, so it needs no NAT either.
                    (
                        "com.docker.network.bridge.enable_ip_masquerade".to_owned(),
                        self.proxy_port.is_none().to_string(),
                    ),
                ]),
                labels: HashMap::from([("squadron.managed".to_owned(), "true".to_owned())]),
                ..Default::default()
            };
            match docker.create_network(options).await {
                Ok(_) => {
                    tracing::info!(network = %self.name, %subnet, "managed network created");
                    return Ok(());
                }
                // Another network holds the subnet: the next one.
                Err(e) if e.to_string().contains("overlap") => last = e.to_string(),
                Err(e) => {
                    return Err(WorkerError::runtime(
                        RUNTIME_NAME,
                        format!("create network {}: {e}", self.name),
                    ))
                }
            }
        }
        Err(WorkerError::runtime(
            RUNTIME_NAME,
            format!(
                "create network {}: no free subnet after {DOCKER_BRIDGE_SUBNET_ATTEMPTS_MAX} \
                 tries ({last})",
                self.name
            ),
        ))
    }
}

/// The `n`th /24 of `DOCKER_BRIDGES_NET`.
fn bridge_subnet(n: u32) -> Ipv4Net {
    let base = u32::from(DOCKER_BRIDGES_NET.0) + (n << 8);
    Ipv4Net::new(Ipv4Addr::from(base), 24).unwrap_or_default()
}

fn network_error(e: squadron_isolation::IsolationError) -> WorkerError {
    WorkerError::runtime(RUNTIME_NAME, format!("managed network: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_subnets_lie_in_100_68_slash_14() {
        let range = Ipv4Net::new(DOCKER_BRIDGES_NET.0, DOCKER_BRIDGES_NET.1).unwrap();
        let cgnat: Ipv4Net = "100.64.0.0/10".parse().unwrap();
        for n in [0, 1, DOCKER_BRIDGE_SUBNETS - 1] {
            let subnet = bridge_subnet(n);
            assert!(
                range.contains(&subnet) && cgnat.contains(&subnet),
                "{subnet}"
            );
        }
        assert_eq!(bridge_subnet(0).to_string(), "100.68.0.0/24");
        assert_eq!(
            bridge_subnet(DOCKER_BRIDGE_SUBNETS - 1).to_string(),
            "100.71.255.0/24"
        );
        let net = ManagedNetwork::for_owner("0123abcd");
        assert!(net.bridge.len() <= 15);
        let gw = ManagedNetwork::gateway_for_owner("0123abcd", 3128);
        assert!(gw.bridge.len() <= 15);
        assert_ne!((&gw.name, &gw.bridge), (&net.name, &net.bridge));
        let config = NetworkConfig::new("w");
        let address = Ipv4Addr::new(100, 68, 1, 1);
        assert_eq!(net.filter(&config, address).gateway, None);
        let filter = gw.filter(&config, address);
        assert_eq!(
            filter.gateway,
            Some(std::net::SocketAddrV4::new(address, 3128))
        );
        assert_ne!(filter.table, net.filter(&config, address).table);
    }
}
