//! The egress filter of a sandbox interface: one nftables table (family `inet`) the worker
//! owns, shared by the process runtime's own namespaces (`sandbox_network`) and the Docker
//! runtime's managed bridge.
//!
//! On an interface with a `source` (one sandbox's address, or a bridge's subnet), anything
//! sent from elsewhere, and any IPv6, is dropped before any other rule: a VM's kernel writes
//! whatever frames its root likes, and a spoofed source would otherwise be masqueraded as
//! another sandbox, leave un-NATed, or pass the host's conntrack as a reply.
//!
//! Everything arriving from the interface for the host itself (any of its addresses,
//! loopback, every control-plane and worker port) is dropped, except replies to connections
//! the host opened; forwarded traffic from it to the always-denied ranges, to any sandbox
//! range, to IPv6 and to the deny list is dropped; no new connection is forwarded into it.
//! Drops are final in nftables whatever other tables (Docker's, the host's) accept, so the
//! filter holds next to them.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;

use ipnet::Ipv4Net;

use crate::error::IsolationError;
use crate::sandbox_network::run;

/// Forwarded destinations every sandbox is denied, whatever the policy says: "this" network,
/// loopback, link-local (and so the metadata address 169.254.169.254), multicast, the
/// reserved block, and every sandbox's addresses (100.64.0.0/13: the process runtime's
/// 100.64/14 and the Docker bridges' 100.68/14).
pub const EGRESS_ALWAYS_DENIED: [&str; 6] = [
    "0.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "100.64.0.0/13",
];

/// The filter of one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressFilter {
    /// The nftables table (family `inet`).
    pub table: String,
    /// The host-side interface the sandbox's traffic arrives on.
    pub interface: String,
    /// Denied on top of `EGRESS_ALWAYS_DENIED`.
    pub deny: Vec<Ipv4Net>,
    /// Masquerade what this source sends out (the process runtime's NAT); `None` where
    /// another (Docker) already does.
    pub masquerade: Option<Ipv4Addr>,
    /// `gateway` mode: nothing is forwarded at all, and the one thing the sandbox may reach
    /// is the worker's proxy at this host address and port.
    pub gateway: Option<SocketAddrV4>,
    /// The policy's allow list: a new connection to anything outside it is dropped (after
    /// the deny list, which wins); `None` or empty: every destination not denied.
    pub allow: Option<Vec<Ipv4Net>>,
    /// The only sources the interface may send from: a sandbox's own address, or a bridge's
    /// subnet (Docker's, whose containers' addresses the engine assigns); `None`: unchecked.
    pub source: Option<Ipv4Net>,
}

impl EgressFilter {
    /// The table, as `nft -f` reads it. Replacing an existing one is atomic: the file adds,
    /// deletes and declares it again in one transaction.
    pub fn ruleset(&self) -> String {
        let dev = &self.interface;
        let mut denied: Vec<String> = EGRESS_ALWAYS_DENIED
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        denied.extend(self.deny.iter().map(ToString::to_string));
        let masquerade = self.masquerade.map_or(String::new(), |source| {
            format!(
                "\tchain postrouting {{ type nat hook postrouting priority srcnat; policy accept;\n\
                 \t\tip saddr {source} oifname != \"{dev}\" masquerade\n\
                 \t}}\n"
            )
        });
        let (proxy, forwarded) = match self.gateway {
            Some(proxy) => (
                format!(
                    "\t\tiifname \"{dev}\" ip daddr {} tcp dport {} accept\n",
                    proxy.ip(),
                    proxy.port()
                ),
                format!("\t\tiifname \"{dev}\" drop\n"),
            ),
            None => (
                String::new(),
                format!(
                    "\t\tiifname \"{dev}\" meta nfproto ipv6 drop\n\
                     \t\tiifname \"{dev}\" ip daddr @denied drop\n{}",
                    self.allowed_only().map_or(String::new(), |_| format!(
                        "\t\tiifname \"{dev}\" ct state new,invalid,untracked \
                         ip daddr != @allowed drop\n"
                    ))
                ),
            ),
        };
        let spoofed = self.source.map_or(String::new(), |source| {
            format!(
                "\t\tiifname \"{dev}\" meta nfproto ipv6 drop\n\
                 \t\tiifname \"{dev}\" ip saddr != {source} drop\n"
            )
        });
        let allowed_set = self.allowed_only().map_or(String::new(), |allowed| {
            let elements: Vec<String> = allowed.iter().map(ToString::to_string).collect();
            format!(
                "\tset allowed {{ type ipv4_addr; flags interval; auto-merge; elements = {{ {} }} }}\n",
                elements.join(", ")
            )
        });
        format!(
            "add table inet {table}\n\
             delete table inet {table}\n\
             table inet {table} {{\n\
             \tset denied {{ type ipv4_addr; flags interval; auto-merge; elements = {{ {denied} }} }}\n\
             {allowed_set}\
             \tchain input {{ type filter hook input priority filter - 10; policy accept;\n\
             {spoofed}\
             \t\tiifname \"{dev}\" ct state established,related accept\n\
             {proxy}\
             \t\tiifname \"{dev}\" drop\n\
             \t}}\n\
             \tchain forward {{ type filter hook forward priority filter - 10; policy accept;\n\
             {spoofed}\
             {forwarded}\
             \t\toifname \"{dev}\" ct state established,related accept\n\
             \t\toifname \"{dev}\" drop\n\
             \t}}\n\
             {masquerade}}}\n",
            table = self.table,
            denied = denied.join(", "),
        )
    }

    /// The allow list in force, if one narrows egress (an empty list does not).
    fn allowed_only(&self) -> Option<&[Ipv4Net]> {
        self.allow.as_deref().filter(|a| !a.is_empty())
    }

    /// Installs (or replaces) the table.
    pub fn install(&self, nft: &Path) -> Result<(), IsolationError> {
        run(nft, &["-f", "-"], Some(self.ruleset().as_bytes())).map(|_| ())
    }

    /// Removes the table; one already gone is not an error.
    pub fn remove(nft: &Path, table: &str) -> Result<(), IsolationError> {
        match run(nft, &["delete", "table", "inet", table], None) {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("No such file") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ruleset_drops_the_host_link_local_sandboxes_and_the_deny_list() {
        let filter = EgressFilter {
            table: "sq_w_0002".into(),
            interface: "sqh0002".into(),
            deny: vec!["203.0.113.0/24".parse().unwrap()],
            masquerade: Some(Ipv4Addr::new(100, 64, 0, 10)),
            gateway: None,
            allow: None,
            source: None,
        };
        let rules = filter.ruleset();
        for want in [
            "delete table inet sq_w_0002",
            "iifname \"sqh0002\" ct state established,related accept",
            "iifname \"sqh0002\" drop",
            "127.0.0.0/8",
            "169.254.0.0/16",
            "100.64.0.0/13",
            "203.0.113.0/24",
            "ip daddr @denied drop",
            "meta nfproto ipv6 drop",
            "oifname \"sqh0002\" drop",
            "ip saddr 100.64.0.10 oifname != \"sqh0002\" masquerade",
        ] {
            assert!(rules.contains(want), "{want} missing:\n{rules}");
        }
        assert!(!rules.contains("@allowed"), "no allow list: {rules}");
        let docker = EgressFilter {
            masquerade: None,
            ..filter
        };
        assert!(!docker.ruleset().contains("masquerade"));
        assert!(
            !EgressFilter {
                allow: Some(Vec::new()),
                ..docker
            }
            .ruleset()
            .contains("@allowed"),
            "an empty allow list narrows nothing"
        );
    }

    #[test]
    fn an_allow_list_drops_new_connections_elsewhere_after_the_deny_list() {
        let filter = EgressFilter {
            table: "sq_w_0004".into(),
            interface: "sqh0004".into(),
            deny: vec!["203.0.113.0/24".parse().unwrap()],
            masquerade: Some(Ipv4Addr::new(100, 64, 0, 18)),
            gateway: None,
            allow: Some(vec![
                "198.51.100.0/24".parse().unwrap(),
                "192.0.2.7/32".parse().unwrap(),
            ]),
            source: None,
        };
        let rules = filter.ruleset();
        assert!(
            rules.contains("set allowed { type ipv4_addr; flags interval; auto-merge; elements = { 198.51.100.0/24, 192.0.2.7/32 } }"),
            "{rules}"
        );
        let forward = rules.split("chain forward").nth(1).unwrap();
        let denied = forward.find("ip daddr @denied drop").expect(&rules);
        let narrowed = forward
            .find("iifname \"sqh0004\" ct state new,invalid,untracked ip daddr != @allowed drop")
            .expect(&rules);
        assert!(denied < narrowed, "the deny list comes first:\n{rules}");
    }

    #[test]
    fn a_gateway_filter_forwards_nothing_and_admits_only_the_proxy() {
        let filter = EgressFilter {
            table: "sq_w_0003".into(),
            interface: "sqh0003".into(),
            deny: Vec::new(),
            masquerade: None,
            gateway: Some(SocketAddrV4::new(Ipv4Addr::new(100, 64, 0, 13), 3128)),
            allow: Some(vec!["203.0.113.0/24".parse().unwrap()]),
            source: None,
        };
        let rules = filter.ruleset();
        let input = rules.split("chain forward").next().unwrap();
        let accept = input
            .find("iifname \"sqh0003\" ip daddr 100.64.0.13 tcp dport 3128 accept")
            .expect(&rules);
        let drop = input.find("iifname \"sqh0003\" drop").expect(&rules);
        assert!(
            accept < drop,
            "the proxy's accept must come before the drop:\n{rules}"
        );
        let forward = rules.split("chain forward").nth(1).unwrap();
        assert!(forward.contains("iifname \"sqh0003\" drop"), "{rules}");
        assert!(!forward.contains("@denied"), "{rules}");
        assert!(!forward.contains("@allowed"), "{rules}");
        assert!(!rules.contains("masquerade"), "{rules}");
    }

    #[test]
    fn a_sandbox_s_own_interface_drops_every_other_source_before_any_accept() {
        let filter = EgressFilter {
            table: "sq_w_0005".into(),
            interface: "sqh0005".into(),
            deny: Vec::new(),
            masquerade: Some(Ipv4Addr::new(100, 64, 0, 22)),
            gateway: None,
            allow: None,
            source: Some("100.64.0.22/32".parse().unwrap()),
        };
        let gateway = EgressFilter {
            masquerade: None,
            gateway: Some(SocketAddrV4::new(Ipv4Addr::new(100, 64, 0, 21), 3128)),
            ..filter.clone()
        };
        for rules in [filter.ruleset(), gateway.ruleset()] {
            for chain in ["chain input", "chain forward"] {
                let body = rules.split(chain).nth(1).unwrap();
                // The rules, after the chain's own line (its policy says accept).
                let body = &body[body.find('\n').unwrap()..body.find('}').unwrap()];
                let spoofed = body
                    .find("iifname \"sqh0005\" ip saddr != 100.64.0.22/32 drop")
                    .expect(&rules);
                let ipv6 = body
                    .find("iifname \"sqh0005\" meta nfproto ipv6 drop")
                    .expect(&rules);
                let first_accept = body.find("accept").unwrap_or(body.len());
                assert!(
                    spoofed < first_accept && ipv6 < first_accept,
                    "{chain}: the source check comes first:\n{rules}"
                );
            }
        }
        let bridge = EgressFilter {
            source: None,
            ..filter
        };
        assert!(
            !bridge.ruleset().contains("saddr !="),
            "{}",
            bridge.ruleset()
        );
    }
}
