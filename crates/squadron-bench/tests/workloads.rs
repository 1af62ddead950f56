//! Every workload on both systems, briefly: each must complete operations without errors.
//! (The lease cycle and failover are measured at length in `compare.rs`, with every client at
//! the leader; here client i starts at node i mod 3.)

mod support;

use std::time::Duration;

use squadron_bench::{
    compare, render_table, ClientRoute, CompareOptions, EtcdProtocol, System, Workload,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_workload_completes_operations_on_both_systems() {
    let mut opts = CompareOptions::new(support::squadron_bin());
    opts.etcd_bin = support::etcd_bin();
    opts.clients = vec![3];
    opts.duration = Duration::from_millis(1_500);
    opts.warmup = Duration::from_millis(300);
    opts.workloads = vec![Workload::Capacity, Workload::Read, Workload::Submit];
    opts.failover = false;
    opts.route = ClientRoute::Spread;

    let report = compare(&opts).await.expect("comparison");
    let table = render_table(&report);
    // Two clients of three started at a follower, which passed their writes on.
    assert!(table.contains("client i sends to node i mod n"), "{table}");
    let internals = report
        .squadron_internals
        .as_ref()
        .expect("squadron's counters");
    assert!(internals.forwards > 0, "{table}");

    let workloads: Vec<Workload> = report.points.iter().map(|p| p.workload).collect();
    assert_eq!(
        workloads,
        [Workload::Capacity, Workload::Read, Workload::Submit],
        "{table}"
    );
    for p in &report.points {
        for (name, s) in [("squadron", &p.squadron), ("etcd", &p.etcd)] {
            let s = s
                .as_ref()
                .unwrap_or_else(|| panic!("{name} missing: {table}"));
            assert!(s.ok > 0, "{name} {}: {s:?}\n{table}", p.workload);
            assert_eq!(s.errors, 0, "{name} {}: {s:?}\n{table}", p.workload);
            if p.workload != Workload::Capacity {
                assert_eq!(s.refused, 0, "{name} {}: {s:?}", p.workload);
            }
        }
        assert!(p.ratio.is_some_and(|r| r.ops_per_s.is_some()), "{table}");
    }
    // No failover asked: none measured, but memory is always read.
    assert!(report.failover.squadron.is_none() && report.failover.etcd.is_none());
    assert_eq!(report.memory.squadron.len(), 3, "{table}");
    assert_eq!(report.memory.etcd.len(), 3, "{table}");
}

/// The JSON gateway, which the earlier figures went through, still drives every workload
/// (`--etcd-client gateway`); the default above is etcd's gRPC API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_json_gateway_drives_every_workload() {
    let mut opts = CompareOptions::new(support::squadron_bin());
    opts.etcd_bin = support::etcd_bin();
    opts.etcd_protocol = EtcdProtocol::Gateway;
    opts.systems = vec![System::Etcd];
    opts.clients = vec![2];
    opts.duration = Duration::from_millis(1_000);
    opts.warmup = Duration::from_millis(200);
    opts.workloads = Workload::ALL.to_vec();
    opts.failover = false;

    let report = compare(&opts).await.expect("comparison");
    let table = render_table(&report);
    assert_eq!(report.etcd_protocol, EtcdProtocol::Gateway);
    assert!(
        table.contains("etcd driven through its JSON gateway"),
        "{table}"
    );
    assert_eq!(report.points.len(), Workload::ALL.len(), "{table}");
    for p in &report.points {
        let s = p
            .etcd
            .as_ref()
            .unwrap_or_else(|| panic!("etcd missing: {table}"));
        assert!(s.ok > 0, "{}: {s:?}\n{table}", p.workload);
        assert_eq!(s.errors, 0, "{}: {s:?}\n{table}", p.workload);
        assert!(p.squadron.is_none(), "{table}");
    }
}
