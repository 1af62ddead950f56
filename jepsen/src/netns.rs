//! Network namespaces for the nodes: each node in its own namespace with a veth pair to a
//! bridge in the root namespace. The harness reaches the nodes through the bridge's address;
//! node-to-node traffic crosses the bridge too, so `iptables` DROP rules inside a node's
//! namespace are real partitions.
//!
//! Everything created is named after the harness's pid (`sqj{pid}…`) and removed on drop, and
//! by `squadron-jepsen cleanup` after a crash.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use crate::packet_delay::{Delayer, DELAY_QUEUE};

/// Prefix of every namespace, link and iptables comment this suite creates.
pub const NAME_PREFIX: &str = "sqj";
/// The port every node listens on for REST inside its namespace.
pub const NODE_REST_PORT: u16 = 8120;
/// The takeover workload's worker listens here on the bridge address.
pub const WORKER_PORT: u16 = 8130;
/// The port every node listens on for gRPC inside its namespace.
pub const NODE_GRPC_PORT: u16 = 8320;
/// The port every node listens on for its peers (Raft, the node-to-node protocol).
pub const NODE_PEER_PORT: u16 = 8420;
/// Most nodes one network holds (host octets 1..=this; the bridge is .254).
pub const NODES_MAX: u64 = 9;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("`{command}` failed: {message}")]
    Command { command: String, message: String },
    #[error("no free 10.x.y.0/24 subnet found for the bridge")]
    NoSubnet,
    #[error("at most {NODES_MAX} nodes fit one network, asked for {0}")]
    TooManyNodes(u64),
}

/// Runs a command; an error names the command and its stderr.
pub fn run(args: &[&str]) -> Result<String, NetError> {
    let command = args.join(" ");
    let (program, rest) = args.split_first().ok_or_else(|| NetError::Command {
        command: command.clone(),
        message: "empty command".into(),
    })?;
    let out = Command::new(program)
        .args(rest)
        .output()
        .map_err(|e| NetError::Command {
            command: command.clone(),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(NetError::Command {
            command,
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The namespaces, veths and bridge of one run.
#[derive(Debug)]
pub struct NamespaceNet {
    tag: String,
    subnet: String,
    nodes: BTreeMap<u64, String>,
    forward_rule: bool,
    bridge_up: bool,
    /// The delay threads of a `delay` fault, one per node, until the heal.
    delayers: Mutex<Vec<Delayer>>,
}

impl NamespaceNet {
    /// Builds the network for nodes `1..=n`. On any failure, what was built is torn down.
    pub fn create(n: u64) -> Result<Self, NetError> {
        if n > NODES_MAX {
            return Err(NetError::TooManyNodes(n));
        }
        let pid = std::process::id();
        let tag = format!("{NAME_PREFIX}{pid}");
        let subnet = Self::free_subnet(pid)?;
        let mut net = Self {
            tag,
            subnet,
            nodes: BTreeMap::new(),
            forward_rule: false,
            bridge_up: false,
            delayers: Mutex::new(Vec::new()),
        };
        net.build(n)?;
        Ok(net)
    }

    fn free_subnet(pid: u32) -> Result<String, NetError> {
        let used = run(&["ip", "-4", "-o", "addr", "show"])?;
        for attempt in 0..200u32 {
            let x = pid.wrapping_add(attempt.wrapping_mul(7919));
            let subnet = format!("10.{}.{}", 100 + (x >> 8) % 100, x & 0xff);
            if !used.contains(&format!(" {subnet}.")) {
                return Ok(subnet);
            }
        }
        Err(NetError::NoSubnet)
    }

    fn bridge(&self) -> String {
        format!("{}b", self.tag)
    }

    pub fn namespace(&self, id: u64) -> String {
        format!("{}n{id}", self.tag)
    }

    /// The bridge's own address in the root namespace: where the harness sends from, and
    /// where a process of the harness's (the takeover workload's worker) is reached by the
    /// nodes. No fault blocks it.
    pub fn gateway(&self) -> String {
        format!("{}.254", self.subnet)
    }

    /// The address node `id` listens on.
    pub fn address(&self, id: u64) -> String {
        format!("{}.{id}", self.subnet)
    }

    fn build(&mut self, n: u64) -> Result<(), NetError> {
        let bridge = self.bridge();
        let gateway = format!("{}/24", self.gateway());
        run(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        self.bridge_up = true;
        run(&["ip", "addr", "add", &gateway, "dev", &bridge])?;
        run(&["ip", "link", "set", &bridge, "up"])?;
        // Bridged frames pass the root FORWARD chain when br_netfilter is loaded (Docker sets
        // its policy to DROP); this one rule, scoped to our bridge, lets them through.
        run(&[
            "iptables",
            "-I",
            "FORWARD",
            "1",
            "-i",
            &bridge,
            "-o",
            &bridge,
            "-m",
            "comment",
            "--comment",
            &self.tag,
            "-j",
            "ACCEPT",
        ])?;
        self.forward_rule = true;
        for id in 1..=n {
            let ns = self.namespace(id);
            let host = format!("{}h{id}", self.tag);
            let inner = format!("{}v{id}", self.tag);
            let addr = format!("{}/24", self.address(id));
            run(&["ip", "netns", "add", &ns])?;
            self.nodes.insert(id, ns.clone());
            run(&[
                "ip", "link", "add", &host, "type", "veth", "peer", "name", &inner,
            ])?;
            run(&["ip", "link", "set", &inner, "netns", &ns])?;
            run(&["ip", "link", "set", &host, "master", &bridge])?;
            run(&["ip", "link", "set", &host, "up"])?;
            run(&["ip", "-n", &ns, "addr", "add", &addr, "dev", &inner])?;
            run(&["ip", "-n", &ns, "link", "set", &inner, "up"])?;
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// The command prefix that runs a program inside node `id`'s namespace.
    pub fn exec_prefix(&self, id: u64) -> Vec<String> {
        vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            self.namespace(id),
        ]
    }

    /// Cuts the links in `grudge`: node → the nodes it must not hear from. Each side drops the
    /// other's packets on input, so a symmetric grudge is a symmetric partition.
    pub fn partition(&self, grudge: &BTreeMap<u64, BTreeSet<u64>>) -> Result<(), NetError> {
        for (node, blocked) in grudge {
            let ns = self.namespace(*node);
            for peer in blocked {
                let src = self.address(*peer);
                run(&[
                    "ip", "netns", "exec", &ns, "iptables", "-A", "INPUT", "-s", &src, "-j", "DROP",
                ])?;
            }
        }
        Ok(())
    }

    /// Every node drops `probability` of what each other node sends it (iptables'
    /// `statistic` match: this kernel has no `netem`); `heal` removes it.
    pub fn lose(&self, probability: f64) -> Result<(), NetError> {
        let p = format!("{probability:.3}");
        for (node, ns) in &self.nodes {
            let drop = ["-m", "statistic", "--mode", "random", "--probability", &p];
            self.rule_per_peer(*node, ns, &[&drop[..], &["-j", "DROP"]].concat())?;
        }
        Ok(())
    }

    /// Every node gets what each other node sends it `delay` late (NFQUEUE and a thread of
    /// ours per namespace, `packet_delay`: this kernel has no `netem`); `heal` removes it.
    /// Returns at once; what the harness sends the nodes is not delayed.
    pub fn delay(&self, delay: Duration) -> Result<(), NetError> {
        let queue = DELAY_QUEUE.to_string();
        let mut delayers = self.delayers.lock().unwrap_or_else(|p| p.into_inner());
        for (node, ns) in &self.nodes {
            delayers.push(Delayer::start(ns, delay)?);
            let to_queue = ["-j", "NFQUEUE", "--queue-num", &queue, "--queue-bypass"];
            self.rule_per_peer(*node, ns, &to_queue)?;
        }
        Ok(())
    }

    /// Appends to `node`'s INPUT chain, in its namespace `ns`, one rule per other node: its
    /// packets (`-s` its address), then `rule`.
    fn rule_per_peer(&self, node: u64, ns: &str, rule: &[&str]) -> Result<(), NetError> {
        for peer in self.nodes.keys().filter(|p| **p != node) {
            let src = self.address(*peer);
            let head = [
                "ip", "netns", "exec", ns, "iptables", "-A", "INPUT", "-s", &src,
            ];
            run(&[&head[..], rule].concat())?;
        }
        Ok(())
    }

    /// Removes every DROP and delay rule, then stops the delay threads, which let through what
    /// they hold. Every step is tried; the first failure is returned.
    pub fn heal(&self) -> Result<(), NetError> {
        let mut first_error = None;
        for ns in self.nodes.values() {
            if let Err(e) = run(&["ip", "netns", "exec", ns, "iptables", "-F", "INPUT"]) {
                first_error.get_or_insert(e);
            }
        }
        let delayers =
            std::mem::take(&mut *self.delayers.lock().unwrap_or_else(|p| p.into_inner()));
        for delayer in delayers {
            if let Err(message) = delayer.stop() {
                first_error.get_or_insert(NetError::Command {
                    command: "packet delay".into(),
                    message,
                });
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Tears everything down; errors are collected, and every step is tried.
    pub fn teardown(&mut self) -> Vec<NetError> {
        let mut errors = Vec::new();
        self.delayers
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        for ns in std::mem::take(&mut self.nodes).values() {
            // Deleting the namespace deletes the veth inside it, and with it its peer.
            if let Err(e) = run(&["ip", "netns", "del", ns]) {
                errors.push(e);
            }
        }
        if self.forward_rule {
            let bridge = self.bridge();
            if let Err(e) = run(&[
                "iptables",
                "-D",
                "FORWARD",
                "-i",
                &bridge,
                "-o",
                &bridge,
                "-m",
                "comment",
                "--comment",
                &self.tag,
                "-j",
                "ACCEPT",
            ]) {
                errors.push(e);
            }
            self.forward_rule = false;
        }
        if self.bridge_up {
            if let Err(e) = run(&["ip", "link", "del", &self.bridge()]) {
                errors.push(e);
            }
            self.bridge_up = false;
        }
        errors
    }

    /// Removes what earlier runs left behind: namespaces, links and FORWARD rules named
    /// `sqj{pid}` whose pid no longer runs (all of them with `all`). Returns what was removed.
    pub fn cleanup_stale(all: bool) -> Result<Vec<String>, NetError> {
        let stale = |name: &str| -> Option<String> {
            let rest = name.strip_prefix(NAME_PREFIX)?;
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let pid: u32 = digits.parse().ok()?;
            let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
            (all || !alive).then(|| format!("{NAME_PREFIX}{digits}"))
        };
        let mut removed = Vec::new();
        for line in run(&["ip", "netns", "list"])?.lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if stale(name).is_some() {
                // Nodes of a harness that was killed outlive it inside the namespace.
                for pid in run(&["ip", "netns", "pids", name])?.split_whitespace() {
                    if run(&["kill", "-9", pid]).is_ok() {
                        removed.push(format!("process {pid} in {name}"));
                    }
                }
                run(&["ip", "netns", "del", name])?;
                removed.push(format!("netns {name}"));
            }
        }
        for line in run(&["ip", "-o", "link", "show"])?.lines() {
            let name = line
                .split(':')
                .nth(1)
                .map(|s| s.trim().split('@').next().unwrap_or("").to_string())
                .unwrap_or_default();
            if stale(&name).is_some() && run(&["ip", "link", "del", &name]).is_ok() {
                removed.push(format!("link {name}"));
            }
        }
        for line in run(&["iptables", "-S", "FORWARD"])?.lines() {
            let Some(comment) = line
                .split("--comment ")
                .nth(1)
                .and_then(|c| c.split_whitespace().next())
            else {
                continue;
            };
            let comment = comment.trim_matches('"');
            if stale(comment).is_some() && line.starts_with("-A FORWARD ") {
                let spec: Vec<&str> = line
                    .trim_start_matches("-A FORWARD ")
                    .split_whitespace()
                    .map(|s| s.trim_matches('"'))
                    .collect();
                let mut args = vec!["iptables", "-D", "FORWARD"];
                args.extend(spec);
                run(&args)?;
                removed.push(format!("iptables FORWARD rule {comment}"));
            }
        }
        Ok(removed)
    }
}

impl Drop for NamespaceNet {
    fn drop(&mut self) {
        for e in self.teardown() {
            eprintln!("squadron-jepsen: cleanup: {e}");
        }
    }
}
