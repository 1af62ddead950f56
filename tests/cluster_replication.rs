//! Three real nodes over real sockets on RocksDB: forwarding, linearizable reads, crash of the
//! leader under load, catch-up by snapshot.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use support::*;

#[test]
fn write_to_a_follower_is_forwarded_and_a_linearizable_read_elsewhere_sees_it() {
    let cluster = Cluster::start(3);
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let r = post(
        &format!("{}/api/v1/projects", cluster.url(followers[0])),
        json!({"tenant": "acme", "project": "web"}),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, json!("project_created"));
    // Right after, on the other follower, a linearizable read sees the write.
    let project = http_get(&format!(
        "{}/api/v1/projects/acme/web",
        cluster.url(followers[1])
    ))
    .unwrap();
    assert_eq!(project["max_active"], json!(4));
    // A second create is a business rejection with the error table's status, not a 500.
    let r = post(
        &format!("{}/api/v1/projects", cluster.url(followers[1])),
        json!({"tenant": "acme", "project": "web"}),
    )
    .unwrap();
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(r.body["code"], json!("already_exists"));
    // Bad input is a 400 naming the field, and changes nothing.
    let r = post(
        &format!("{}/api/v1/projects", cluster.url(leader)),
        json!({"tenant": "Acme!", "project": "web"}),
    )
    .unwrap();
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.body["field"], json!("tenant"));
    cluster.wait_for_equal_digests(Duration::from_secs(10));
}

/// One counter of a node's `/metrics`.
fn metric(url: &str, name: &str) -> u64 {
    let (_, text) = http_text(&format!("{url}/metrics")).expect("metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

#[test]
fn concurrent_writes_to_a_follower_share_forward_requests_and_raft_entries() {
    let cluster = Cluster::start(3);
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let (f_url, l_url) = (cluster.url(follower), cluster.url(leader));
    let forwards_before = metric(&f_url, "squadron_forwards_total");
    let requests_before = metric(&f_url, "squadron_forward_requests_total");
    let entries_before = metric(&l_url, "squadron_proposal_entries_total");
    let commands_before = metric(&l_url, "squadron_proposal_commands_total");

    const WRITERS: usize = 64;
    let start = Arc::new(std::sync::Barrier::new(WRITERS));
    let writers: Vec<_> = (0..WRITERS)
        .map(|i| {
            let (url, start) = (f_url.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                post(
                    &format!("{url}/api/v1/projects"),
                    json!({"tenant": "acme", "project": format!("p{i}")}),
                )
                .expect("post")
            })
        })
        .collect();
    for w in writers {
        let r = w.join().expect("writer");
        assert_eq!(r.status, 200, "{r:?}");
    }
    // Every write was applied once: all 64 projects exist, read on the leader.
    let projects = http_get(&format!("{l_url}/api/v1/projects")).expect("projects");
    assert_eq!(
        projects.as_array().map(Vec::len),
        Some(WRITERS),
        "{projects}"
    );

    let forwards = metric(&f_url, "squadron_forwards_total") - forwards_before;
    let requests = metric(&f_url, "squadron_forward_requests_total") - requests_before;
    let entries = metric(&l_url, "squadron_proposal_entries_total") - entries_before;
    let commands = metric(&l_url, "squadron_proposal_commands_total") - commands_before;
    assert_eq!(forwards, WRITERS as u64, "each write forwarded once");
    assert!(
        requests < forwards,
        "{forwards} forwarded writes went in {requests} requests: none were shared"
    );
    // The leader's own sweep also proposes, so its counts include a few more commands.
    assert!(commands >= WRITERS as u64, "{commands} commands");
    assert!(
        entries < commands,
        "{commands} commands in {entries} entries: no entry was shared"
    );

    // The same figures as histograms, read from one scrape (the leader's own sweep goes on
    // proposing): each entry's commit time and its writes, each WAL sync's time, each REST
    // answer's time (the follower answered the 64 writes).
    let (_, text) = http_text(&format!("{l_url}/metrics")).expect("metrics");
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
    };
    let commits = value("squadron_proposal_commit_duration_seconds_count");
    assert!(
        commits >= entries as f64,
        "{commits} commit times for {entries} entries"
    );
    assert_eq!(value("squadron_proposal_writes_per_entry_count"), commits);
    let writes = value("squadron_proposal_writes_per_entry_sum");
    assert!(writes >= commands as f64, "{writes} writes in histograms");
    let syncs = value("squadron_log_sync_duration_seconds_count");
    assert!(syncs >= 1.0, "no WAL sync timed");
    assert_eq!(
        value("squadron_log_sync_duration_seconds_bucket{le=\"+Inf\"}"),
        syncs
    );
    // The state machine timed each applied batch and counted its entries.
    let applies = value("squadron_apply_duration_seconds_count");
    assert!(applies >= 1.0, "no apply timed");
    assert_eq!(value("squadron_apply_lock_wait_seconds_count"), applies);
    let applied = value("squadron_entries_applied_total");
    assert!(
        applied >= entries as f64 && applied >= applies,
        "{applied} entries applied in {applies} batches; {entries} entries proposed"
    );
    assert_eq!(
        value("squadron_apply_entry_duration_seconds_count"),
        applied,
        "each entry applied is timed"
    );
    assert_eq!(value("squadron_apply_entry_cpu_seconds_count"), applied);
    let answered = metric(
        &f_url,
        "squadron_http_request_duration_seconds_count{method=\"POST\",status=\"2xx\"}",
    );
    assert!(answered >= WRITERS as u64, "{answered} POSTs timed");
}

/// A worker's registration at `url`, with its certificate (a new cluster has no operator
/// token until its first leader made one).
fn register(url: &str, worker: &str) -> Reply {
    worker_post(
        worker,
        &format!("{url}/api/v1/workers"),
        json!({
            "worker": worker, "address": "127.0.0.1:1", "runtimes": ["process"], "capacity": 1,
            "heartbeat_interval_ms": 600000
        }),
    )
    .expect("register")
}

/// A node that knows no leader — the first of three to start, which cannot win an election
/// alone — holds a write for `server.leader_wait_ms` and then refuses it with 503, having
/// applied nothing; a write that arrives before a second node starts waits for the election
/// that node makes possible, and is applied.
#[test]
fn a_write_without_a_leader_waits_for_an_election() {
    const LEADER_WAIT_MS: u64 = 8_000;
    let mut cluster = Cluster::configure(
        3,
        ClusterOptions {
            leader_wait_ms: LEADER_WAIT_MS,
            ..ClusterOptions::default()
        },
    );
    cluster.start_node(1);
    let url = cluster.url(1);

    let started = std::time::Instant::now();
    let refused = register(&url, "w-refused");
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.body["code"], json!("unavailable"), "{refused:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(LEADER_WAIT_MS),
        "refused after {:?}, before the wait was over",
        started.elapsed()
    );

    let writer = {
        let url = url.clone();
        std::thread::spawn(move || register(&url, "w-elected"))
    };
    // The write is on its way (loopback) before the second node starts.
    std::thread::sleep(Duration::from_millis(300));
    cluster.start_node(2);
    let r = writer.join().expect("writer");
    assert!(r.ok(), "{r:?}");

    // Both writes waited (the node's own start-up writes, the admin's token among them, are
    // counted too), and only the second was applied. Operator tokens work once the first
    // leader made the admin's.
    wait_until(Duration::from_secs(20), || {
        http_get(&format!("{url}/api/v1/workers")).is_ok()
    })
    .expect("the admin token is in force");
    let waited = metric(&url, "squadron_writes_leader_waited_total");
    assert!(waited >= 2, "{waited} writes waited");
    let workers = http_get(&format!("{url}/api/v1/workers")).expect("workers");
    let names: Vec<&str> = workers
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|w| w["id"].as_str())
        .collect();
    assert_eq!(names, ["w-elected"], "{workers}");
}

/// A write at a follower is forwarded to the leader exactly once, and what arrives on the
/// node-to-node route runs where it arrives: a follower that receives a forwarded write
/// refuses it rather than forwarding it again, and nothing is applied.
#[test]
fn a_follower_forwards_a_write_once_and_a_forwarded_write_is_never_forwarded_again() {
    let cluster = Cluster::start(3);
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let (f_url, l_url) = (cluster.url(follower), cluster.url(leader));
    // The node-to-node routes live on the peer listener, which admits only nodes.
    let (fp_url, lp_url) = (cluster.peer_url(follower), cluster.peer_url(leader));
    let counts = || {
        (
            metric(&f_url, "squadron_forwards_total"),
            metric(&f_url, "squadron_forward_requests_total"),
            metric(&l_url, "squadron_forwards_total"),
        )
    };
    let before = counts();
    let r = post(
        &format!("{f_url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "once"}),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    let after = counts();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        (1, 1, 0),
        "one forward from the follower in one request, none from the leader"
    );

    // The peer route on the follower: proposed there or refused, never passed on.
    let forwarded = |project: &str| {
        json!({
            "subject": "legacy",
            "command": {"create_project": {"tenant": "acme", "project": project}},
            "idempotency_key": null
        })
    };
    let before = counts();
    let r = peer_post(&format!("{fp_url}/internal/v1/propose"), forwarded("stray")).unwrap();
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(
        r.body["message"],
        json!("leadership moved while the request was forwarded; retry")
    );
    let r = peer_post(
        &format!("{fp_url}/internal/v1/propose-batch"),
        json!({"requests": [forwarded("stray"), forwarded("stray2")]}),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    for answer in r.body.as_array().expect("answers") {
        assert_eq!(answer["error"]["code"], json!("unavailable"), "{answer}");
    }
    assert_eq!(counts(), before, "the follower forwarded nothing");
    for project in ["stray", "stray2"] {
        let r = http_send(
            "GET",
            &format!("{l_url}/api/v1/projects/acme/{project}"),
            None,
            None,
        )
        .unwrap();
        assert_eq!(r.status, 404, "{project} was applied: {r:?}");
    }

    // On the leader the same route proposes.
    let r = peer_post(
        &format!("{lp_url}/internal/v1/propose"),
        forwarded("direct"),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, json!({"ok": "project_created"}));
    assert_eq!(counts(), before, "the leader forwarded nothing");

    // A membership change takes the same path. Only the leader can commit one, so an answer
    // through the follower's public route is the relayed leader's (re-adding a voter as a
    // learner with its own addresses changes nothing); on its peer route the follower refuses.
    let other = (1..=3)
        .find(|id| *id != leader && *id != follower)
        .expect("a third node");
    let spec = cluster.nodes[&other].spec.clone();
    let r = post(
        &format!("{f_url}/api/v1/cluster/learners"),
        json!({"id": other, "rest": spec.rest, "grpc": spec.grpc, "peer": spec.peer}),
    )
    .unwrap();
    assert_eq!(r.status, 200, "relayed to the leader: {r:?}");
    assert_eq!(r.body["members"].as_array().map(Vec::len), Some(3), "{r:?}");
    let r = peer_post(
        &format!("{fp_url}/internal/v1/membership"),
        json!({"add_learner": {"id": other, "addr": {"rest": spec.rest, "grpc": spec.grpc, "peer": spec.peer}}}),
    )
    .unwrap();
    assert_eq!(
        (r.status, r.body["code"].as_str()),
        (503, Some("unavailable")),
        "a follower does not relay a relayed change: {r:?}"
    );
    cluster.wait_for_equal_digests(Duration::from_secs(10));
}

#[test]
fn kill_the_leader_under_lease_traffic_and_lose_no_acknowledged_write() {
    let mut cluster = Cluster::start(3);
    let url = cluster.url(1);
    let profiles = setup_project(&url, "web", 8, 8);
    let urls = cluster.urls();
    let stop = Arc::new(AtomicBool::new(false));
    // Every acknowledged grant: profile → generations granted.
    let acked: Arc<Mutex<BTreeMap<u64, Vec<u64>>>> = Arc::default();
    let mut clients = Vec::new();
    for (i, profile) in profiles.iter().copied().enumerate() {
        let (stop, acked, urls) = (stop.clone(), acked.clone(), urls.clone());
        clients.push(std::thread::spawn(move || {
            let mut generation = 0u64;
            let mut n = i;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let url = &urls[n % urls.len()];
                let acquire = http_send(
                    "POST",
                    &format!("{url}/api/v1/profiles/{profile}/leases"),
                    Some(acquire_body(generation)),
                    Some(&format!("acq-{profile}-{generation}")),
                );
                let Ok(reply) = acquire else {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                };
                if reply.ok() {
                    let g = &reply.body["lease_granted"];
                    let gen = g["generation"].as_u64().unwrap();
                    let lease = g["lease"].as_u64().unwrap();
                    acked.lock().unwrap().entry(profile).or_default().push(gen);
                    generation = gen;
                    // Release with retries under the same key until it is answered.
                    loop {
                        let url = &urls[n % urls.len()];
                        n += 1;
                        let r = http_send(
                            "POST",
                            &format!("{url}/api/v1/leases/{lease}/release"),
                            Some(json!({"profile": profile, "generation": gen})),
                            Some(&format!("rel-{lease}")),
                        );
                        if matches!(&r, Ok(r) if r.status != 503) || stop.load(Ordering::Relaxed) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                } else if reply.body["code"] == json!("conflict") {
                    // Stale: learn the current generation instead of retrying blindly.
                    if let Some(cur) =
                        reply.body["rejection"]["stale_generation"]["current"].as_u64()
                    {
                        generation = cur;
                    }
                } else {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(3));
    let leader = cluster.wait_for_leader(Duration::from_secs(10));
    cluster.kill(leader);
    let before_kill = acked.lock().unwrap().values().map(Vec::len).sum::<usize>();
    // A new leader is elected among the survivors and writes resume.
    let new_leader = cluster.wait_for_leader(Duration::from_secs(20));
    assert_ne!(new_leader, leader);
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let total: usize = acked.values().map(Vec::len).sum();
    assert!(
        total > before_kill,
        "writes did not resume after the leader died ({total} acked)"
    );
    // Bring the old leader back; every node converges to the same state.
    cluster.start_node(leader);
    cluster.wait_for_equal_digests(Duration::from_secs(30));
    // Every acknowledged grant is in the replicated state: the profile's generation is at
    // least the highest acknowledged one, and acknowledged generations rose one by one.
    for (profile, gens) in &acked {
        for w in gens.windows(2) {
            assert!(
                w[1] > w[0],
                "profile {profile}: generations {gens:?} not rising"
            );
        }
        let p = http_get(&format!(
            "{}/api/v1/profiles/{profile}",
            cluster.url(leader)
        ))
        .unwrap();
        let current = p["generation"].as_u64().unwrap();
        assert!(
            current >= *gens.last().unwrap(),
            "profile {profile} lost generation"
        );
    }
}

#[test]
fn a_node_that_missed_many_entries_catches_up_by_snapshot() {
    let mut cluster = Cluster::start_with(
        3,
        ClusterOptions {
            snapshot_after_entries: 50,
            keep_entries_after_snapshot: 10,
            ..ClusterOptions::default()
        },
    );
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    let victim = (1..=3).find(|id| *id != leader).unwrap();
    cluster.kill(victim);
    let url = cluster.url(leader);
    setup_project(&url, "web", 1, 1);
    for i in 0..300 {
        let r = worker_post(
            "w1",
            &format!("{url}/api/v1/workers/w1/heartbeat"),
            json!(null),
        );
        assert!(r.is_ok(), "heartbeat {i}: {r:?}");
    }
    let status = cluster.status(leader).unwrap();
    assert!(
        status["purged"].as_u64().unwrap_or(0) > 0,
        "the leader should have purged its log behind a snapshot: {status}"
    );
    cluster.start_node(victim);
    let digest = cluster.wait_for_equal_digests(Duration::from_secs(30));
    let caught_up = cluster.status(victim).unwrap();
    assert_eq!(caught_up["digest"].as_str().unwrap(), digest);
    assert!(
        caught_up["snapshot"].as_u64().is_some(),
        "the restarted node should hold an installed snapshot: {caught_up}"
    );

    // A poller that wants no digest gets the same view without one (the digest costs the node
    // a snapshot's encoding); a bad value is refused naming the parameter.
    let url = cluster.url(victim);
    let bare = http_get(&format!("{url}/api/v1/cluster/status?digest=false")).expect("status");
    assert_eq!(bare["digest"], "", "{bare}");
    let applied = |v: &serde_json::Value| v["applied"].as_u64().unwrap_or(0);
    assert!(applied(&bare) >= applied(&caught_up), "{bare}");
    let bad = http_get(&format!("{url}/api/v1/cluster/status?digest=maybe")).unwrap_err();
    let body: serde_json::Value = bad
        .strip_prefix("400 ")
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or_else(|| panic!("not a 400 with a JSON body: {bad}"));
    assert_eq!(body["field"], "digest", "{bad}");
}

/// An idle cluster's replicated clock stays within a tick of real time (the leader proposes a
/// sweep when it is `CLOCK_TICK_MS` old), so a node that starts its cluster clock from it —
/// a follower restarted while nothing was written — starts near the cluster's time, not at
/// the last write's.
#[test]
fn an_idle_cluster_keeps_its_replicated_clock_within_a_tick() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    setup_project(&cluster.url(leader), "idle", 1, 1);
    // No writes from here on but the leader's own.
    std::thread::sleep(Duration::from_millis(
        squadron_server::clock::CLOCK_TICK_MS + 2_000,
    ));
    let wall = squadron_server::clock::wall_ms();
    for id in 1..=3 {
        let clock = cluster.status(id).unwrap()["clock_ms"].as_u64().unwrap();
        let behind = wall.saturating_sub(clock);
        assert!(
            behind <= squadron_server::clock::CLOCK_TICK_MS + 1_000,
            "node {id}'s replicated clock is {behind} ms behind real time"
        );
    }
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    cluster.kill(follower);
    cluster.start_node(follower);
    cluster.wait_for_equal_digests(Duration::from_secs(30));
    let (_, text) = http_text(&format!("{}/metrics", cluster.url(follower))).expect("metrics");
    let offset: f64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("squadron_clock_offset_seconds ")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no clock offset in /metrics:\n{text}"));
    assert!(
        offset.abs() <= (squadron_server::clock::CLOCK_TICK_MS / 1000 + 1) as f64,
        "the restarted follower's cluster clock is {offset} s off its wall clock"
    );
}

/// Every route the OpenAPI document lists is served (none answers with the router's
/// fallback), and a route it does not list is not: the document and the router come from the
/// same table and this keeps them in step.
#[test]
fn the_openapi_document_lists_the_routes_the_node_serves() {
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    let doc = http_get(&format!("{url}/api/v1/openapi.json")).expect("openapi");
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() >= 30, "only {} paths documented", paths.len());
    let mut checked = 0;
    for (path, ops) in paths {
        // Ids that exist nowhere, so no request can change anything.
        let concrete = path
            .split('/')
            .map(|seg| {
                if seg.starts_with('{') {
                    if seg.contains("name") {
                        "x"
                    } else {
                        "999999"
                    }
                } else {
                    seg
                }
            })
            .collect::<Vec<_>>()
            .join("/");
        for method in ops.as_object().expect("operations").keys() {
            let m = method.to_uppercase();
            let r = http_send(&m, &format!("{url}{concrete}"), None, None).expect("request");
            let fallback = r.status == 404 && r.body["message"] == "no such route";
            assert!(!fallback, "{m} {path} is documented but not served: {r:?}");
            assert_ne!(
                r.status, 405,
                "{m} {path} is documented but the method is not served"
            );
            checked += 1;
        }
    }
    assert!(checked >= 40, "only {checked} operations checked");
    let r = http_send("GET", &format!("{url}/api/v1/no-such-route"), None, None).expect("request");
    assert_eq!(
        (r.status, r.body["message"].as_str()),
        (404, Some("no such route"))
    );
}

/// A validator for `schema` taken from the document (its `$ref`s resolve inside the
/// document's components).
fn validator_in(
    doc: &serde_json::Value,
    schema: &serde_json::Value,
    what: &str,
) -> jsonschema::Validator {
    assert!(!schema.is_null(), "{what} has no schema");
    let root = json!({"allOf": [schema], "components": doc["components"]});
    jsonschema::validator_for(&root).unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn body_validator(doc: &serde_json::Value, path: &str, method: &str) -> jsonschema::Validator {
    let op = &doc["paths"][path][method];
    let schema = &op["requestBody"]["content"]["application/json"]["schema"];
    validator_in(doc, schema, &format!("the body of {method} {path}"))
}

fn answer_validator(doc: &serde_json::Value, path: &str, method: &str) -> jsonschema::Validator {
    let op = &doc["paths"][path][method];
    let schema = &op["responses"]["200"]["content"]["application/json"]["schema"];
    validator_in(doc, schema, &format!("the answer of {method} {path}"))
}

fn assert_meets(validator: &jsonschema::Validator, value: &serde_json::Value, what: &str) {
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "{what} does not meet its schema: {errors:?}\n{value}"
    );
}

/// Every request body in the OpenAPI document has a real schema (not a bare `object`), and
/// the node answers as the schema says: a body the schema accepts is decoded, one it refuses
/// is a 400 naming the problem. Enough for a schema-driven fuzzer to aim at the API.
#[test]
fn every_request_body_in_the_openapi_document_has_a_schema_the_node_agrees_with() {
    let cluster = Cluster::start(1);
    cluster.wait_for_leader(Duration::from_secs(20));
    let url = cluster.url(1);
    let doc = http_get(&format!("{url}/api/v1/openapi.json")).expect("openapi");
    assert_eq!(doc["openapi"], "3.1.0");
    let mut bodies = 0;
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            let schema = &op["requestBody"]["content"]["application/json"]["schema"];
            if schema.is_null() {
                continue;
            }
            let name = schema["$ref"]
                .as_str()
                .and_then(|r| r.strip_prefix("#/components/schemas/"))
                .unwrap_or_else(|| panic!("{method} {path}: the body is not a named schema"));
            let target = &doc["components"]["schemas"][name];
            let described = ["properties", "oneOf", "anyOf", "allOf"]
                .iter()
                .any(|k| target.get(*k).is_some());
            assert!(
                described,
                "{method} {path}: {name} is not described: {target}"
            );
            bodies += 1;
        }
    }
    assert!(bodies >= 30, "only {bodies} request bodies have schemas");

    let manifest = json!({
        "version": "1", "kind": "Task", "metadata": {"name": "schema-probe"},
        "repository": {"url": "/tmp/no-repo", "branch": "main"},
        "agent": {"prompt": "probe", "provider": "script", "script": "true"},
        "vm": {"runtime": "process"}
    });
    let mut wrong = manifest.clone();
    wrong["agent"]["temperature"] = json!(0.5);
    let project = json!({"tenant": "acme", "project": "web", "max_active": 2});
    let mut mistyped = project.clone();
    mistyped["max_active"] = json!("two");
    for (path, body, accepted) in [
        ("/api/v1/tasks", manifest, true),
        ("/api/v1/tasks", wrong, false),
        ("/api/v1/projects", project, true),
        ("/api/v1/projects", mistyped, false),
    ] {
        let validator = body_validator(&doc, path, "post");
        assert_eq!(
            validator.is_valid(&body),
            accepted,
            "the schema of POST {path} on {body}"
        );
        let r =
            http_send("POST", &format!("{url}{path}"), Some(body.clone()), None).expect("request");
        if accepted {
            assert_eq!(r.status, 200, "POST {path} {body}: {r:?}");
            let answers = answer_validator(&doc, path, "post");
            assert_meets(&answers, &r.body, &format!("POST {path}"));
        } else {
            assert_eq!(r.status, 400, "POST {path} {body}: {r:?}");
            assert_eq!(r.body["code"], "invalid_argument", "{r:?}");
        }
    }
    // Query parameters come from the handlers' query types: a value their schema refuses is
    // a 400 from the node too.
    let tasks = &doc["paths"]["/api/v1/tasks"]["get"]["parameters"];
    let names: Vec<&str> = tasks
        .as_array()
        .expect("parameters")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for name in ["state", "after", "limit", "parent", "consistency"] {
        assert!(
            names.contains(&name),
            "GET /api/v1/tasks lacks ?{name}: {names:?}"
        );
    }
    let consistency = tasks
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "consistency"))
        .expect("consistency parameter");
    let values = validator_in(&doc, &consistency["schema"], "?consistency");
    assert!(values.is_valid(&json!("stale")));
    assert!(!values.is_valid(&json!("eventual")));
    let r = http_send(
        "GET",
        &format!("{url}/api/v1/tasks?consistency=eventual"),
        None,
        None,
    )
    .expect("request");
    assert_eq!(r.status, 400, "{r:?}");
    let task_id = &doc["paths"]["/api/v1/tasks/{id}"]["get"]["parameters"][0];
    assert_eq!(task_id["schema"]["type"], "integer", "{task_id}");

    // Every operation documents its success, and what the node answers meets it.
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            let responses = &op["responses"];
            assert!(
                ["200", "201", "101"]
                    .iter()
                    .any(|s| responses.get(*s).is_some()),
                "{method} {path} documents no success: {responses}"
            );
        }
    }
    // A launch answers 201 and may leave its body out; a page's limit is bounded.
    let launch = &doc["paths"]["/api/v1/profiles/{id}/agent/launch"]["post"];
    assert!(launch["responses"].get("201").is_some(), "{launch}");
    assert_eq!(launch["requestBody"]["required"], false, "{launch}");
    let params = doc["paths"]["/api/v1/tasks"]["get"]["parameters"]
        .as_array()
        .expect("parameters");
    let limit = params.iter().find(|p| p["name"] == "limit").expect("limit");
    assert_eq!(limit["schema"]["minimum"], 1, "{limit}");
    assert_eq!(limit["schema"]["maximum"], 1000, "{limit}");
    for path in [
        "/api/v1/cluster/status",
        "/api/v1/tasks",
        "/api/v1/tasks/{id}",
        "/api/v1/projects",
        "/api/v1/projects/{tenant}/{project}",
        "/api/v1/workers",
        "/api/v1/audit",
        "/api/v1/tokens",
    ] {
        let concrete = path
            .replace("{id}", "1")
            .replace("{tenant}", "acme")
            .replace("{project}", "web");
        let answer = http_get(&format!("{url}{concrete}")).expect("read");
        let answers = answer_validator(&doc, path, "get");
        assert_meets(&answers, &answer, &format!("GET {concrete}"));
    }
}

/// gRPC is served by the leader only: a follower answers UNAVAILABLE with the leader's gRPC
/// address in `x-squadron-leader`, and `GrpcLeader` follows it to a working channel.
#[test]
fn a_grpc_follower_names_the_leader_and_the_client_reconnects_there() {
    use squadron_proto::v1 as pb;
    use squadron_proto::v1::worker_service_client::WorkerServiceClient;

    let cluster = Cluster::start(3);
    let leader = cluster.wait_for_leader(Duration::from_secs(30));
    let follower = *cluster
        .nodes
        .keys()
        .find(|id| **id != leader)
        .expect("a follower");
    let leader_grpc = cluster.nodes[&leader].spec.grpc.clone();
    let follower_grpc = cluster.nodes[&follower].spec.grpc.clone();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        // The gRPC listener requires a certificate: this test speaks as worker w-grpc.
        let worker = worker_credentials("w-grpc", &cluster.dir.path().join("w-grpc"));
        let connector = worker.grpc_connector().expect("tls").expect("connector");
        let channel = tonic::transport::Endpoint::from_shared(format!("https://{follower_grpc}"))
            .expect("endpoint")
            .connect_with_connector(connector)
            .await
            .expect("connect to the follower");
        let mut direct = WorkerServiceClient::new(channel);
        let refusal = direct
            .heartbeat(pb::WorkerHeartbeatRequest {
                worker: "w-grpc".into(),
            })
            .await
            .expect_err("a follower refuses");
        assert_eq!(refusal.code(), tonic::Code::Unavailable, "{refusal:?}");
        let named = squadron_client::grpc_leader::redirect_of(&refusal);
        assert_eq!(named.as_deref(), Some(leader_grpc.as_str()));

        // A client that only knows the follower follows the refusal to the leader.
        let rest = squadron_client::SquadronClient::secured(vec![cluster.url(follower)], &worker)
            .expect("client");
        let grpc = squadron_client::GrpcLeader::new(rest);
        assert!(grpc.on_error(&refusal).await, "the redirect was followed");
        let (addr, channel) = grpc.channel().await.expect("channel");
        assert_eq!(addr, leader_grpc);
        let mut client = WorkerServiceClient::new(channel);
        client
            .register(pb::RegisterWorkerRequest {
                worker: "w-grpc".into(),
                address: "http://127.0.0.1:1".into(),
                runtimes: vec!["process".into()],
                capacity: 1,
                labels: Default::default(),
                heartbeat_interval_ms: 600_000,
                policy: None,
            })
            .await
            .expect("register on the leader");
        client
            .heartbeat(pb::WorkerHeartbeatRequest {
                worker: "w-grpc".into(),
            })
            .await
            .expect("heartbeat on the leader");

        // Without a redirect in hand, discovery through any node's REST status finds it too.
        let rest = squadron_client::SquadronClient::secured(vec![cluster.url(follower)], &worker)
            .expect("client");
        let (found, _) = squadron_client::GrpcLeader::new(rest)
            .channel()
            .await
            .expect("discovered");
        assert_eq!(found, leader_grpc);
    });
}

/// A task list pages both ways: oldest first after a cursor (the default), newest first before
/// one — what the dashboard shows, so a busy cluster's newest tasks are on its first page —,
/// each bounded by the other cursor; a bad order is refused naming `order`.
#[test]
fn task_lists_page_oldest_first_and_newest_first() {
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    cluster.wait_for_leader(Duration::from_secs(20));
    // No worker runs here: the tasks stay PENDING.
    let ids: Vec<u64> = (0..5)
        .map(|i| {
            let r = submit_yaml(&url, &inert_manifest(&format!("page-{i}"), "process"));
            assert!(r.ok(), "{r:?}");
            r.body["task_submitted"]["task"].as_u64().expect("task id")
        })
        .collect();
    let page = |query: &str| -> (Vec<u64>, serde_json::Value) {
        let page = http_get(&format!("{url}/api/v1/tasks?{query}")).expect(query);
        let listed = page["tasks"]
            .as_array()
            .expect("tasks")
            .iter()
            .map(|t| t["id"].as_u64().expect("id"))
            .collect();
        (listed, page)
    };
    let (first, p) = page("order=newest&limit=2");
    assert_eq!(first, [ids[4], ids[3]], "{p}");
    assert_eq!(p["next_before"], json!(ids[3]), "{p}");
    assert!(p["next_after"].is_null(), "{p}");
    let (second, p) = page(&format!("order=newest&limit=2&before={}", ids[3]));
    assert_eq!(second, [ids[2], ids[1]], "{p}");
    let (last, p) = page(&format!("order=newest&limit=2&before={}", ids[1]));
    assert_eq!(last, [ids[0]], "{p}");
    assert!(
        p.get("next_before").is_none(),
        "the last page has no cursor: {p}"
    );
    let (bounded, _) = page(&format!("order=newest&after={}&state=PENDING", ids[1]));
    assert_eq!(bounded, [ids[4], ids[3], ids[2]]);
    let (oldest, p) = page("limit=2");
    assert_eq!(oldest, [ids[0], ids[1]], "{p}");
    assert_eq!(p["next_after"], json!(ids[1]), "{p}");
    let (window, _) = page(&format!("after={}&before={}", ids[0], ids[3]));
    assert_eq!(window, [ids[1], ids[2]]);

    let r = http_send(
        "GET",
        &format!("{url}/api/v1/tasks?order=sideways"),
        None,
        None,
    )
    .expect("request");
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.body["field"], json!("order"), "{r:?}");

    // The CLI asks the same and says how to go on.
    let out = cli(&url)
        .args([
            "--endpoint",
            &url,
            "task",
            "list",
            "--newest",
            "--limit",
            "2",
        ])
        .output()
        .expect("cli");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = text.lines().skip(1).take(2).collect();
    assert!(
        rows[0].trim_start().starts_with(&ids[4].to_string()),
        "{text}"
    );
    assert!(
        text.contains(&format!("more: --newest --before {}", ids[3])),
        "{text}"
    );
}

/// The retention of ended tasks on a real cluster: with `count_max = 2`, the leader prunes the
/// first-ended of four cancelled tasks and keeps the queued one; every node then holds the same
/// tasks and digest, answers 404 "pruned" for a pruned id (and plain "not found" for an id
/// never handed out), and still counts the pruned tasks in its metrics.
#[test]
fn ended_tasks_beyond_the_retention_count_are_pruned_on_every_node() {
    let cluster = Cluster::start_with(
        3,
        ClusterOptions {
            extra_config: "[retention.terminal_tasks]\ncount_max = 2\n",
            ..Default::default()
        },
    );
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    let url = cluster.url(leader);
    // No worker runs here: a task stays PENDING until it is cancelled, which ends it at once.
    let ids: Vec<u64> = (0..5)
        .map(|i| {
            let r = submit_yaml(&url, &inert_manifest(&format!("kept-{i}"), "process"));
            assert!(r.ok(), "{r:?}");
            r.body["task_submitted"]["task"].as_u64().expect("task id")
        })
        .collect();
    for id in &ids[..4] {
        let r = http_send("DELETE", &format!("{url}/api/v1/tasks/{id}"), None, None).unwrap();
        assert!(r.ok(), "{r:?}");
    }
    let held = |node: u64| -> Vec<u64> {
        let page = http_get(&format!("{}/api/v1/tasks", cluster.url(node))).expect("list");
        page["tasks"]
            .as_array()
            .expect("tasks")
            .iter()
            .map(|t| t["id"].as_u64().expect("id"))
            .collect()
    };
    let kept = ids[2..].to_vec();
    wait_until(Duration::from_secs(15), || held(leader) == kept)
        .unwrap_or_else(|_| panic!("held {:?}, want {kept:?}", held(leader)));
    cluster.wait_for_equal_digests(Duration::from_secs(10));
    for node in 1..=3 {
        let node_url = cluster.url(node);
        assert_eq!(held(node), kept, "node {node}");
        let r = http_send(
            "GET",
            &format!("{node_url}/api/v1/tasks/{}", ids[0]),
            None,
            None,
        )
        .unwrap();
        assert_eq!(r.status, 404, "{r:?}");
        let message = r.body["message"].as_str().unwrap_or_default();
        assert!(message.contains("pruned by the retention policy"), "{r:?}");
        let r = http_send("GET", &format!("{node_url}/api/v1/tasks/9999"), None, None).unwrap();
        assert_eq!(r.status, 404, "{r:?}");
        assert!(!r.body.to_string().contains("pruned"), "{r:?}");
        assert_eq!(metric(&node_url, "squadron_tasks_pruned_total"), 2);
        assert_eq!(
            metric(&node_url, "squadron_tasks_total{state=\"CANCELLED\"}"),
            4,
            "the pruned still count"
        );
    }
}

/// openraft 0.9 asks for a new Raft client for every leadership confirmation, so each
/// linearizable read's round on the leader once dialled every follower afresh — a TCP
/// connection and a TLS handshake per read and follower (in a release build, most of a read's
/// 1.5 ms). The peers' channels are shared now: hundreds of sequential reads open no
/// connection between the nodes (a follower's `squadron_connections_accepted_total` for its
/// peer listener).
#[test]
fn linearizable_reads_on_the_leader_reuse_the_connections_to_the_followers() {
    let cluster = Cluster::start(3);
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    let url = cluster.url(leader);
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "reads"}),
    )
    .unwrap();
    assert!(r.ok(), "{r:?}");
    let reads = 200;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let peer_connections = || {
        metric(
            &cluster.url(follower),
            "squadron_connections_accepted_total{listener=\"peer\"}",
        )
    };
    let rounds_before = metric(&url, "squadron_read_index_rounds_total");
    let before = peer_connections();
    for _ in 0..reads {
        let project = http_get(&format!("{url}/api/v1/projects/acme/reads")).expect("read");
        assert_eq!(project["max_active"], json!(4));
    }
    let opened = peer_connections() - before;
    let rounds = metric(&url, "squadron_read_index_rounds_total") - rounds_before;
    println!("{reads} reads, {rounds} read-index rounds: follower {follower} accepted {opened} peer connections");
    assert!(
        rounds >= reads,
        "each sequential read has a round of its own"
    );
    assert!(
        opened <= 2,
        "{reads} reads made the leader open {opened} connections to follower {follower}"
    );
}

/// Raft appends to a follower go on one long-lived stream (issue 18: a unary call per append
/// cost each entry two HTTP/2 streams' set-up, headers and trailers on both nodes), and a
/// stopping follower ends the stream rather than wait out the listener's shutdown grace.
#[test]
fn appends_to_a_follower_share_one_stream_that_a_stopping_follower_ends() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    let url = cluster.url(leader);
    let streamed_before = metric(&url, "squadron_raft_appends_streamed_total");
    let writes = 60;
    for i in 0..writes {
        let r = post(
            &format!("{url}/api/v1/projects"),
            json!({"tenant": "acme", "project": format!("streamed-{i}")}),
        )
        .unwrap();
        assert!(r.ok(), "{r:?}");
    }
    let opened = metric(&url, "squadron_raft_append_streams_opened_total");
    let streamed = metric(&url, "squadron_raft_appends_streamed_total") - streamed_before;
    let unary = metric(&url, "squadron_raft_appends_unary_total");
    println!(
        "{writes} writes: {streamed} appends streamed, {unary} unary, {opened} streams opened"
    );
    // Each write is an entry sent to both followers.
    assert!(
        streamed >= 2 * writes,
        "{streamed} appends streamed for {writes} writes"
    );
    // A stream is opened again only after a failure or a timeout (a slow fsync on a busy
    // machine); unary calls would open none and stream none.
    assert!(
        opened >= 2 && opened * 10 <= streamed,
        "{opened} streams opened to 2 followers for {streamed} appends: not reused"
    );

    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let took = cluster.terminate(follower);
    println!("follower {follower} stopped in {took:?}");
    assert!(
        took < Duration::from_millis(squadron_pki::tls_listener::SHUTDOWN_GRACE_MS - 1_000),
        "the follower took {took:?} to stop: its append stream held the shutdown grace"
    );
    // The other follower still makes a majority: writes go on.
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "after-stop"}),
    )
    .unwrap();
    assert!(r.ok(), "{r:?}");
}
