//! The four-lease admission through a real cluster: many concurrent clients on different nodes
//! never get more than four slots, and generations only rise.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

#[test]
fn never_more_than_four_slots_and_generations_strictly_rising() {
    let cluster = Cluster::start(3);
    let url = cluster.url(1);
    let profiles = setup_project(&url, "web", 8, 4);
    let urls = cluster.urls();
    let grants: Arc<Mutex<BTreeMap<u64, Vec<u64>>>> = Arc::default();
    let peak = Arc::new(Mutex::new(0u64));
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut clients = Vec::new();
    for c in 0..16usize {
        let (urls, grants, profiles, peak) =
            (urls.clone(), grants.clone(), profiles.clone(), peak.clone());
        clients.push(std::thread::spawn(move || {
            let mut n = c;
            while Instant::now() < deadline {
                n += 1;
                let url = &urls[n % urls.len()];
                let profile = profiles[n % profiles.len()];
                let Ok(p) = http_get(&format!("{url}/api/v1/profiles/{profile}")) else {
                    continue;
                };
                let expected = p["generation"].as_u64().unwrap();
                let Ok(r) = http_send(
                    "POST",
                    &format!("{url}/api/v1/profiles/{profile}/leases"),
                    Some(acquire_body(expected)),
                    None,
                ) else {
                    continue;
                };
                if !r.ok() {
                    let code = r.body["code"].clone();
                    assert!(
                        code == json!("conflict")
                            || code == json!("failed_precondition")
                            || code == json!("resource_exhausted")
                            || code == json!("unavailable"),
                        "unexpected refusal {r:?}"
                    );
                    continue;
                }
                let g = &r.body["lease_granted"];
                let (lease, gen) = (
                    g["lease"].as_u64().unwrap(),
                    g["generation"].as_u64().unwrap(),
                );
                assert_eq!(
                    gen,
                    expected + 1,
                    "INV-3: grant must be exactly one above the expected generation"
                );
                grants.lock().unwrap().entry(profile).or_default().push(gen);
                // While holding, the project never shows more than four slots.
                if let Ok(project) = http_get(&format!("{url}/api/v1/projects/acme/web")) {
                    let held = project["slots_held"].as_u64().unwrap();
                    assert!(held <= 4, "INV-5: {held} slots held");
                    let mut pk = peak.lock().unwrap();
                    *pk = (*pk).max(held);
                }
                std::thread::sleep(Duration::from_millis(20));
                let _ = post(
                    &format!("{url}/api/v1/leases/{lease}/release"),
                    json!({"profile": profile, "generation": gen}),
                );
            }
        }));
    }
    for c in clients {
        c.join().unwrap();
    }
    let grants = grants.lock().unwrap().clone();
    let total: usize = grants.values().map(Vec::len).sum();
    assert!(total >= 8, "too few grants to say anything ({total})");
    for (profile, gens) in &grants {
        let mut sorted = gens.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            gens.len(),
            "INV-3: profile {profile} got a generation twice: {gens:?}"
        );
    }
    assert!(*peak.lock().unwrap() <= 4);
    // The replicated project agrees: peak slots never above four.
    let project: Value = http_get(&format!("{url}/api/v1/projects/acme/web")).unwrap();
    assert!(project["stats"]["peak_slots_held"].as_u64().unwrap() <= 4);
    assert_eq!(
        project["stats"]["peak_slots_held"],
        json!(4),
        "16 clients on 8 profiles should fill all four slots"
    );
    cluster.wait_for_equal_digests(Duration::from_secs(10));
}

/// `task submit --wait` for a runtime no live worker offers says so at once, instead of
/// waiting in silence, and gives up at `--timeout` naming the state.
#[test]
fn waiting_for_a_task_no_worker_can_run_says_why() {
    let cluster = Cluster::start(1);
    cluster.wait_for_leader(Duration::from_secs(20));
    let url = cluster.url(1);
    let file = cluster.dir.path().join("docker-task.yaml");
    std::fs::write(&file, inert_manifest("nowhere", "docker")).expect("manifest");
    let out = cli(&url)
        .args([
            "--endpoint",
            &url,
            "task",
            "submit",
            "--wait",
            "--timeout",
            "2",
        ])
        .arg(&file)
        .output()
        .expect("cli");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no live worker offers the docker runtime"),
        "{stderr}"
    );
    assert!(stderr.contains("still PENDING after 2 s"), "{stderr}");
}
