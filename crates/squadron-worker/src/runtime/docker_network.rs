//! The Docker runtime's managed network for `outbound` containers: one bridge per worker,
//! `squadron-{tag}` on interface `sqd{tag}`, addressed from 100.68.0.0/14 (a /24 per worker;
//! never the private ranges), without inter-container traffic (`enable_icc=false`), with the
//! engine's NAT and the same egress filter as the process runtime's namespaces
//! (`squadron_isolation::egress_filter`) on the bridge: the host itself, link-local and the
//! metadata address, every sandbox range, IPv6 and the deny list are dropped.
//!
//! The network lives as long as the worker's id: `ensure` makes it (or finds it) and
//! installs the filter afresh at every start; containers join and leave it with their own
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
}

impl ManagedNetwork {
    pub(crate) fn for_owner(owner: &str) -> ManagedNetwork {
        ManagedNetwork {
            name: format!("squadron-{owner}"),
            bridge: format!("sqd{owner}"),
        }
    }

    /// The filter on the bridge (NAT is the engine's).
    pub(crate) fn filter(&self, config: &NetworkConfig) -> EgressFilter {
        EgressFilter {
            table: format!("sq_{}_docker", config.owner),
            interface: self.bridge.clone(),
            deny: config.deny.clone(),
            masquerade: None,
        }
    }

    /// Makes the network unless it exists, then installs its filter.
    pub(crate) async fn ensure(
        docker: &Docker,
        config: &NetworkConfig,
    ) -> Result<ManagedNetwork, WorkerError> {
        config.probe().map_err(network_error)?;
        let net = ManagedNetwork::for_owner(&config.owner);
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
        net.filter(config)
            .install(&config.nft)
            .map_err(network_error)?;
        Ok(net)
    }

    async fn create(&self, docker: &Docker, config: &NetworkConfig) -> Result<(), WorkerError> {
        let first = u32::from_str_radix(&config.owner, 16).unwrap_or(0) % DOCKER_BRIDGE_SUBNETS;
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
    }
}
