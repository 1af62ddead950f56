//! The namespace network partitions for real: packets between two namespaces flow, are
//! dropped under a partition, flow again after the heal, and everything is gone after teardown.
//!
//! The probe is `curl` to a port nothing listens on: a reachable node answers with a reset
//! at once (curl exit 7), a partitioned one never answers (exit 28, timeout).

use std::process::Command;

use squadron_jepsen::netns::{run, NamespaceNet};

const REFUSED: i32 = 7;
const TIMED_OUT: i32 = 28;

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
    let mut net = NamespaceNet::create(3)
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

    let errors = net.teardown();
    assert!(errors.is_empty(), "{errors:?}");
    let left = run(&["ip", "netns", "list"]).expect("ip netns list");
    assert!(!left.contains(&n1), "namespace {n1} left behind: {left}");
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
