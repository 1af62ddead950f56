//! Sandbox networks against the real kernel: what `create` makes, that `destroy` removes all
//! of it, and that `sweep` finds what a crashed worker left. Needs root, iproute2 and
//! nftables. Prints the time a namespace with its pair and rules takes to make and remove.

use std::process::Command;
use std::time::{Duration, Instant};

use squadron_isolation::{NetworkConfig, SandboxNetwork};

fn config(tag: &str) -> NetworkConfig {
    NetworkConfig::new(&format!("net-test-{tag}-{}", std::process::id()))
}

fn sh(command: &str) -> String {
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .output()
        .expect("sh");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every trace of one network on the host: namespace file, host interface, table, rules.
fn traces(net: &SandboxNetwork) -> Vec<String> {
    let mut found = Vec::new();
    if net.netns_path().exists() {
        found.push(net.netns_path().display().to_string());
    }
    if !sh(&format!(
        "ip -br link show {} 2>/dev/null",
        net.host_interface()
    ))
    .is_empty()
    {
        found.push(net.host_interface());
    }
    if sh("nft list tables").contains(&net.table()) {
        found.push(net.table());
    }
    if sh("iptables -w -S FORWARD 2>/dev/null").contains(&net.table()) {
        found.push(format!("FORWARD rules {}", net.table()));
    }
    found
}

#[test]
fn create_makes_everything_destroy_removes_it_and_sweep_finds_leftovers() {
    let config = config("life");
    let mut made = Vec::new();
    let mut removed = Vec::new();
    let mut nets = Vec::new();
    for n in 0..5 {
        let started = Instant::now();
        let net = SandboxNetwork::create(&config, &format!("seed-{n}")).expect("create");
        made.push(started.elapsed());
        assert_eq!(traces(&net).len(), 4, "{:?}", traces(&net));
        let inside = sh(&format!(
            "ip -n {} -4 -o addr show dev eth0; ip -n {} route",
            net.netns_name(),
            net.netns_name()
        ));
        assert!(
            inside.contains(&format!("{}/30", net.sandbox_address())),
            "{inside}"
        );
        assert!(
            inside.contains(&format!("default via {}", net.host_address())),
            "{inside}"
        );
        nets.push(net);
    }
    // Five seeds, five distinct slots and addresses.
    let mut addresses: Vec<_> = nets.iter().map(SandboxNetwork::sandbox_address).collect();
    addresses.sort();
    addresses.dedup();
    assert_eq!(addresses.len(), nets.len());

    let crashed = nets.pop().expect("one left for the sweep");
    for net in &nets {
        let started = Instant::now();
        net.destroy().expect("destroy");
        removed.push(started.elapsed());
        assert!(traces(net).is_empty(), "{:?}", traces(net));
        net.destroy().expect("a second destroy is a no-op");
    }
    // A worker killed mid-teardown: the namespace is gone, the table and rules are not.
    assert!(Command::new("ip")
        .args(["netns", "del", &crashed.netns_name()])
        .status()
        .expect("ip")
        .success());
    let swept = SandboxNetwork::sweep(&config).expect("sweep");
    assert_eq!(swept, vec![crashed.netns_name()]);
    assert!(traces(&crashed).is_empty(), "{:?}", traces(&crashed));
    let ms = |d: &[Duration]| {
        d.iter()
            .map(|d| format!("{:.1}", d.as_secs_f64() * 1000.0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "sandbox network: create {} ms; destroy {} ms",
        ms(&made),
        ms(&removed)
    );
}

#[test]
fn sweep_keeps_a_namespace_a_process_is_in() {
    let config = config("busy");
    let net = SandboxNetwork::create(&config, "busy").expect("create");
    let mut child = Command::new("nsenter")
        .arg(format!("--net={}", net.netns_path().display()))
        .args(["--", "sleep", "30"])
        .spawn()
        .expect("nsenter");
    // Until nsenter has entered, the namespace looks idle.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sh(&format!("ip netns pids {}", net.netns_name()))
        .trim()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "nsenter never entered");
        std::thread::sleep(Duration::from_millis(20));
    }
    let swept = SandboxNetwork::sweep(&config).expect("sweep");
    let _ = child.kill();
    let _ = child.wait();
    assert!(swept.is_empty(), "{swept:?}");
    assert_eq!(traces(&net).len(), 4);
    net.destroy().expect("destroy");
    assert!(traces(&net).is_empty());
}
