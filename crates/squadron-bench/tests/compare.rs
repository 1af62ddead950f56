//! A short real comparison: a 3-node Squadron cluster and a 3-node etcd cluster, the lease
//! cycle at 1 and 4 clients for 2 s each, then failover and memory.
//!
//! Needs the `squadron` binary (`SQUADRON_BIN`, or `<target>/debug/squadron` beside this test's
//! `deps` directory: `cargo build -p squadron` first) and etcd at /usr/bin/etcd (Debian's
//! `etcd-server` package).

mod support;

use std::time::Duration;

use squadron_bench::{compare, render_table, CompareOptions, Workload};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squadron_and_etcd_side_by_side() {
    let work = tempfile::tempdir().expect("tempdir");
    let mut opts = CompareOptions::new(support::squadron_bin());
    opts.etcd_bin = support::etcd_bin();
    opts.clients = vec![1, 4];
    opts.duration = Duration::from_secs(2);
    opts.warmup = Duration::from_millis(500);
    opts.workloads = vec![Workload::LeaseCycle];
    opts.failover_clients = 4;
    opts.work_dir = Some(work.path().to_path_buf());

    let report = compare(&opts).await.expect("comparison");
    let table = render_table(&report);

    assert_eq!(report.points.len(), 2, "{table}");
    for (p, clients) in report.points.iter().zip([1, 4]) {
        assert_eq!((p.workload, p.clients), (Workload::LeaseCycle, clients));
        for (name, s) in [("squadron", &p.squadron), ("etcd", &p.etcd)] {
            let s = s
                .as_ref()
                .unwrap_or_else(|| panic!("{name} missing: {table}"));
            assert!(s.ok > 0 && s.ops_per_s > 0.0, "{name}: {s:?}\n{table}");
            assert_eq!(s.errors, 0, "{name}: {s:?}\n{table}");
            assert_eq!(s.latency.count, s.ok + s.refused);
            let l = &s.latency;
            assert!(
                0.0 < l.p50_ms && l.p50_ms <= l.p99_ms && l.p99_ms <= l.p999_ms,
                "{name}: {l:?}"
            );
        }
        let r = p.ratio.expect("ratios when both ran");
        let expected = p.squadron.as_ref().unwrap().ops_per_s / p.etcd.as_ref().unwrap().ops_per_s;
        assert!((r.ops_per_s.unwrap() - expected).abs() < 1e-9, "{r:?}");
    }

    for (name, f) in [
        ("squadron", &report.failover.squadron),
        ("etcd", &report.failover.etcd),
    ] {
        let f = f
            .as_ref()
            .unwrap_or_else(|| panic!("{name} failover missing: {table}"));
        let ms = f
            .recovery_ms
            .unwrap_or_else(|| panic!("{name}: no write after the kill: {table}"));
        assert!(ms > 0.0 && ms < f.wait_ms_max as f64, "{name}: {f:?}");
        let elected = f
            .leader_elected_ms
            .unwrap_or_else(|| panic!("{name}: no new leader seen: {table}"));
        assert!(
            elected > 0.0 && elected < f.wait_ms_max as f64,
            "{name}: {f:?}"
        );
    }
    assert!(report.failover.ratio.is_some(), "{table}");

    for nodes in [&report.memory.squadron, &report.memory.etcd] {
        assert_eq!(nodes.len(), 3, "{table}");
        assert!(nodes.iter().all(|n| n.rss_kib > 1024), "{nodes:?}");
    }
    // Every client started at the leader (the default route): no follower passed a write on.
    assert_eq!(report.route, squadron_bench::ClientRoute::Leader);
    let internals = report
        .squadron_internals
        .as_ref()
        .expect("squadron's counters");
    assert!(internals.proposal_commands > 0, "{internals:?}");
    assert_eq!(internals.forwards, 0, "{table}");
    assert!(report.machine.cpus >= 1);
    assert_eq!(
        report.etcd_protocol,
        squadron_bench::EtcdProtocol::Grpc,
        "etcd's own protocol by default"
    );
    assert!(
        report.etcd_version.contains("3."),
        "{}",
        report.etcd_version
    );

    assert!(
        table.contains("lease-cycle") && table.contains("failover"),
        "{table}"
    );
    let json = serde_json::to_value(&report).expect("json");
    assert_eq!(json["points"][1]["clients"], 4);
    assert!(json["points"][0]["ratio"]["p99"].is_number(), "{json}");

    // Everything is cleaned up: the run's directory under the work dir is gone.
    let left: Vec<_> = std::fs::read_dir(work.path())
        .expect("read work dir")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
