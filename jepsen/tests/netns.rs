//! The namespace network partitions for real: packets between two namespaces flow, are
//! dropped under a partition, flow again after the heal, and everything is gone after teardown.
//!
//! The probe is `curl` to a port nothing listens on: a reachable node answers with a reset
//! at once (curl exit 7), a partitioned one never answers (exit 28, timeout).

use std::process::Command;

use squadron_jepsen::netns::{run, NamespaceNet};

const REFUSED: i32 = 7;
const TIMED_OUT: i32 = 28;

/// One network at a time: a process's network is named after its pid.
static ONE_NETWORK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_network() -> std::sync::MutexGuard<'static, ()> {
    ONE_NETWORK.lock().unwrap_or_else(|p| p.into_inner())
}

fn probe(from_ns: Option<&str>, to: &str) -> i32 {
    let url = format!("http://{to}:9/");
    let mut args: Vec<&str> = Vec::new();
    if let Some(ns) = from_ns {
        args.extend(["ip", "netns", "exec", ns]);
    }
    args.extend(["curl", "-s", "--connect-timeout", "2", &url]);
    let status = Command::new(args[0])
        .args(&args[1..])
        .status()
        .expect("run curl");
    status.code().expect("curl exit code")
}

#[test]
fn partition_drops_packets_and_heal_restores_them() {
    let _one = one_network();
    let net = NamespaceNet::create(3)
        .expect("network namespaces (run as root with iproute2 and iptables)");
    let (n1, n2, n3) = (net.namespace(1), net.namespace(2), net.address(3));
    let a2 = net.address(2);
    assert_eq!(
        probe(Some(&n1), &a2),
        REFUSED,
        "n1 reaches n2 before the partition"
    );
    assert_eq!(
        probe(None, &net.address(1)),
        REFUSED,
        "the harness reaches n1 through the bridge"
    );

    let grudge = [(1, [2].into()), (2, [1].into())].into();
    net.partition(&grudge).expect("partition");
    assert_eq!(probe(Some(&n1), &a2), TIMED_OUT, "n1 → n2 dropped");
    assert_eq!(
        probe(Some(&n2), &net.address(1)),
        TIMED_OUT,
        "n2 → n1 dropped"
    );
    assert_eq!(probe(Some(&n1), &n3), REFUSED, "n1 → n3 unaffected");
    assert_eq!(probe(None, &a2), REFUSED, "the harness still reaches n2");

    net.heal().expect("heal");
    assert_eq!(
        probe(Some(&n1), &a2),
        REFUSED,
        "n1 reaches n2 after the heal"
    );

    assert_torn_down(net, &n1);
}

/// Tears `net` down and checks nothing of it is left: namespaces, links, the FORWARD rule.
fn assert_torn_down(mut net: NamespaceNet, n1: &str) {
    let errors = net.teardown();
    assert!(errors.is_empty(), "{errors:?}");
    let left = run(&["ip", "netns", "list"]).expect("ip netns list");
    assert!(!left.contains(n1), "namespace {n1} left behind: {left}");
    // The kernel removes a namespace's veth peers after the namespace itself, a moment later.
    let tag = n1.trim_end_matches("n1");
    let mut links = String::new();
    for _ in 0..100 {
        links = run(&["ip", "-o", "link", "show"]).expect("ip link");
        if !links.contains(tag) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!links.contains(tag), "links of {tag} left behind: {links}");
    let rules = run(&["iptables", "-S", "FORWARD"]).expect("iptables");
    assert!(!rules.contains(tag), "FORWARD rule of {tag} left behind");
}

/// curl's whole time, in seconds, for the refused connection `probe` makes.
fn connect_seconds(from_ns: Option<&str>, to: &str) -> f64 {
    let url = format!("http://{to}:9/");
    let mut args: Vec<&str> = Vec::new();
    if let Some(ns) = from_ns {
        args.extend(["ip", "netns", "exec", ns]);
    }
    args.extend([
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "--connect-timeout",
        "5",
        "-w",
        "%{time_total}",
        &url,
    ]);
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("curl's time: {text:?}"))
}

/// The delay fault for real: a connection between two nodes takes at least two delays (the
/// SYN on the way in, the reset on the way back), the harness's own reaches a node at once,
/// and after the heal the nodes' is fast again with the delay threads gone.
#[test]
fn delay_holds_packets_between_nodes_and_heal_releases_them() {
    const DELAY_MS: u64 = 150;
    let _one = one_network();
    let net = NamespaceNet::create(2)
        .expect("network namespaces (run as root with iproute2 and iptables)");
    let (n1, a2) = (net.namespace(1), net.address(2));
    let before = connect_seconds(Some(&n1), &a2);
    assert!(before < 0.1, "n1 → n2 before the delay: {before} s");

    net.delay(std::time::Duration::from_millis(DELAY_MS))
        .expect("delay");
    let rules = run(&["ip", "netns", "exec", &n1, "iptables", "-S", "INPUT"]).expect("rules");
    assert!(rules.contains("NFQUEUE"), "{rules}");
    let delayed = connect_seconds(Some(&n1), &a2);
    let two_delays = 2.0 * DELAY_MS as f64 / 1000.0;
    assert!(
        delayed >= two_delays,
        "n1 → n2 under a {DELAY_MS} ms delay took {delayed} s"
    );
    assert_eq!(probe(Some(&n1), &a2), REFUSED, "delayed, not dropped");
    let harness = connect_seconds(None, &a2);
    let one_delay = DELAY_MS as f64 / 1000.0;
    assert!(harness < one_delay, "the harness → n2 took {harness} s");

    net.heal().expect("heal");
    let after = connect_seconds(Some(&n1), &a2);
    assert!(after < 0.1, "n1 → n2 after the heal: {after} s");
    let rules = run(&["ip", "netns", "exec", &n1, "iptables", "-S", "INPUT"]).expect("rules");
    assert!(!rules.contains("NFQUEUE"), "{rules}");
    assert_torn_down(net, &n1);
}
