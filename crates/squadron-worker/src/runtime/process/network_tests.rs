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
