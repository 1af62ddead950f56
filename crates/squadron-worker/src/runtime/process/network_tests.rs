//! The process runtime's networks against real namespaces: from inside an `outbound` and an
//! `isolated` sandbox the host's listeners (on loopback, on every host address, on the
//! sandbox's gateway) and a metadata-style address are unreachable; from `outbound` only, a
//! listener in a test-made "internet" namespace (100.100/16, inside 100.64/10 but outside the
//! sandboxes' slots) is reachable. `full` is refused unless the worker allows it.

use std::collections::BTreeMap;
use std::fs;
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use squadron_core::manifest::NetworkMode;

use super::tests::{outbox_file, run_to_exit, unique_worker, Fixture};
use super::*;
use crate::runtime::test_internet::{
    host_addresses, TestInternet, CONNECT_TIMEOUT_S, INTERNET_PORT, METADATA_ADDRESS, PROBE_PY,
};

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
    let internet = &*internet;
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

/// The policy's allow list narrows `outbound`: a destination outside it is closed though
/// the same sandbox without a list reaches it (the test above), one inside it is open, and a
/// listed destination the always-denied ranges hold (metadata) stays closed.
#[tokio::test]
async fn an_allow_list_narrows_outbound_and_the_deny_list_still_wins() {
    let internet = TestInternet::new();
    let internet = &*internet;
    let reached = format!("{}:{INTERNET_PORT}", internet.address);
    let metadata = format!("{METADATA_ADDRESS}:{INTERNET_PORT}");
    let with_allow = |allow: &[&str]| {
        let mut config = ProcessRuntimeConfig::new(unique_worker("pr-allow"));
        config.network.allow = Some(allow.iter().map(|a| a.parse().expect("cidr")).collect());
        Fixture::with_config(config)
    };
    let elsewhere = with_allow(&["198.51.100.0/24"]);
    let outside = probe(
        &elsewhere,
        46,
        NetworkMode::Outbound,
        std::slice::from_ref(&reached),
    )
    .await;
    assert_eq!(outside[&reached], "closed", "{outside:?}");
    let listed_address = format!("{}/32", internet.address);
    let listed = with_allow(&[&listed_address, "169.254.169.254/32"]);
    let inside = probe(
        &listed,
        47,
        NetworkMode::Outbound,
        &[reached.clone(), metadata.clone()],
    )
    .await;
    assert_eq!(inside[&reached], "open", "{inside:?}");
    assert_eq!(inside[&metadata], "closed", "{inside:?}");
}

/// A listener inside an `outbound` sandbox, which prints the sandbox's own address and
/// accepts until its sandbox is destroyed.
const LISTEN_PY: &str = r#"
import os, socket, struct
def gateway():
    for line in open('/proc/net/route').read().splitlines()[1:]:
        f = line.split()
        if f[1] == '00000000':
            return socket.inet_ntoa(struct.pack('<L', int(f[2], 16)))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.connect((gateway(), 9))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', 9099))
s.listen(16)
open('/mnt/outbox/addr.tmp', 'w').write(u.getsockname()[0])
os.rename('/mnt/outbox/addr.tmp', '/mnt/outbox/addr')
while True:
    c, _ = s.accept()
    c.close()
"#;

/// Inbound only from the worker: a listener in an `outbound` sandbox is reached from the
/// host (the worker's side of the pair) and not from the internet the sandbox reaches out to.
#[tokio::test]
async fn only_the_worker_opens_a_connection_into_an_outbound_sandbox() {
    let internet = TestInternet::new();
    let internet = &*internet;
    let fx = Fixture::new();
    let mut spec = fx.spec(45, "python3 /mnt/run/listen.py\n");
    spec.network = NetworkMode::Outbound;
    fs::write(spec.dir.run().join("listen.py"), LISTEN_PY).expect("listen.py");
    let handle = fx.runtime.provision(&spec).await.expect("provision");
    fx.runtime.start(&handle, &spec).await.expect("start");
    let addr_file = spec.dir.outbox().join("addr");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !addr_file.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox's listener never came up: {}",
            fs::read_to_string(spec.dir.stderr_log()).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let target = format!("{}:9099", fs::read_to_string(&addr_file).expect("addr"));
    let from_host =
        TcpStream::connect_timeout(&target.parse().expect("address"), Duration::from_secs(3));
    let from_internet = internet.connects(&target);
    fx.runtime.destroy(&handle).await.expect("destroy");
    // The probe itself works: the internet reaches a listener on the host.
    let host_listener = TcpListener::bind("0.0.0.0:0").expect("host listener");
    let host_target = format!(
        "{}:{}",
        internet.host,
        host_listener.local_addr().expect("port").port()
    );
    assert!(internet.connects(&host_target), "{host_target}");
    assert!(from_host.is_ok(), "the worker cannot reach {target}");
    assert!(
        !from_internet,
        "the internet opened a connection to {target}"
    );
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

/// Asks the proxy in `HTTPS_PROXY` to CONNECT (`via=host:port`, printing its status) or
/// connects straight (`direct=host:port`, printing open|closed); PROXYHOST is the proxy's
/// own address.
const GATEWAY_PY: &str = r#"
import os, socket, sys
proxy_host, proxy_port = os.environ['HTTPS_PROXY'].split('//', 1)[1].rsplit(':', 1)
def via(target):
    try:
        s = socket.create_connection((proxy_host, int(proxy_port)), timeout=TIMEOUT)
        s.sendall(('CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n' % (target, target)).encode())
        line = s.recv(1024).split(b'\r\n')[0].decode()
        s.close()
        return line.split(' ')[1]
    except Exception:
        return 'error'
def direct(target):
    host, port = target.rsplit(':', 1)
    try:
        socket.create_connection((host, int(port)), timeout=TIMEOUT).close()
        return 'open'
    except Exception:
        return 'closed'
for arg in sys.argv[1:]:
    kind, target = arg.split('=', 1)
    target = target.replace('PROXYHOST', proxy_host)
    print(arg, via(target) if kind == 'via' else direct(target))
"#;

/// `gateway`: nothing is forwarded; through the worker's proxy the sandbox reaches what the
/// allow list names and nothing a sandbox may never reach (loopback, the host's addresses,
/// the metadata address), even by a name the list allows; each request is an event.
#[tokio::test]
async fn a_gateway_sandbox_reaches_only_what_its_proxy_allows() {
    use crate::runtime::gateway::{AllowList, Destinations};
    let internet = TestInternet::new();
    let internet = &*internet;
    let loopback_only = TcpListener::bind("127.0.0.1:0").expect("loopback listener");
    let everywhere = TcpListener::bind("0.0.0.0:0").expect("host listener");
    let (lo_port, any_port) = (
        loopback_only.local_addr().unwrap().port(),
        everywhere.local_addr().unwrap().port(),
    );
    let mut config = ProcessRuntimeConfig::new(unique_worker("pr-gw"));
    // The list names what must stay out of reach too, so the proxy's own refusal of them
    // is what the probe meets, not the list's.
    let mut allow = vec![
        format!("{}/32", internet.address),
        "localhost".to_owned(),
        "127.0.0.0/8".to_owned(),
        format!("{METADATA_ADDRESS}/32"),
    ];
    allow.extend(host_addresses().iter().map(|a| format!("{a}/32")));
    let allow = AllowList::parse(&allow).expect("allow list");
    config.gateway = Some(std::sync::Arc::new(
        Destinations::for_worker(allow, &config.network.deny, &config.network.ip)
            .expect("destinations"),
    ));
    let fx = Fixture::with_config(config);
    let allowed = format!("{}:{INTERNET_PORT}", internet.address);
    let mut targets = vec![
        format!("direct={allowed}"),
        format!("via={allowed}"),
        format!("via={METADATA_ADDRESS}:{INTERNET_PORT}"),
        format!("via=127.0.0.1:{lo_port}"),
        format!("via=localhost:{lo_port}"),
        format!("direct=PROXYHOST:{any_port}"),
        format!("via=PROXYHOST:{any_port}"),
    ];
    for addr in host_addresses() {
        targets.push(format!("direct={addr}:{any_port}"));
        targets.push(format!("via={addr}:{any_port}"));
    }
    let script = format!(
        "python3 /mnt/run/gateway.py {} > /mnt/outbox/probe\n",
        targets.join(" ")
    );
    let mut spec = fx.spec(44, &script);
    spec.network = NetworkMode::Gateway;
    fs::write(
        spec.dir.run().join("gateway.py"),
        GATEWAY_PY.replace("TIMEOUT", &CONNECT_TIMEOUT_S.to_string()),
    )
    .expect("gateway.py");
    let (handle, code) = run_to_exit(&fx, &spec).await;
    assert_eq!(
        code,
        0,
        "stderr: {}",
        fs::read_to_string(spec.dir.stderr_log()).unwrap_or_default()
    );
    let results: BTreeMap<String, String> = outbox_file(&spec, "probe")
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(t, r)| (t.to_owned(), r.to_owned()))
        .collect();
    for (target, result) in &results {
        let want = if target == &format!("via={allowed}") {
            "200"
        } else if target.starts_with("direct=") {
            "closed"
        } else {
            "403"
        };
        assert_eq!(result, want, "{target}: {results:?}");
    }
    assert_eq!(results.len(), targets.len(), "{results:?}");
    let events = crate::test_support::events(&spec.dir);
    let gateway: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["event"] == "gateway").collect();
    assert!(
        gateway.iter().any(|e| e["allowed"] == true
            && e["host"] == internet.address.to_string()
            && e["port"] == INTERNET_PORT),
        "{events:?}"
    );
    for host in ["localhost", "127.0.0.1", METADATA_ADDRESS] {
        assert!(
            gateway.iter().any(|e| e["allowed"] == false
                && e["host"] == host
                && e["status"] == 403
                && e["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("no sandbox may reach"))),
            "{host}: {events:?}"
        );
    }
    fx.runtime.destroy(&handle).await.expect("destroy");
    // The proxy went with the sandbox.
    assert!(fx.runtime.gateways.lock().await.is_empty());
}

/// Root inside a sandbox's namespace (as a VM's kernel is on its tap) sends from an address
/// that is not its own: the filter drops it, while the sandbox's own datagram goes out
/// (NATed). Without the source check the spoofed datagram left un-NATed and reached the
/// internet's receiver.
#[test]
fn a_datagram_from_an_address_not_the_sandbox_s_own_never_leaves() {
    let internet = TestInternet::new();
    let config = ProcessRuntimeConfig::new(unique_worker("pr-spoof"));
    let net = SandboxNetwork::create(&config.network, "spoof").expect("create");
    let spoofed = "198.51.100.7";
    let netns = net.netns_name();
    let add = Command::new("ip")
        .args([
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{spoofed}/32"),
            "dev",
            "eth0",
        ])
        .status()
        .expect("ip addr add");
    assert!(add.success());
    let mut receiver = std::process::Command::new("ip")
        .args(["netns", "exec", &internet.netns, "python3", "-c"])
        .arg(
            "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             s.bind(('0.0.0.0', 9999))\ns.settimeout(4)\nprint('ready', flush=True)\n\
             try:\n    while True:\n        print(s.recvfrom(64)[0].decode(), flush=True)\n\
             except socket.timeout:\n    pass\n",
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("receiver");
    // Sent only once the receiver is bound: a loaded machine starts python slowly.
    let mut receiver_out = std::io::BufReader::new(receiver.stdout.take().expect("stdout"));
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut receiver_out, &mut ready).expect("ready line");
    assert_eq!(ready.trim(), "ready");
    let own = net.sandbox_address().to_string();
    let send = format!(
        "import socket\nfor src in ['{own}', '{spoofed}']:\n    \
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    s.bind((src, 0))\n    \
         for _ in range(3):\n        s.sendto(src.encode(), ('{}', 9999))\n",
        internet.address
    );
    let sent = Command::new("ip")
        .args(["netns", "exec", &netns, "python3", "-c", &send])
        .status()
        .expect("sender");
    let mut got = String::new();
    std::io::Read::read_to_string(&mut receiver_out, &mut got).expect("receiver output");
    let _ = receiver.wait();
    net.destroy().expect("destroy");
    assert!(sent.success());
    assert!(
        got.lines().any(|l| l == own),
        "the sandbox's own datagram should arrive: {got:?}"
    );
    assert!(
        !got.contains(spoofed),
        "a spoofed source left the host: {got:?}"
    );
}

/// A VM's tap a crashed life left (no namespace: found by its alias) is swept with its
/// table; another owner's tap is not.
#[test]
fn the_sweep_takes_its_own_left_taps_and_no_other_owners() {
    let mine = NetworkConfig::new(&unique_worker("pr-tap-mine"));
    let theirs = NetworkConfig::new(&unique_worker("pr-tap-theirs"));
    let left = SandboxNetwork::create_tap(&mine, "left").expect("my tap");
    let other = SandboxNetwork::create_tap(&theirs, "other").expect("their tap");
    let exists = |net: &SandboxNetwork| {
        std::path::Path::new("/sys/class/net")
            .join(net.host_interface())
            .exists()
    };
    assert!(exists(&left) && exists(&other));
    let removed = SandboxNetwork::sweep(&mine).expect("sweep");
    let other_still = exists(&other);
    let _ = other.destroy();
    assert_eq!(removed, vec![left.netns_name()]);
    assert!(!exists(&left), "my left tap stayed");
    assert!(other_still, "the sweep removed another owner's tap");
    let tables = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .expect("nft");
    let tables = String::from_utf8_lossy(&tables.stdout);
    assert!(!tables.contains(&left.table()), "{tables}");
    assert!(!tables.contains(&other.table()), "{tables}");
}
