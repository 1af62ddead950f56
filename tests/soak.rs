//! `squadron soak` against a real cluster and worker, one after the other: a clean soak whose
//! every cycle goes as the ADR says (four of eight launched, a graceful and a crash takeover,
//! the replaced generation's commit refused, a task completed) is leak-free; then, in a
//! two-minute soak, a cgroup leaf and a lease leaked after its first cycle are named in its
//! report as leaks, with a non-zero exit. `SQUADRON_SOAK_S` sets the clean soak's length (25 s, three cycles or so; the proof run of
//! `docs/operations.md` gives 3600), `SQUADRON_SOAK_INTERVAL` its pause between cycles (0 s;
//! the proof run's 60s) and `SQUADRON_SOAK_REPORT` keeps its report.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

const LEASE_TTL_MS: u64 = 3_000;
/// The clean soak's length unless `SQUADRON_SOAK_S` says otherwise.
const CLEAN_SOAK_S_DEFAULT: u64 = 25;
/// The leaking soak's length: the two minutes issue 20 asks of the CI soak.
const LEAKY_SOAK_S: u64 = 120;

/// Works until stopped; on SIGTERM writes a capsule and exits.
const PROVIDER: &str = r#"#!/bin/sh
trap 'printf "{\"task_state\":\"soak g%s\",\"decisions\":[],\"pending_work\":[]}" "$SQUADRON_GENERATION" > /state/capsule.json; exit 0' TERM
while :; do sleep 0.2; done
"#;

#[test]
fn a_clean_soak_is_leak_free_and_a_leaked_leaf_and_lease_are_named() {
    let (cluster, repo, worker) = script_agent_world("soak", PROVIDER, LEASE_TTL_MS, 3_000);
    let url = cluster.url(1);
    let dir = cluster.dir.path().to_path_buf();
    clean_soak(&url, &worker.id, &repo, &dir);

    // The soak's project, with room for one profile beyond its eight: the test's leak.
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "soak", "max_profiles": 9, "max_active": 4}),
    )
    .expect("project");
    assert!(r.ok(), "{r:?}");
    let r = post(
        &format!("{url}/api/v1/projects/acme/soak/profiles"),
        json!({"key": "leaky", "providers": ["codex"]}),
    )
    .expect("profile");
    assert!(r.ok(), "{r:?}");
    let leaky = r.body["profile_created"]["profile"].as_u64().expect("id");

    let report = dir.join("soak.json");
    let soak = cli(&url)
        .args([
            "--endpoint",
            &url,
            "soak",
            "--tenant",
            "acme",
            "--project",
            "soak",
        ])
        .args(["--worker", &worker.id, "--repository"])
        .arg(&repo)
        .args([
            "--duration",
            &format!("{LEAKY_SOAK_S}s"),
            "--task-runtime",
            "process",
        ])
        .args(["--interval", "0s", "--expiry-wait-ms", "20000", "--report"])
        .arg(&report)
        .arg("--processes-matching")
        .arg(&dir)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("squadron soak");
    // A failed assertion below must not leave the soak running.
    let mut soak = KillOnDrop(soak);
    let (lines_tx, lines) = mpsc::channel::<String>();
    let stderr = soak.0.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let first = wait_line(&lines, "cycle 1 ", Duration::from_secs(180));
    assert!(!first.contains("error"), "the first cycle failed: {first}");

    // Leaks: a leaf in the project's cgroup directory, a task's leaf beside the worker's
    // tenants (the process runtime's task sandbox), a worktree, and a lease nobody releases.
    let view = http_get(&format!(
        "{url}/api/v1/profiles/{}/agent",
        profile_id(&url, "soak-0")
    ))
    .expect("agent view");
    let project_cgroup = Path::new(view["cgroup"].as_str().expect("cgroup"))
        .parent()
        .expect("the project's cgroup directory");
    let leaf_dir = project_cgroup.join("leaked-by-test");
    std::fs::create_dir_all(&leaf_dir).expect("leak a cgroup leaf");
    let task_leaf = project_cgroup
        .parent()
        .and_then(Path::parent)
        .expect("the worker's cgroup directory")
        .join("task-999999-a1");
    std::fs::create_dir_all(&task_leaf).expect("leak a task's leaf");
    let worktree = worker
        .data_dir
        .join("projects/acme/soak/worktrees/leaked-by-test");
    std::fs::create_dir_all(&worktree).expect("leak a worktree");
    task_sandboxes_beyond_a_scope_are_counted_not_named(&url);
    let r = post(
        &format!("{url}/api/v1/profiles/{leaky}/leases"),
        json!({
            "expected_generation": 0, "provider": "codex",
            "holder": {"worker": worker.id, "process": "test", "cgroup": null},
            "ttl_ms": 60000
        }),
    )
    .expect("leak a lease");
    assert!(r.ok(), "{r:?}");
    let lease = r.body["lease_granted"]["lease"].as_u64().expect("lease id");

    let status = soak.0.wait().expect("soak ends");
    let progress = reader.join().expect("stderr reader");
    let _ = std::fs::remove_dir(&leaf_dir);
    let _ = std::fs::remove_dir(&task_leaf);
    let _ = std::fs::remove_dir(&worktree);
    eprintln!("{progress}");
    assert!(!status.success(), "a leaking soak passed:\n{progress}");
    let text = std::fs::read_to_string(&report).expect("the report");
    let r: Value = serde_json::from_str(&text).expect("report JSON");
    let c1 = &r["cycles"][0];
    assert_eq!(c1["errors"], json!([]), "{c1:#}");
    assert_eq!(c1["launched"], 4, "{c1:#}");
    assert_eq!(c1["refused_full"], 4, "{c1:#}");
    assert_eq!(c1["takeovers_graceful"], 1, "{c1:#}");
    assert_eq!(c1["takeovers_crash"], 1, "{c1:#}");
    assert_eq!(c1["stale_commits_refused"], 1, "{c1:#}");
    assert_eq!(c1["tasks"][0]["state"], "COMPLETED", "{c1:#}");
    assert!(
        r["cycles"].as_array().map_or(0, Vec::len) >= 2,
        "no cycle after the leak:\n{progress}"
    );
    let leaks = r["verdict"]["leaks"].as_array().expect("leaks");
    let leak = |series: &str| {
        leaks
            .iter()
            .find(|l| l["series"] == series)
            .unwrap_or_else(|| panic!("no {series} leak in {leaks:#?}\n{progress}"))
    };
    let leaf = leak("cgroup_leaves");
    assert_eq!(
        leaf["items"],
        json!([leaf_dir.display().to_string()]),
        "{leaf:#}"
    );
    assert!(leaf["first_cycle"].as_u64() >= Some(2), "{leaf:#}");
    let sandbox = leak("task_sandboxes");
    assert_eq!(
        sandbox["items"],
        json!(["process:task-999999-a1"]),
        "{sandbox:#}"
    );
    let tree = leak("worktrees");
    assert_eq!(
        tree["items"],
        json!([worktree.display().to_string()]),
        "{tree:#}"
    );
    let leased = leak("leases_not_terminal");
    assert_eq!(leased["items"], json!([lease.to_string()]), "{leased:#}");
    assert_eq!(r["verdict"]["leak_free"], false);
    drop(worker);
}

/// The worker lists every task sandbox it holds; the project's evidence names to a viewer
/// scoped to the project only its own tasks' (the leaked leaf's task 999999 is nobody's).
fn task_sandboxes_beyond_a_scope_are_counted_not_named(url: &str) {
    let evidence = format!("{url}/api/v1/projects/acme/soak/evidence");
    let leaked = |v: &Value| {
        v["worker"]["task_sandboxes"]
            .as_array()
            .unwrap_or_else(|| panic!("task sandboxes in {v:#}"))
            .iter()
            .filter(|h| h["runtime"] == "process")
            .map(|h| (h["name"].clone(), h["task"].clone()))
            .collect::<Vec<_>>()
    };
    let admin = http_get(&evidence).expect("evidence");
    assert!(
        leaked(&admin).contains(&(json!("task-999999-a1"), json!(999999))),
        "{admin:#}"
    );
    let scope = json!([{"tenant": "acme", "project": "soak"}]);
    let viewer = operator_token(url, "soak-viewer", "viewer", scope);
    let scoped: Value = agent_with(pki().operator_for(url))
        .get(&evidence)
        .set("Authorization", &format!("Bearer {viewer}"))
        .call()
        .expect("the scoped viewer's evidence")
        .into_json()
        .expect("JSON");
    let seen = leaked(&scoped);
    assert!(
        seen.contains(&(json!("hidden"), Value::Null)),
        "counted, not named: {scoped:#}"
    );
    assert!(
        !seen.iter().any(|(name, _)| name == "task-999999-a1"),
        "{scoped:#}"
    );
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A soak of its own project that must pass, every cycle as the ADR says.
fn clean_soak(url: &str, worker: &str, repo: &Path, dir: &Path) {
    let seconds = std::env::var("SQUADRON_SOAK_S")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(CLEAN_SOAK_S_DEFAULT);
    // The proof run samples once a minute (`SQUADRON_SOAK_INTERVAL=60s`); CI's minute runs
    // cycles back to back.
    let interval = std::env::var("SQUADRON_SOAK_INTERVAL").unwrap_or_else(|_| "0s".into());
    let report = dir.join("clean-soak.json");
    let out = cli(url)
        .args([
            "--endpoint",
            url,
            "soak",
            "--tenant",
            "acme",
            "--project",
            "clean",
        ])
        .args(["--worker", worker, "--repository"])
        .arg(repo)
        .args([
            "--duration",
            &format!("{seconds}s"),
            "--task-runtime",
            "process",
        ])
        .args([
            "--interval",
            &interval,
            "--expiry-wait-ms",
            "20000",
            "--measure-dir",
        ])
        .arg(dir)
        .arg("--report")
        .arg(&report)
        .arg("--plot")
        .arg(dir.join("clean-soak.svg"))
        // Only this test's node and worker: other test binaries run beside it.
        .arg("--processes-matching")
        .arg(dir)
        .output()
        .expect("squadron soak");
    let progress = String::from_utf8_lossy(&out.stderr);
    eprintln!("{progress}{}", String::from_utf8_lossy(&out.stdout));
    let text = std::fs::read_to_string(&report).expect("the clean soak's report");
    if let Ok(keep) = std::env::var("SQUADRON_SOAK_REPORT") {
        std::fs::write(&keep, &text).expect("keep the report");
    }
    assert!(out.status.success(), "the clean soak failed:\n{progress}");
    let r: Value = serde_json::from_str(&text).expect("report JSON");
    assert_eq!(r["verdict"]["leak_free"], true, "{:#}", r["verdict"]);
    let cycles = r["cycles"].as_array().expect("cycles");
    assert!(cycles.len() >= 2, "{progress}");
    for c in cycles {
        assert_eq!(c["errors"], json!([]), "{c:#}");
        assert_eq!(
            (
                &c["launched"],
                &c["takeovers_graceful"],
                &c["takeovers_crash"]
            ),
            (&json!(4), &json!(1), &json!(1)),
            "{c:#}"
        );
        assert_eq!(c["stale_commits_refused"], 1, "{c:#}");
    }
    let last = r["samples"]
        .as_array()
        .and_then(|s| s.last())
        .expect("samples");
    let roles: Vec<&str> = last["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(|p| p["role"].as_str())
        .collect();
    assert!(
        roles.contains(&"server") && roles.contains(&"worker"),
        "the node and the worker are sampled: {roles:?}"
    );
    // The plot: a line per long-lived process (the node, the worker) for its memory and one
    // for its open files, and one per count the report holds; the node's has a point per
    // sample.
    let svg = std::fs::read_to_string(dir.join("clean-soak.svg")).expect("the plot");
    let processes: std::collections::BTreeSet<(String, u64)> = r["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .flat_map(|s| s["processes"].as_array().cloned().unwrap_or_default())
        .filter(|p| ["server", "dev", "worker"].contains(&p["role"].as_str().unwrap_or("")))
        .map(|p| (p["role"].to_string(), p["pid"].as_u64().unwrap_or(0)))
        .collect();
    let counts = last["counts"].as_object().map_or(0, |c| c.len());
    assert!(processes.len() >= 2, "{processes:?}");
    assert_eq!(
        svg.matches("<polyline ").count(),
        2 * processes.len().min(12) + counts.min(12),
        "{svg}"
    );
    let first_line = svg
        .split("<polyline points=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_default();
    assert_eq!(
        first_line.split(' ').count(),
        r["samples"].as_array().map_or(0, Vec::len),
        "{svg}"
    );
    evidence_with(url, &report, &r);
}

/// The evidence embeds the report and decides the soak's claim from it (short of a day, it
/// fails, saying so); a report whose verdict was edited is refused.
fn evidence_with(url: &str, report: &Path, soaked: &Value) {
    let evidence = |path: &Path| {
        cli(url)
            .args(["--endpoint", url, "--output", "json", "evidence"])
            .args(["--tenant", "acme", "--project", "clean", "--soak-report"])
            .arg(path)
            .output()
            .expect("squadron evidence")
    };
    let out = evidence(report);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ev: Value = serde_json::from_slice(&out.stdout).expect("evidence JSON");
    let claim = ev["verdicts"]
        .as_array()
        .expect("verdicts")
        .iter()
        .find(|v| v["claim"] == "leak-free 24-hour soak")
        .cloned()
        .unwrap_or_else(|| panic!("no soak claim: {ev:#}"));
    // Short of a day, and only for that: no leak, no failed cycle (the proof run's hour too).
    assert_eq!(claim["pass"], false, "{claim:#}");
    let figure = claim["figure"].as_str().unwrap_or_default();
    let hours: f64 = figure
        .strip_prefix("duration = ")
        .and_then(|f| f.split(' ').next())
        .and_then(|h| h.parse().ok())
        .unwrap_or_else(|| panic!("no duration in {claim:#}"));
    assert!(
        hours < 24.0 && figure.contains("leaks = 0") && figure.contains("failed cycles = 0"),
        "{claim:#}"
    );
    assert_eq!(ev["soak"]["verdict"], soaked["verdict"]);
    let mut edited = soaked.clone();
    edited["verdict"]["leaks"] = json!([{"series": "made up", "baseline": 0, "found_max": 1,
        "first_cycle": 1, "cycles": 1, "items": []}]);
    let path = report.with_extension("edited.json");
    std::fs::write(&path, edited.to_string()).expect("edited report");
    let out = evidence(&path);
    assert!(!out.status.success(), "an edited soak report was embedded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not follow from its samples"), "{err}");
}

fn wait_line(lines: &mpsc::Receiver<String>, prefix: &str, timeout: Duration) -> String {
    let deadline = std::time::Instant::now() + timeout;
    let mut seen = String::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) if line.starts_with(prefix) => return line,
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
            }
            Err(_) => break,
        }
    }
    panic!("no line starting {prefix:?} within {timeout:?}:\n{seen}");
}

fn profile_id(url: &str, key: &str) -> u64 {
    let profiles =
        http_get(&format!("{url}/api/v1/projects/acme/soak/profiles")).expect("profiles");
    profiles
        .as_array()
        .expect("a list")
        .iter()
        .find(|p| p["key"] == key)
        .and_then(|p| p["id"].as_u64())
        .unwrap_or_else(|| panic!("no profile {key} in {profiles:#}"))
}
