//! The process runtime's networks against real namespaces: from inside an `outbound` and an
//! `isolated` sandbox the host's listeners (on loopback, on every host address, on the
//! sandbox's gateway) and a metadata-style address are unreachable; from `outbound` only, a
//! listener in a test-made "internet" namespace (100.100/16, inside 100.64/10 but outside the
//! sandboxes' slots) is reachable. `full` is refused unless the worker allows it.

use std::collections::BTreeMap;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use squadron_core::manifest::NetworkMode;

use super::tests::{outbox_file, run_to_exit, unique_worker, Fixture};
use super::*;

/// The port the "internet" listener uses inside its namespace.
const INTERNET_PORT: u16 = 8080;
/// The metadata-style address, served inside the test namespace.
const METADATA_ADDRESS: &str = "169.254.169.254";
const CONNECT_TIMEOUT_S: u32 = 3;

/// Tries every `host:port` argument at once (GATEWAY is the default route's address) and
/// prints `target open|closed`, one per line.
const PROBE_PY: &str = r#"
import socket, struct, sys, threading
def gateway():
    for line in open('/proc/net/route').read().splitlines()[1:]:
        f = line.split()
        if f[1] == '00000000':
            return socket.inet_ntoa(struct.pack('<L', int(f[2], 16)))
    return '0.0.0.0'
results = {}
def probe(target):
    host, port = target.rsplit(':', 1)
    if host == 'GATEWAY':
        host = gateway()
    try:
        socket.create_connection((host, int(port)), timeout=TIMEOUT).close()
        results[target] = 'open'
    except Exception:
        results[target] = 'closed'
threads = [threading.Thread(target=probe, args=(t,)) for t in sys.argv[1:]]
for t in threads: t.start()
for t in threads: t.join()
for t in sys.argv[1:]: print(t, results[t])
"#;

/// A network namespace standing in for the internet: a veth pair to the host, addressed
/// 100.100.K.0/30, with a listener on every address of it and the metadata address on its
/// loopback (routed there from the host). Removed on drop.
struct TestInternet {
    netns: String,
    host_if: String,
    address: Ipv4Addr,
    listener: Child,
}

impl TestInternet {
    fn new() -> TestInternet {
        let pid = std::process::id();
        let k = (pid % 250) as u8;
        let netns = format!("sqt-{pid}");
        let host_if = format!("sqt{:04x}", pid % 0x10000);
        let (host, address) = (Ipv4Addr::new(100, 100, k, 1), Ipv4Addr::new(100, 100, k, 2));
        // A run killed before its drop left these.
        let _ = ip_quiet(&["netns", "del", &netns]);
        let _ = ip_quiet(&["link", "del", &host_if]);
        for args in [
            vec!["netns", "add", &netns],
            vec![
                "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &netns,
            ],
        ] {
            assert!(ip(&args), "ip {args:?}");
        }
        let host_cidr = format!("{host}/30");
        let addr_cidr = format!("{address}/30");
        let metadata = format!("{METADATA_ADDRESS}/32");
        let host_s = host.to_string();
        let address_s = address.to_string();
        for args in [
            vec!["addr", "add", &host_cidr, "dev", &host_if],
            vec!["link", "set", &host_if, "up"],
            vec!["-n", &netns, "link", "set", "lo", "up"],
            vec!["-n", &netns, "addr", "add", &addr_cidr, "dev", "eth0"],
            vec!["-n", &netns, "addr", "add", &metadata, "dev", "lo"],
            vec!["-n", &netns, "link", "set", "eth0", "up"],
            vec!["-n", &netns, "route", "add", "default", "via", &host_s],
            vec!["route", "replace", &metadata, "via", &address_s],
        ] {
            assert!(ip(&args), "ip {args:?}");
        }
        let server = format!(
            "import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, \
             socket.SO_REUSEADDR, 1)\ns.bind(('0.0.0.0', {INTERNET_PORT}))\ns.listen(64)\n\
             while True:\n    c, _ = s.accept()\n    c.close()\n"
        );
        let listener = Command::new("ip")
            .args(["netns", "exec", &netns, "python3", "-c", &server])
            .stdin(Stdio::null())
            .spawn()
            .expect("listener in the test namespace");
        let net = TestInternet {
            netns,
            host_if,
            address,
            listener,
        };
        // The host reaches both (its own traffic is not filtered): wait for the listener.
        let deadline = Instant::now() + Duration::from_secs(20);
        for target in [net.address.to_string(), METADATA_ADDRESS.to_owned()] {
            let addr: SocketAddr = format!("{target}:{INTERNET_PORT}").parse().unwrap();
            while TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "test listener {addr} never came up"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        net
    }
}

impl Drop for TestInternet {
    fn drop(&mut self) {
        let _ = self.listener.kill();
        let _ = self.listener.wait();
        let _ = ip(&["route", "del", &format!("{METADATA_ADDRESS}/32")]);
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.netns]);
    }
}

fn ip_quiet(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// The host's own IPv4 addresses other than loopback and the sandboxes' and test's veths.
fn host_addresses() -> Vec<Ipv4Addr> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .expect("ip addr");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let dev = words.nth(1)?;
            let cidr = words.skip_while(|w| *w != "inet").nth(1)?;
            let addr: Ipv4Addr = cidr.split('/').next()?.parse().ok()?;
            (!addr.is_loopback() && !dev.starts_with("sqh") && !dev.starts_with("sqt"))
                .then_some(addr)
        })
        .collect()
}

/// Runs the probe in a sandbox of `mode`; `target → open|closed`.
async fn probe(
    fx: &Fixture,
    task: u64,
    mode: NetworkMode,
    targets: &[String],
) -> BTreeMap<String, String> {
    let script = format!(
        "python3 /mnt/run/probe.py {} > /mnt/outbox/probe\n",
        targets.join(" ")
    );
    let mut spec = fx.spec(task, &script);
    spec.network = mode;
    fs::write(
        spec.dir.run().join("probe.py"),
        PROBE_PY.replace("TIMEOUT", &CONNECT_TIMEOUT_S.to_string()),
    )
    .expect("probe.py");
    let (handle, code) = run_to_exit(fx, &spec).await;
    assert_eq!(
        code,
        0,
        "stderr: {}",
        fs::read_to_string(spec.dir.stderr_log()).unwrap_or_default()
    );
    fx.runtime.destroy(&handle).await.expect("destroy");
    outbox_file(&spec, "probe")
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(t, r)| (t.to_owned(), r.to_owned()))
        .collect()
}

#[tokio::test]
async fn sandboxes_reach_only_the_internet_never_the_host_or_metadata() {
    let internet = TestInternet::new();
    let loopback_only = TcpListener::bind("127.0.0.1:0").expect("loopback listener");
    let everywhere = TcpListener::bind("0.0.0.0:0").expect("host listener");
    let (lo_port, any_port) = (
        loopback_only.local_addr().unwrap().port(),
        everywhere.local_addr().unwrap().port(),
    );
    let mut host_targets = vec![
        format!("127.0.0.1:{lo_port}"),
        format!("127.0.0.1:{any_port}"),
        format!("GATEWAY:{any_port}"),
        format!("{METADATA_ADDRESS}:{INTERNET_PORT}"),
    ];
    let addresses = host_addresses();
    assert!(!addresses.is_empty(), "no non-loopback host address");
    for addr in &addresses {
        let target = format!("{addr}:{any_port}");
        // Reachable from the host itself: "closed" inside means blocked.
        assert!(
            TcpStream::connect_timeout(&target.parse().unwrap(), Duration::from_secs(2)).is_ok(),
            "{target} not reachable from the host"
        );
        host_targets.push(target);
    }
    let allowed = format!("{}:{INTERNET_PORT}", internet.address);
    let mut targets = host_targets.clone();
    targets.push(allowed.clone());

    let fx = Fixture::new();
    let outbound = probe(&fx, 40, NetworkMode::Outbound, &targets).await;
    let isolated = probe(&fx, 41, NetworkMode::Isolated, &targets).await;
    for target in &host_targets {
        assert_eq!(
            outbound[target], "closed",
            "outbound reached {target}: {outbound:?}"
        );
        assert_eq!(
            isolated[target], "closed",
            "isolated reached {target}: {isolated:?}"
        );
    }
    assert_eq!(outbound[&allowed], "open", "{outbound:?}");
    assert_eq!(isolated[&allowed], "closed", "{isolated:?}");
    // The sandbox's namespace, pair and table are gone after destroy.
    let tag = squadron_isolation::sandbox_network::owner_tag(&fx.runtime.config.worker);
    let netns = fs::read_dir(squadron_isolation::sandbox_network::NETNS_DIR)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().contains(&tag))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(netns, 0, "namespaces of {tag} left");
}

#[tokio::test]
async fn full_is_refused_unless_the_worker_allows_it() {
    let fx = Fixture::new();
    let mut spec = fx.spec(42, "exit 0\n");
    spec.network = NetworkMode::Full;
    let err = fx.runtime.provision(&spec).await.expect_err("full refused");
    assert!(err.to_string().contains("network_mode"), "{err}");

    let mut config = ProcessRuntimeConfig::new(unique_worker("pr-full"));
    config.allow_full_network = true;
    let fx = Fixture::with_config(config);
    let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = listener.local_addr().unwrap().port();
    let script = format!(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), \
         timeout=3)\" && echo open > /mnt/outbox/full\n"
    );
    let mut spec = fx.spec(43, &script);
    spec.network = NetworkMode::Full;
    let (_handle, code) = run_to_exit(&fx, &spec).await;
    assert_eq!(
        code,
        0,
        "{}",
        fs::read_to_string(spec.dir.stderr_log()).unwrap_or_default()
    );
    assert_eq!(outbox_file(&spec, "full").trim(), "open");
}

/// What a killed worker left (a namespace with its pair and rules, nothing in it) is gone
/// once the worker's process runtime starts again.
#[test]
fn a_restarted_runtime_sweeps_the_networks_its_previous_life_left() {
    let worker = unique_worker("pr-sweep");
    let config = ProcessRuntimeConfig::new(&worker);
    let left = SandboxNetwork::create(&config.network, "crashed").expect("create");
    assert!(left.netns_path().exists());
    let runtime = ProcessRuntime::new(config).expect("runtime");
    assert!(!left.netns_path().exists());
    let tables = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .expect("nft");
    assert!(!String::from_utf8_lossy(&tables.stdout).contains(&left.table()));
    let _ = runtime.cgroup_root().remove();
}
