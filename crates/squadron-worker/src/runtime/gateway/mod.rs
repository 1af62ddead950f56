//! `network_mode: gateway`: a sandbox whose only way out is the worker's HTTP CONNECT proxy
//! (`proxy.rs`), which lets it reach the destinations of the worker's allow list
//! (`allow_list.rs`, `--gateway-allow`) and nothing a sandbox may never reach, and logs each
//! connection to the task's events. The process runtime serves each gateway sandbox from a
//! proxy on its own host end; the Docker runtime serves its gateway bridge from one proxy on
//! the bridge's address.

pub(crate) mod allow_list;
pub(crate) mod proxy;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::process::Command;

use ipnet::Ipv4Net;
use squadron_isolation::egress_filter::EGRESS_ALWAYS_DENIED;

pub(crate) use allow_list::AllowList;
pub(crate) use proxy::{Destinations, GatewayProxy, GATEWAY_PORT};

use crate::error::WorkerError;

/// The variables that point a sandbox's HTTP clients at its proxy (curl, git, npm, Python and
/// Node read one spelling or the other); nothing for the loopback.
pub(crate) fn proxy_env(proxy: SocketAddrV4, env: &mut BTreeMap<String, String>) {
    let url = format!("http://{proxy}");
    for name in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        env.insert(name.to_owned(), url.clone());
    }
    for name in ["NO_PROXY", "no_proxy"] {
        env.insert(name.to_owned(), "localhost,127.0.0.1".to_owned());
    }
}

impl Destinations {
    /// What gateway sandboxes of this worker may reach: `allow`, never the always-denied
    /// ranges, the worker's deny list (with the control endpoints) or any address of this
    /// host (read now with `ip`: the proxy connects from the host itself, where every local
    /// listener would otherwise be in reach).
    pub(crate) fn for_worker(
        allow: AllowList,
        deny: &[Ipv4Net],
        ip_program: &Path,
    ) -> Result<Destinations, WorkerError> {
        let mut denied: Vec<Ipv4Net> = EGRESS_ALWAYS_DENIED
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect();
        denied.extend_from_slice(deny);
        denied.extend(host_addresses(ip_program)?.into_iter().map(Ipv4Net::from));
        denied.sort();
        denied.dedup();
        Ok(Destinations {
            allow,
            deny: denied,
        })
    }
}

/// Every IPv4 address of this host's interfaces (`ip -4 -o addr show`).
fn host_addresses(ip_program: &Path) -> Result<Vec<Ipv4Addr>, WorkerError> {
    let out = Command::new(ip_program)
        .args(["-4", "-o", "addr", "show"])
        .env_clear()
        .output()
        .map_err(|e| WorkerError::io("run", ip_program, e))?;
    if !out.status.success() {
        return Err(WorkerError::runtime(
            "gateway",
            format!(
                "{} -4 -o addr show: {}",
                ip_program.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(parse_addresses(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_addresses(listing: &str) -> Vec<Ipv4Addr> {
    listing
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace().skip_while(|w| *w != "inet");
            let cidr = words.nth(1)?;
            cidr.split('/').next()?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_from_ip_s_listing() {
        let listing = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                       2: eth0    inet 203.0.113.5/24 brd 203.0.113.255 scope global eth0\n\
                       3: weird    inet6 ::1/128\n";
        assert_eq!(
            parse_addresses(listing),
            vec![Ipv4Addr::LOCALHOST, Ipv4Addr::new(203, 0, 113, 5)]
        );
    }

    #[test]
    fn the_destinations_deny_this_host_and_the_always_denied_ranges() {
        let d = Destinations::for_worker(
            AllowList::parse(&["100.100.0.0/16".to_owned()]).unwrap(),
            &["198.51.100.0/24".parse().unwrap()],
            Path::new("/usr/sbin/ip"),
        )
        .unwrap();
        for denied in ["127.0.0.1", "169.254.169.254", "100.64.0.1", "198.51.100.7"] {
            assert!(!d.permits(denied.parse().unwrap()), "{denied}");
        }
        for own in crate::runtime::test_internet::host_addresses() {
            assert!(!d.permits(own), "{own} is this host's");
        }
        assert!(d.permits(Ipv4Addr::new(100, 100, 3, 2)));
    }

    #[test]
    fn the_proxy_variables_name_the_proxy_in_both_spellings() {
        let mut env = BTreeMap::new();
        proxy_env(
            SocketAddrV4::new(Ipv4Addr::new(100, 64, 0, 1), 3128),
            &mut env,
        );
        assert_eq!(env["HTTPS_PROXY"], "http://100.64.0.1:3128");
        assert_eq!(env["http_proxy"], "http://100.64.0.1:3128");
        assert_eq!(env["NO_PROXY"], "localhost,127.0.0.1");
    }
}
