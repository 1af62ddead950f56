//! Real runs catch deliberate bugs (one binary, so the runs go two at a time):
//! - a node built with the cargo feature `jepsen-faults` (which `scripts/test` builds) and
//!   `SQUADRON_JEPSEN_FAULT=local-reads` in the nodes' environment answers "linearizable"
//!   reads from local state: the CAS workload under partitions must be judged invalid with
//!   non-linearizable reads;
//! - with `forget-idempotency-keys` the nodes drop every request's key: the `keyed`
//!   workload's resends and replays apply twice, and the run must be invalid with INV-11;
//! - clients that read with `?consistency=stale` (a client bug) read from partitioned nodes:
//!   invalid with non-linearizable reads.

mod support;

use serde_json::json;

/// 25 s of the CAS workload under partitions, with `extra` arguments and `env`.
fn cas_under_partitions(
    out: &std::path::Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, serde_json::Value, String) {
    let mut args = vec![
        "--nodes",
        "3",
        "--workload",
        "cas",
        "--nemesis",
        "partition",
        "--time-limit",
        "25",
        "--rate",
        "25",
        "--seed",
        "3",
        "--fault-secs",
        "8",
        "--quiet-secs",
        "2",
    ];
    args.extend_from_slice(extra);
    support::run_suite_with_env(out, &args, env)
}

#[test]
fn a_node_serving_local_reads_is_caught() {
    let out = tempfile::tempdir().expect("tempdir");
    // The nodes inherit the harness's environment.
    let (status, results, text) =
        cas_under_partitions(out.path(), &[], &[("SQUADRON_JEPSEN_FAULT", "local-reads")]);
    assert_eq!(
        results["valid"],
        json!(false),
        "the faulty node went unnoticed (was the binary built with --features \
         squadron/jepsen-faults?):\n{text}"
    );
    assert_eq!(status.code(), Some(1));
    let kinds = support::anomaly_kinds(&results);
    assert!(kinds.iter().any(|k| k == "non-linearizable"), "{text}");
}

#[test]
fn a_node_that_forgets_idempotency_keys_is_caught() {
    let out = tempfile::tempdir().expect("tempdir");
    let (status, results, text) = support::run_suite_with_env(
        out.path(),
        &[
            "--nodes",
            "3",
            "--workload",
            "keyed",
            "--nemesis",
            "none",
            "--time-limit",
            "10",
            "--rate",
            "30",
            "--seed",
            "7",
        ],
        &[("SQUADRON_JEPSEN_FAULT", "forget-idempotency-keys")],
    );
    assert_eq!(results["valid"], json!(false), "results:\n{text}");
    assert_eq!(status.code(), Some(1), "exit {status}");
    let kinds = support::anomaly_kinds(&results);
    assert!(
        kinds.iter().any(|k| k == "inv11-replay-differs"),
        "{kinds:?}\n{text}"
    );
}

#[test]
fn stale_reads_under_partitions_are_caught() {
    let out = tempfile::tempdir().expect("tempdir");
    let (status, results, text) = cas_under_partitions(out.path(), &["--reads", "stale"], &[]);
    assert_eq!(
        results["valid"],
        json!(false),
        "stale reads went unnoticed:\n{text}"
    );
    assert_eq!(status.code(), Some(1), "exit status of an invalid run");
    let kinds = support::anomaly_kinds(&results);
    assert!(kinds.iter().any(|k| k == "non-linearizable"), "{text}");
}
