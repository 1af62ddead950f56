//! Trace ids (W3C `traceparent`): a write's id follows it from the node that took it, through
//! the forward to the leader, to the leader's "command applied" line with the entry's index;
//! each answer carries it back; a worker's transition report names the same id in the worker's
//! log line and the leader's.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn json_lines(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The first line of `log` with `message` whose fields include `want`, waiting up to 10 s.
fn logged(log: &Path, message: &str, want: &[(&str, Value)]) -> Value {
    let find = || {
        json_lines(log).into_iter().find(|v| {
            let f = &v["fields"];
            f["message"] == message && want.iter().all(|(k, val)| &f[*k] == val)
        })
    };
    let mut found = None;
    let _ = wait_until(Duration::from_secs(10), || {
        found = find();
        found.is_some()
    });
    found.unwrap_or_else(|| {
        panic!(
            "no {message:?} line with {want:?} in {}:\n{}",
            log.display(),
            tail(log)
        )
    })
}

/// Creates a project through `url` with the given `traceparent`; answers the trace id the node
/// answered with.
fn create_project(url: &str, project: &str, traceparent: Option<&str>) -> String {
    let mut req = request("POST", &format!("{url}/api/v1/projects"));
    if let Some(tp) = traceparent {
        req = req.set("traceparent", tp);
    }
    let res = req
        .send_json(json!({"tenant": "acme", "project": project}))
        .unwrap_or_else(|e| panic!("create {project}: {e}"));
    assert_eq!(res.status(), 200);
    let answered = res.header("traceparent").expect("a traceparent answered");
    let fields: Vec<&str> = answered.split('-').collect();
    assert_eq!(fields.len(), 4, "{answered}");
    assert_eq!((fields[0], fields[1].len(), fields[3]), ("00", 32, "01"));
    fields[1].to_owned()
}

#[test]
fn a_writes_trace_id_follows_it_to_the_leaders_apply_and_a_workers_report_names_its_own() {
    // The lines a trace is followed by are at debug.
    let cluster = Cluster::start_with(
        3,
        ClusterOptions {
            log_filter: "info,squadron_server=debug,openraft=warn",
            ..ClusterOptions::default()
        },
    );
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    let follower = if leader == 1 { 2 } else { 1 };
    let leader_log = &cluster.nodes[&leader].log;

    // The caller's trace, through a follower's forward.
    let caller = format!("00-{TRACE}-00f067aa0ba902b7-01");
    let answered = create_project(&cluster.url(follower), "traced", Some(&caller));
    assert_eq!(answered, TRACE, "the caller's trace id is kept");
    let applied = logged(
        leader_log,
        "command applied",
        &[
            ("trace_id", json!(TRACE)),
            ("command", json!("create_project")),
        ],
    );
    assert_eq!(applied["fields"]["rejected"], false, "{applied}");
    assert!(applied["fields"]["index"].as_u64() > Some(0), "{applied}");
    let line = logged(
        &cluster.nodes[&follower].log,
        "request",
        &[
            ("trace_id", json!(TRACE)),
            ("path", json!("/api/v1/projects")),
        ],
    );
    assert_eq!(
        (&line["fields"]["method"], &line["fields"]["status"]),
        (&json!("POST"), &json!(200))
    );

    // No traceparent, or one that cannot be read: a new trace, and the write still goes in.
    for (project, header) in [("fresh", None), ("unreadable", Some("00-zz-01"))] {
        let made = create_project(&cluster.url(leader), project, header);
        assert_ne!(made, TRACE);
        logged(
            leader_log,
            "command applied",
            &[
                ("trace_id", json!(made)),
                ("command", json!("create_project")),
            ],
        );
    }

    // A worker's transition report: the same id in the worker's line and the leader's.
    let worker = WorkerProc::start(
        cluster.dir.path(),
        &unique_worker_id("w-trace"),
        cluster.urls(),
        "process",
    );
    let task = submit_yaml(&cluster.url(leader), &inert_manifest("traced", "process"));
    assert!(task.ok(), "{task:?}");
    let id = task.body["task_submitted"]["task"]
        .as_u64()
        .expect("task id");
    wait_task_state(
        &cluster.url(leader),
        id,
        &["COMPLETED", "FAILED", "FAILED_PRESERVED"],
        Duration::from_secs(60),
    );
    let reported = logged(
        &worker.log,
        "task transition",
        &[("task_id", json!(id.to_string())), ("to", json!("FAILED"))],
    );
    let trace = reported["fields"]["trace_id"].clone();
    assert_eq!(trace.as_str().map(str::len), Some(32), "{reported}");
    logged(
        leader_log,
        "command applied",
        &[("trace_id", trace), ("command", json!("report_transition"))],
    );
}
