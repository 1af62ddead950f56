//! A network namespace of its own for an `outbound` sandbox: a veth pair to the host, NAT
//! through the host, and an egress filter the worker owns (issue 14 item 1, DESIGN §5).
//!
//! Per sandbox, all named after its slot `S` (0..`NETWORK_SLOTS`) and the worker's tag `W`:
//! - a named namespace `sq-W-S` (`/run/netns/sq-W-S`) with `lo` up and `eth0`, addressed
//!   `100.64.0.0/14` slot `S` (a /30: host `.1`, sandbox `.2`), default route via the host;
//! - the host end `sqhS` (hex), whose existence claims the slot host-wide: the kernel refuses
//!   a second interface of that name, so two workers on one host never share an address;
//! - an nftables table `inet sq_W_S` (`egress_filter`): everything from the sandbox to the
//!   host itself (its own addresses, loopback, every control-plane and worker port) is
//!   dropped except replies to connections the host opened; forwarded traffic to loopback,
//!   link-local (the metadata address among it), every sandbox range, multicast, IPv6 and
//!   the policy's deny list is dropped; nothing may open a connection into the sandbox
//!   except the host; what leaves is masqueraded;
//! - when the host's `filter FORWARD` chain (iptables; Docker sets its policy to drop)
//!   exists, two rules commented `sq_W_S` let the sandbox's own traffic through it.
//!
//! Addresses come from 100.64.0.0/10 (shared address space), never from the private ranges
//! a host's own networks use. Teardown removes all of it and is idempotent; `sweep` removes
//! what a previous life of the worker left, by the `sq-W-` prefix, for namespaces no process
//! is in.
//!
//! Why the `ip`, `nft` and `iptables` programs rather than netlink crates: creating a named
//! namespace means unsharing and bind-mounting from a thread, which needs `unsafe` calls the
//! workspace forbids, and iptables has no library interface; the worker already requires
//! util-linux and bubblewrap as programs.

use std::fs;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ipnet::Ipv4Net;

use crate::egress_filter::EgressFilter;
use crate::error::IsolationError;

pub const IP_PROGRAM_DEFAULT: &str = "/usr/sbin/ip";
pub const NFT_PROGRAM_DEFAULT: &str = "/usr/sbin/nft";
pub const IPTABLES_PROGRAM_DEFAULT: &str = "/usr/sbin/iptables";
/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";
/// The sandboxes' address range: 100.64.0.0/14, one /30 per slot.
pub const SANDBOX_NET: Ipv4Net = match Ipv4Net::new(Ipv4Addr::new(100, 64, 0, 0), 14) {
    Ok(net) => net,
    Err(_) => panic!("100.64.0.0/14 is a valid network"),
};
/// Slots in `SANDBOX_NET` (a /30 each).
pub const NETWORK_SLOTS: u32 = 1 << 16;
/// Slots tried before giving up on finding a free one.
pub const NETWORK_SLOT_ATTEMPTS_MAX: u32 = 256;
/// Most entries of the policy's deny list.
pub const EGRESS_DENY_ENTRIES_MAX: usize = 1024;
/// Most entries of the policy's allow list.
pub const EGRESS_ALLOW_ENTRIES_MAX: usize = 1024;
/// Longest output read from one of the network programs.
const PROGRAM_OUTPUT_BYTES_MAX: usize = 1 << 20;
/// The programs and policy of a worker's sandbox networks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfig {
    /// Short tag naming this worker's namespaces and tables: `[a-z0-9]{1,8}`.
    pub owner: String,
    pub ip: PathBuf,
    pub nft: PathBuf,
    /// `None`, or a missing program, when the host has no iptables `filter FORWARD` chain.
    pub iptables: Option<PathBuf>,
    /// Destinations denied on top of `egress_filter::EGRESS_ALWAYS_DENIED` (control-plane
    /// hosts, the policy's deny list).
    pub deny: Vec<Ipv4Net>,
    /// The policy's allow list for `outbound`: new connections anywhere else are dropped;
    /// `None`: every destination not denied.
    pub allow: Option<Vec<Ipv4Net>>,
}

impl NetworkConfig {
    /// The default programs, no extra deny list, and the tag derived from `worker`.
    pub fn new(worker: &str) -> Self {
        NetworkConfig {
            owner: owner_tag(worker),
            ip: PathBuf::from(IP_PROGRAM_DEFAULT),
            nft: PathBuf::from(NFT_PROGRAM_DEFAULT),
            iptables: Some(PathBuf::from(IPTABLES_PROGRAM_DEFAULT)),
            deny: Vec::new(),
            allow: None,
        }
    }

    /// What is missing for sandbox networks on this host, if anything.
    pub fn probe(&self) -> Result<(), IsolationError> {
        for program in [&self.ip, &self.nft] {
            if !program.is_file() {
                return Err(IsolationError::Unavailable(format!(
                    "{} not found (iproute2, nftables)",
                    program.display()
                )));
            }
        }
        if self.deny.len() > EGRESS_DENY_ENTRIES_MAX {
            return Err(IsolationError::invalid(
                "egress deny list",
                format!(
                    "{} entries, at most {EGRESS_DENY_ENTRIES_MAX}",
                    self.deny.len()
                ),
            ));
        }
        if self.owner.is_empty()
            || self.owner.len() > 8
            || !self
                .owner
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(IsolationError::invalid(
                "network owner",
                format!("{:?} must be 1..=8 of [a-z0-9]", self.owner),
            ));
        }
        Ok(())
    }
}

/// One sandbox's namespace, veth pair and rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxNetwork {
    config: NetworkConfig,
    slot: u32,
    /// `gateway` mode: no NAT, no forwarding; the sandbox reaches only this port of its host
    /// end, where the worker's proxy listens.
    gateway_port: Option<u16>,
    /// The host end is a persistent tap a VM's NIC opens (`create_tap`), not a veth pair
    /// into a namespace.
    tap: bool,
}

impl SandboxNetwork {
    /// Creates the namespace, pair, addresses, routes and rules of a free slot, trying from
    /// the one `seed` hashes to. Whatever was made is removed again on failure.
    pub fn create(config: &NetworkConfig, seed: &str) -> Result<SandboxNetwork, IsolationError> {
        Self::create_with(config, seed, None, false)
    }

    /// Like `create`, for a VM: the host end is a persistent tap `sqhS` that the hypervisor
    /// opens (libvirt's `<interface type='ethernet'>` with `managed='no'`), addressed and
    /// filtered as a veth's host end is; there is no namespace, the guest configures its
    /// own end (`sandbox_address` via `host_address`).
    pub fn create_tap(
        config: &NetworkConfig,
        seed: &str,
    ) -> Result<SandboxNetwork, IsolationError> {
        Self::create_with(config, seed, None, true)
    }

    /// `create_tap` for a `gateway` guest: nothing forwarded or masqueraded, only `port` on
    /// the tap's host address reached (the worker's proxy).
    pub fn create_tap_gateway(
        config: &NetworkConfig,
        seed: &str,
        port: u16,
    ) -> Result<SandboxNetwork, IsolationError> {
        Self::create_with(config, seed, Some(port), true)
    }

    /// Like `create`, for `gateway` mode: nothing is forwarded or masqueraded, and the
    /// sandbox may reach only `port` on its host end (the worker's proxy).
    pub fn create_gateway(
        config: &NetworkConfig,
        seed: &str,
        port: u16,
    ) -> Result<SandboxNetwork, IsolationError> {
        Self::create_with(config, seed, Some(port), false)
    }

    fn create_with(
        config: &NetworkConfig,
        seed: &str,
        gateway_port: Option<u16>,
        tap: bool,
    ) -> Result<SandboxNetwork, IsolationError> {
        config.probe()?;
        if gateway_port.is_none() {
            ensure_forwarding()?;
        }
        let first = fnv1a32(seed.as_bytes()) % NETWORK_SLOTS;
        for n in 0..NETWORK_SLOT_ATTEMPTS_MAX {
            let net = SandboxNetwork {
                config: config.clone(),
                slot: (first + n) % NETWORK_SLOTS,
                gateway_port,
                tap,
            };
            let claimed = if tap { net.claim_tap()? } else { net.claim()? };
            if !claimed {
                continue;
            }
            return match net.configure() {
                Ok(()) => Ok(net),
                Err(e) => {
                    let _ = net.destroy();
                    Err(e)
                }
            };
        }
        Err(IsolationError::Unavailable(format!(
            "no free sandbox network slot after {NETWORK_SLOT_ATTEMPTS_MAX} tries"
        )))
    }

    /// A namespace with loopback only — `isolated` — made before the sandbox starts, so the
    /// worker can listen inside it (egress injection's proxy). No pair, no rules: `destroy`
    /// and the sweep skip what it never had.
    pub fn create_loopback(
        config: &NetworkConfig,
        seed: &str,
    ) -> Result<SandboxNetwork, IsolationError> {
        let first = fnv1a32(seed.as_bytes()) % NETWORK_SLOTS;
        for n in 0..NETWORK_SLOT_ATTEMPTS_MAX {
            let net = SandboxNetwork {
                config: config.clone(),
                slot: (first + n) % NETWORK_SLOTS,
                gateway_port: None,
                tap: false,
            };
            let name = net.netns_name();
            // Taken, or claimed by a concurrent attempt of this worker's.
            if net.netns_path().exists() || run(&config.ip, &["netns", "add", &name], None).is_err()
            {
                continue;
            }
            return match run(&config.ip, &["-n", &name, "link", "set", "lo", "up"], None) {
                Ok(_) => Ok(net),
                Err(e) => {
                    let _ = net.destroy();
                    Err(e)
                }
            };
        }
        Err(IsolationError::Unavailable(format!(
            "no free sandbox network slot after {NETWORK_SLOT_ATTEMPTS_MAX} tries"
        )))
    }

    /// The network a namespace name (from `netns_name`) stands for, for teardown after a
    /// restart; `None` if the name is not one of this worker's.
    pub fn from_name(config: &NetworkConfig, name: &str) -> Option<SandboxNetwork> {
        let prefix = format!("sq-{}-", config.owner);
        let hex = name.strip_prefix(&prefix)?;
        if hex.len() != 4 {
            return None;
        }
        let slot = u32::from_str_radix(hex, 16).ok()?;
        Some(SandboxNetwork {
            config: config.clone(),
            slot,
            gateway_port: None,
            tap: false,
        })
    }

    pub fn netns_name(&self) -> String {
        format!("sq-{}-{:04x}", self.config.owner, self.slot)
    }

    /// The namespace's file, for `nsenter --net=`.
    pub fn netns_path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(self.netns_name())
    }

    pub fn host_interface(&self) -> String {
        format!("sqh{:04x}", self.slot)
    }

    /// The nftables table (family `inet`) holding this sandbox's rules.
    pub fn table(&self) -> String {
        format!("sq_{}_{:04x}", self.config.owner, self.slot)
    }

    /// The host's end of the pair (the sandbox's gateway).
    pub fn host_address(&self) -> Ipv4Addr {
        self.subnet_address(1)
    }

    /// The sandbox's address.
    pub fn sandbox_address(&self) -> Ipv4Addr {
        self.subnet_address(2)
    }

    /// Removes the rules, the pair and the namespace; what is already gone is skipped.
    pub fn destroy(&self) -> Result<(), IsolationError> {
        let mut problems = Vec::new();
        for rule in self.forward_rules() {
            if let Some(iptables) = self.iptables() {
                let mut args = vec!["-w".to_owned(), "-D".to_owned(), "FORWARD".to_owned()];
                args.extend(rule);
                // Fails only when the rule is gone already.
                let _ = run(&iptables, &args, None);
            }
        }
        if let Err(e) = EgressFilter::remove(&self.config.nft, &self.table()) {
            problems.push(e.to_string());
        }
        if self.host_end_is_mine() {
            let _ = run(
                &self.config.ip,
                &["link", "del", &self.host_interface()],
                None,
            );
        }
        if self.netns_path().exists() {
            if let Err(e) = run(&self.config.ip, &["netns", "del", &self.netns_name()], None) {
                problems.push(e.to_string());
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(IsolationError::Launch(format!(
                "tearing down {}: {}",
                self.netns_name(),
                problems.join("; ")
            )))
        }
    }

    /// Tears down every network of this worker whose namespace no process is in (what a
    /// previous life left), found by prefix among the namespaces, the links' aliases (a tap
    /// has no namespace), the nftables tables and the `FORWARD` rules' comments, so a
    /// teardown interrupted half-way is finished too; returns the namespace names removed.
    pub fn sweep(config: &NetworkConfig) -> Result<Vec<String>, IsolationError> {
        Self::sweep_keeping(config, &[])
    }

    /// `sweep`, leaving alone the networks named in `keep` (by `netns_name`): what the
    /// caller's records say a sandbox it will adopt still uses — a VM's tap is held open only
    /// while its guest runs, not while a defined domain waits for its start.
    pub fn sweep_keeping(
        config: &NetworkConfig,
        keep: &[String],
    ) -> Result<Vec<String>, IsolationError> {
        let mut slots = std::collections::BTreeSet::new();
        let netns_prefix = format!("sq-{}-", config.owner);
        if let Ok(entries) = fs::read_dir(NETNS_DIR) {
            for entry in entries.flatten() {
                if let Some(net) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| SandboxNetwork::from_name(config, n))
                {
                    slots.insert(net.slot);
                }
            }
        }
        // A tap has no namespace: its alias names it (`tag_host_end`).
        let links = run(&config.ip, &["-o", "link", "show"], None)?;
        for word in links.split_whitespace() {
            if let Some(net) = SandboxNetwork::from_name(config, word) {
                slots.insert(net.slot);
            }
        }
        let table_prefix = format!("sq_{}_", config.owner);
        let mut listings = vec![run(&config.nft, &["list", "tables"], None)?];
        if let Some(iptables) = config.iptables.as_ref().filter(|p| p.is_file()) {
            listings.push(run(iptables, &["-w", "-S", "FORWARD"], None).unwrap_or_default());
        }
        for word in listings.iter().flat_map(|l| l.split_whitespace()) {
            let slot = word
                .strip_prefix(&table_prefix)
                .filter(|hex| hex.len() == 4)
                .and_then(|hex| u32::from_str_radix(hex, 16).ok());
            slots.extend(slot);
        }
        let mut removed = Vec::new();
        for slot in slots {
            let net = SandboxNetwork {
                config: config.clone(),
                slot,
                gateway_port: None,
                tap: false,
            };
            let name = net.netns_name();
            if keep.contains(&name) {
                continue;
            }
            if net.netns_path().exists() {
                let pids = run(&config.ip, &["netns", "pids", &name], None)?;
                if !pids.trim().is_empty() {
                    continue;
                }
            } else if net.host_end_attached() {
                // A tap a running VM holds open (a restarted worker adopts the VM).
                continue;
            }
            net.destroy()?;
            removed.push(name);
        }
        debug_assert!(removed.iter().all(|n| n.starts_with(&netns_prefix)));
        Ok(removed)
    }

    fn subnet_address(&self, host: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(SANDBOX_NET.network()) + self.slot * 4 + host)
    }

    /// Whether the host end is a tap something holds open: its carrier is on only then
    /// (reading it fails while the link is down, and a missing link has no file).
    fn host_end_attached(&self) -> bool {
        let link = Path::new("/sys/class/net").join(self.host_interface());
        // Only a tap: a veth whose namespace was deleted keeps its carrier until the kernel's
        // deferred clean-up of the namespace takes the pair, and is a leftover all the same.
        let tap = link.join("tun_flags").exists();
        tap && fs::read_to_string(link.join("carrier")).is_ok_and(|c| c.trim() == "1")
    }

    /// Makes the persistent tap; `false` when the slot is taken (the kernel refuses a
    /// second interface of the name, `ip tuntap` asking for it exclusively).
    fn claim_tap(&self) -> Result<bool, IsolationError> {
        let dev = self.host_interface();
        match run(
            &self.config.ip,
            &["tuntap", "add", "dev", &dev, "mode", "tap"],
            None,
        ) {
            Ok(_) => {}
            Err(e) if e.to_string().contains("busy") || e.to_string().contains("exists") => {
                return Ok(false)
            }
            Err(e) => return Err(e),
        }
        // Tagged at once: the sweep finds a tap by it, and never removes another's.
        if let Err(e) = self.tag_host_end() {
            let _ = run(&self.config.ip, &["link", "del", &dev], None);
            return Err(e);
        }
        Ok(true)
    }

    /// Names the owner on the host end (its alias, the namespace name).
    fn tag_host_end(&self) -> Result<(), IsolationError> {
        let dev = self.host_interface();
        let name = self.netns_name();
        run(
            &self.config.ip,
            &["link", "set", "dev", &dev, "alias", &name],
            None,
        )
        .map(|_| ())
    }

    /// Whether the host end is this network's to remove: tagged with its name. An untagged
    /// one is another's being made (a veth of ours made before tags goes with our
    /// namespace, whose deletion ends the pair).
    fn host_end_is_mine(&self) -> bool {
        let out = run(
            &self.config.ip,
            &["-o", "link", "show", "dev", &self.host_interface()],
            None,
        );
        // The same view of the links as `ip` had when it made them (not /sys's, which may be
        // another namespace's).
        out.is_ok_and(|line| {
            line.split_whitespace()
                .skip_while(|w| *w != "alias")
                .nth(1)
                .is_some_and(|alias| alias == self.netns_name())
        })
    }

    /// Makes the namespace and the host end; `false` when the slot is taken.
    fn claim(&self) -> Result<bool, IsolationError> {
        if self.netns_path().exists() {
            return Ok(false);
        }
        if run(&self.config.ip, &["netns", "add", &self.netns_name()], None).is_err() {
            // Taken by a concurrent claim of this worker's.
            return Ok(false);
        }
        let link = run(
            &self.config.ip,
            &[
                "link",
                "add",
                &self.host_interface(),
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &self.netns_name(),
            ],
            None,
        );
        match link.and_then(|_| self.tag_host_end()) {
            Ok(()) => Ok(true),
            Err(e) if e.to_string().contains("File exists") => {
                // Another worker on this host holds the slot.
                let _ = run(&self.config.ip, &["netns", "del", &self.netns_name()], None);
                Ok(false)
            }
            Err(e) => {
                let _ = run(&self.config.ip, &["netns", "del", &self.netns_name()], None);
                Err(e)
            }
        }
    }

    fn configure(&self) -> Result<(), IsolationError> {
        let (host, sandbox) = (self.host_address(), self.sandbox_address());
        if !self.tap {
            let inside = format!(
                "link set lo up\naddr add {sandbox}/30 dev eth0\nlink set eth0 up\n\
                 route add default via {host}\n"
            );
            run(
                &self.config.ip,
                &["-n", &self.netns_name(), "-batch", "-"],
                Some(inside.as_bytes()),
            )?;
        }
        let outside = format!(
            "addr add {host}/30 dev {dev}\nlink set {dev} up\n",
            dev = self.host_interface()
        );
        run(&self.config.ip, &["-batch", "-"], Some(outside.as_bytes()))?;
        self.filter().install(&self.config.nft)?;
        if let Some(iptables) = self.iptables() {
            for rule in self.forward_rules() {
                let mut args = vec!["-w".to_owned(), "-I".to_owned(), "FORWARD".to_owned()];
                args.extend(rule);
                run(&iptables, &args, None)?;
            }
        }
        Ok(())
    }

    /// The egress filter of this sandbox's host interface, with its NAT; in `gateway` mode
    /// without NAT, forwarding nothing, admitting the proxy's port only.
    pub fn filter(&self) -> EgressFilter {
        let gateway = self
            .gateway_port
            .map(|port| SocketAddrV4::new(self.host_address(), port));
        EgressFilter {
            table: self.table(),
            interface: self.host_interface(),
            deny: self.config.deny.clone(),
            masquerade: gateway.is_none().then(|| self.sandbox_address()),
            gateway,
            allow: self.config.allow.clone(),
            source: Some(Ipv4Net::from(self.sandbox_address())),
        }
    }

    /// The two `filter FORWARD` rules (without the command) letting the sandbox's traffic
    /// past a drop policy there; the filtering itself is the nftables table's.
    fn forward_rules(&self) -> [Vec<String>; 2] {
        let dev = self.host_interface();
        let comment = ["-m", "comment", "--comment", &self.table()].map(str::to_owned);
        let mut out = vec!["-i".to_owned(), dev.clone()];
        out.extend(comment.clone());
        out.extend(["-j".to_owned(), "ACCEPT".to_owned()]);
        let mut back = vec!["-o".to_owned(), dev];
        back.extend(["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"].map(str::to_owned));
        back.extend(comment);
        back.extend(["-j".to_owned(), "ACCEPT".to_owned()]);
        [out, back]
    }

    fn iptables(&self) -> Option<PathBuf> {
        self.config.iptables.clone().filter(|p| p.is_file())
    }
}

/// The worker's tag: 8 hex digits of its id's FNV-1a hash.
pub fn owner_tag(worker: &str) -> String {
    format!("{:08x}", fnv1a32(worker.as_bytes()))
}

/// NAT needs the host to forward IPv4; a host that does not is switched on, as Docker does.
fn ensure_forwarding() -> Result<(), IsolationError> {
    let path = Path::new("/proc/sys/net/ipv4/ip_forward");
    let on = fs::read_to_string(path)
        .map_err(|e| IsolationError::io("read", path, e))?
        .trim()
        == "1";
    if !on {
        tracing::info!("enabling IPv4 forwarding for sandbox networks");
        fs::write(path, "1\n").map_err(|e| IsolationError::io("enable forwarding in", path, e))?;
    }
    Ok(())
}

/// Runs a network program; its stdout, or an error carrying its stderr.
pub(crate) fn run<S: AsRef<str>>(
    program: &Path,
    args: &[S],
    stdin: Option<&[u8]>,
) -> Result<String, IsolationError> {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args.iter().map(AsRef::as_ref))
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| IsolationError::io("run", program, e))?;
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(bytes)
            .map_err(|e| IsolationError::io("write to", program, e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| IsolationError::io("wait for", program, e))?;
    let text = |bytes: &[u8]| {
        String::from_utf8_lossy(&bytes[..bytes.len().min(PROGRAM_OUTPUT_BYTES_MAX)]).into_owned()
    };
    if out.status.success() {
        Ok(text(&out.stdout))
    } else {
        let words: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        Err(IsolationError::Launch(format!(
            "{} {} failed ({}): {}",
            program.display(),
            words.join(" "),
            out.status,
            text(&out.stderr).trim()
        )))
    }
}

fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, b| {
        (hash ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(slot: u32) -> SandboxNetwork {
        SandboxNetwork {
            config: NetworkConfig::new("worker-1"),
            slot,
            gateway_port: None,
            tap: false,
        }
    }

    #[test]
    fn slots_address_100_64_slash_14_and_never_the_private_ranges() {
        let private: [Ipv4Net; 3] = [
            "10.0.0.0/8".parse().unwrap(),
            "172.16.0.0/12".parse().unwrap(),
            "192.168.0.0/16".parse().unwrap(),
        ];
        let cgnat: Ipv4Net = "100.64.0.0/10".parse().unwrap();
        for slot in [0, 1, 0x1234, NETWORK_SLOTS - 1] {
            let n = net(slot);
            for addr in [n.host_address(), n.sandbox_address()] {
                assert!(
                    SANDBOX_NET.contains(&addr) && cgnat.contains(&addr),
                    "{addr}"
                );
                assert!(!private.iter().any(|p| p.contains(&addr)), "{addr}");
            }
        }
        assert_eq!(net(0).host_address(), Ipv4Addr::new(100, 64, 0, 1));
        assert_eq!(net(1).sandbox_address(), Ipv4Addr::new(100, 64, 0, 6));
        assert_eq!(
            net(NETWORK_SLOTS - 1).sandbox_address(),
            Ipv4Addr::new(100, 67, 255, 254)
        );
    }

    #[test]
    fn names_fit_interfaces_and_read_back() {
        let n = net(0xbeef);
        assert!(n.host_interface().len() <= 15);
        assert_eq!(n.host_interface(), "sqhbeef");
        let config = NetworkConfig::new("worker-1");
        assert_eq!(
            SandboxNetwork::from_name(&config, &n.netns_name()),
            Some(n.clone())
        );
        assert_eq!(SandboxNetwork::from_name(&config, "sq-00000000-beef"), None);
        assert_eq!(
            SandboxNetwork::from_name(&NetworkConfig::new("other"), &n.netns_name()),
            None
        );
    }

    #[test]
    fn the_filter_is_the_sandbox_s_interface_with_its_nat() {
        let mut config = NetworkConfig::new("w");
        config.deny = vec!["203.0.113.0/24".parse().unwrap()];
        let n = SandboxNetwork {
            config,
            slot: 2,
            gateway_port: None,
            tap: false,
        };
        let filter = n.filter();
        assert_eq!(filter.gateway, None);
        let gateway = SandboxNetwork {
            gateway_port: Some(3128),
            ..n.clone()
        }
        .filter();
        assert_eq!(gateway.masquerade, None, "a gateway sandbox is not NATed");
        assert_eq!(
            gateway.gateway,
            Some(SocketAddrV4::new(Ipv4Addr::new(100, 64, 0, 9), 3128))
        );
        assert_eq!(filter.interface, "sqh0002");
        assert_eq!(filter.table, n.table());
        assert_eq!(filter.masquerade, Some(Ipv4Addr::new(100, 64, 0, 10)));
        assert_eq!(
            filter.deny,
            vec!["203.0.113.0/24".parse::<Ipv4Net>().unwrap()]
        );
    }
}
