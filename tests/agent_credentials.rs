//! INV-13 for agent profiles, end to end: an admin names the credentials a profile is given;
//! each generation gets them as 0400 files of the sandbox user under a lease tied to its
//! runtime lease; a takeover, a stop and a revocation end the lease, and the files go with
//! the generation's reap, its logs redacted first. A real node (RocksDB on disk), a real
//! worker with bubblewrap and cgroups, a git repository made here.

mod egress_upstream;
mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use squadron_client::{
    AgentView, LaunchAgent, SandboxRepository, SquadronClient, StopAgent, TakeoverAgent,
    TakeoverKind,
};
use squadron_core::ids::{ProfileId, WorkerId};
use support::*;

const LEASE_TTL_MS: u64 = 3_000;

/// Shows how its key file looks and what it holds, then works until stopped.
const PROVIDER: &str = r#"#!/bin/sh
echo "generation $SQUADRON_GENERATION file $API_KEY_FILE"
stat -c 'mode %a uid %u' "$API_KEY_FILE"
echo "key: $(cat "$API_KEY_FILE")"
test -w "$API_KEY_FILE" && echo "the key file is writable"
trap 'exit 0' TERM
while :; do sleep 0.2; done
"#;

fn log_of(sandbox: &Path, generation: u64) -> String {
    let path = sandbox.join(format!("state/coder/logs/g{generation}.stdout.log"));
    std::fs::read_to_string(path).unwrap_or_default()
}

fn session_of(sandbox: &Path, generation: u64) -> PathBuf {
    sandbox.join(format!("run/coder/g{generation}.credentials"))
}

fn wait_log(sandbox: &Path, generation: u64, needle: &str) -> String {
    let mut last = String::new();
    let found = wait_until(Duration::from_secs(30), || {
        last = log_of(sandbox, generation);
        last.contains(needle)
    });
    assert!(
        found.is_ok(),
        "g{generation} never logged {needle:?}: {last}"
    );
    last
}

/// Project `acme/{project}` (room for two profiles, two active) and its profile `coder`.
fn project_with_coder(url: &str, project: &str, providers: Value) -> ProfileId {
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": project, "max_profiles": 2, "max_active": 2}),
    )
    .expect("project");
    assert!(r.ok(), "{r:?}");
    let r = post(
        &format!("{url}/api/v1/projects/acme/{project}/profiles"),
        json!({"key": "coder", "providers": providers}),
    )
    .expect("profile");
    ProfileId::new(r.body["profile_created"]["profile"].as_u64().expect("id")).expect("id")
}

/// The profile's first launch, on `worker`, its project sandbox `acme/{project}` cloned from
/// `repo`: the runtime and client that launched it, its view, and the sandbox's directory.
fn launch_first(
    cluster: &Cluster,
    worker: &WorkerProc,
    repo: &Path,
    profile: ProfileId,
    project: &str,
) -> (tokio::runtime::Runtime, SquadronClient, AgentView, PathBuf) {
    let rt = rt();
    let client = client_with_timeouts(
        cluster.urls(),
        Duration::from_secs(120),
        Duration::from_secs(2),
    );
    let launch = LaunchAgent {
        worker: Some(WorkerId::new(worker.id.clone()).expect("worker id")),
        repository: Some(SandboxRepository {
            url: repo.display().to_string(),
            branch: Some("main".into()),
        }),
        ..LaunchAgent::default()
    };
    let first = rt
        .block_on(client.agent_launch(profile, &launch))
        .expect("launch");
    let sandbox = worker
        .data_dir
        .canonicalize()
        .expect("data dir")
        .join(format!("projects/acme/{project}"));
    (rt, client, first, sandbox)
}

fn view(url: &str, profile: ProfileId) -> Value {
    http_get(&format!("{url}/api/v1/profiles/{profile}/credentials")).expect("credentials view")
}

/// The lease of `generation` as the view lists it.
fn lease_of(view: &Value, generation: u64) -> Value {
    view["leases"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["generation"] == generation).cloned())
        .unwrap_or_else(|| panic!("no lease of g{generation}: {view:#}"))
}

fn squadron(url: &str, args: &[&str]) -> std::process::Output {
    cli(url)
        .args(["--endpoint", url])
        .args(args)
        .output()
        .expect("squadron")
}

#[test]
fn inv_13_a_profile_s_generations_get_their_credentials_as_files_that_end_with_them() {
    let (cluster, repo, mut worker) =
        script_agent_world("agent-cred", PROVIDER, LEASE_TTL_MS, 2_000);
    let url = cluster.url(1);
    let secret = format!("sk-agent-test-{}", std::process::id() * 7919);
    put_credential(&url, "cred_agent", &secret);
    let profile = project_with_coder(&url, "creds", json!(["codex", "claude"]));
    let id = profile.to_string();

    // Naming an unknown credential is refused, naming it, and changes nothing.
    let out = squadron(
        &url,
        &[
            "profile",
            "credentials-set",
            &id,
            "--ref",
            "cred_typo=api_key",
        ],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cred_typo"),
        "{out:?}"
    );
    assert_eq!(view(&url, profile)["credential_refs"], json!([]));
    let out = squadron(
        &url,
        &[
            "profile",
            "credentials-set",
            &id,
            "--ref",
            "cred_agent=api_key",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (rt, client, first, sandbox) = launch_first(&cluster, &worker, &repo, profile, "creds");
    assert_eq!(first.generation.get(), 1);

    // The provider read its file: 0400, the sandbox user's (nobody), not writable.
    let g1 = wait_log(&sandbox, 1, "key: ");
    assert!(
        g1.contains(&format!(
            "file /run/squadron/credentials/profile-{id}-g1/api_key"
        )),
        "{g1}"
    );
    assert!(g1.contains("mode 400 uid 65534"), "{g1}");
    assert!(g1.contains(&format!("key: {secret}")), "{g1}");
    assert!(!g1.contains("writable"), "{g1}");
    assert!(session_of(&sandbox, 1).join("api_key").exists());
    assert_no_cmdline_holds(secret.as_bytes());
    let v = view(&url, profile);
    let l1 = lease_of(&v, 1);
    assert_eq!(l1["session"], format!("profile-{id}-g1"), "{v:#}");
    assert!(l1["revoked_at_ms"].is_null(), "{v:#}");
    assert!(!v.to_string().contains(&secret));

    // A takeover: generation 1's lease ends, its files go, its log is redacted; generation
    // 2 gets a lease of its own.
    let next = rt
        .block_on(client.agent_takeover(
            profile,
            &TakeoverAgent {
                kind: TakeoverKind::Graceful,
                provider: None,
                wait_for_expiry_ms: None,
                prompt: None,
            },
        ))
        .expect("takeover");
    assert_eq!(next.generation.get(), 2);
    let g2 = wait_log(&sandbox, 2, "key: ");
    assert!(
        g2.contains(&format!("credentials/profile-{id}-g2/api_key")),
        "{g2}"
    );
    let v = view(&url, profile);
    let reason = lease_of(&v, 1)["revoked_reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(reason.contains("fenced"), "{v:#}");
    assert!(lease_of(&v, 2)["revoked_at_ms"].is_null(), "{v:#}");
    assert!(
        !session_of(&sandbox, 1).exists(),
        "g1's files outlived its reap"
    );
    let g1 = log_of(&sandbox, 1);
    assert!(g1.contains("key: [REDACTED:cred_agent]"), "{g1}");
    assert!(!g1.contains(&secret), "{g1}");

    // A stop: the lease ends with the runtime lease, the files with the reap.
    rt.block_on(client.agent_stop(profile, &StopAgent { grace_ms: None }))
        .expect("stop");
    let v = view(&url, profile);
    assert!(lease_of(&v, 2)["revoked_at_ms"].is_u64(), "{v:#}");
    assert!(
        !session_of(&sandbox, 2).exists(),
        "g2's files outlived its reap"
    );

    // kill -9 of the worker while generation 3 holds the value: the provider fences itself,
    // the lease's expiry ends the credentials, and the restarted worker's crash takeover
    // reaps generation 3 — files gone, log redacted — before generation 4 gets its own.
    let third = rt
        .block_on(client.agent_launch(profile, &LaunchAgent::default()))
        .expect("launch g3");
    assert_eq!(third.generation.get(), 3);
    wait_log(&sandbox, 3, "key: ");
    worker.kill();
    let events = PathBuf::from(&third.cgroup).join("cgroup.events");
    wait_until(Duration::from_secs(LEASE_TTL_MS / 1000 + 10), || {
        std::fs::read_to_string(&events).is_ok_and(|e| e.contains("populated 0"))
    })
    .expect("the provider stopped itself after its deadline");
    wait_until(Duration::from_secs(20), || {
        lease_of(&view(&url, profile), 3)["revoked_at_ms"].is_u64()
    })
    .expect("the expiry ends generation 3's credentials");
    worker.spawn();
    let fourth = rt
        .block_on(client.agent_takeover(
            profile,
            &TakeoverAgent {
                kind: TakeoverKind::Crash,
                provider: None,
                wait_for_expiry_ms: Some(LEASE_TTL_MS * 4),
                prompt: None,
            },
        ))
        .expect("crash takeover");
    assert_eq!(fourth.generation.get(), 4);
    wait_log(&sandbox, 4, "key: ");
    assert!(
        !session_of(&sandbox, 3).exists(),
        "g3's files outlived the restart's reap"
    );
    let g3 = log_of(&sandbox, 3);
    assert!(
        g3.contains("key: [REDACTED:cred_agent]") && !g3.contains(&secret),
        "{g3}"
    );
    rt.block_on(client.agent_stop(profile, &StopAgent { grace_ms: None }))
        .expect("stop g4");
    assert!(
        !session_of(&sandbox, 4).exists(),
        "g4's files outlived its reap"
    );

    // This worker's: the other test's worker runs beside it with a tmpfs of its own.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let ours = sandbox.display().to_string();
    assert!(
        !mounts
            .lines()
            .any(|m| m.contains(&ours) && m.contains(".credentials")),
        "a credential tmpfs is still mounted: {mounts}"
    );
    assert_no_bytes_below(&worker.data_dir, secret.as_bytes(), "worker data", "");
    assert_no_bytes_below(
        cluster.dir.path(),
        secret.as_bytes(),
        "node data and logs",
        "",
    );
    let log = std::fs::read_to_string(&worker.log).unwrap_or_default();
    assert!(!log.contains(&secret), "the worker's log holds the secret");

    // Revoked: the next launch is refused naming it, and holds no slot.
    let out = squadron(&url, &["credential", "revoke", "cred_agent"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = rt
        .block_on(client.agent_launch(profile, &LaunchAgent::default()))
        .expect_err("a revoked credential refuses the launch");
    assert!(err.to_string().contains("revoked"), "{err}");
    let p = http_get(&format!("{url}/api/v1/profiles/{id}")).expect("profile");
    assert!(
        p["live_lease"].is_null(),
        "the refused launch holds a lease: {p:#}"
    );
    assert!(!session_of(&sandbox, 5).exists());
}

/// Calls the API through its base URL every 300 ms with its placeholder, and once with a
/// forged one; each answer is a line of its log.
const EGRESS_PROVIDER: &str = r#"#!/bin/sh
echo "file=${ANTHROPIC_API_KEY_FILE:-none} key=$ANTHROPIC_API_KEY"
exec python3 - <<'PY'
import os, signal, sys, time, urllib.request, urllib.error
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
base, key = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_API_KEY"]
def post(k, url=base + "/v1/messages"):
    r = urllib.request.Request(url, data=b'{"model":"m"}', method="POST",
        headers={"x-api-key": k, "content-type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=10) as a: return a.status, a.read().decode().replace("\n", " ")
    except urllib.error.HTTPError as e: return e.code, e.read().decode()
    except Exception as e: return "unreachable", str(e).replace("\n", " ")
print("forged", *post("sqd_egress_forged_0123456789abcdef"), flush=True)
r = urllib.request.Request(base + "/v1/echo", data=b"{}", method="POST", headers={"x-api-key": key})
with urllib.request.urlopen(r, timeout=10) as a:
    print("echoed", a.headers.get("x-echo"), a.read().decode().strip(), flush=True)
print("gzipped", *post(key, base + "/v1/gzip"), flush=True)
n = 0
while True:
    n += 1
    print("call", n, *post(key), flush=True)
    time.sleep(0.3)
PY
"#;

/// The numbers of the calls of `log` that were answered `status`.
fn calls_answered(log: &str, status: &str) -> Vec<u64> {
    log.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("call")).then_some(())?;
            let n = words.next()?.parse().ok()?;
            (words.next() == Some(status)).then_some(n)
        })
        .collect()
}

/// Issue 14 item 8 for agent profiles: a credential an admin injects at egress reaches its
/// upstream from a profile's generation while no process or file of the sandbox holds it; the
/// proxy listens in the generation's own namespace, refuses a forged placeholder, is served
/// again by a worker restarted under kill -9 (same placeholder), and refuses once the
/// credential is revoked.
#[test]
fn a_credential_injected_at_egress_reaches_its_upstream_from_a_profile_and_never_its_sandbox() {
    let upstream_dir = tempfile::tempdir().expect("tempdir");
    let upstream = egress_upstream::Upstream::start(upstream_dir.path());
    let ca = upstream.ca.display().to_string();
    // Long enough for the worker to come back before the provider fences itself; nothing
    // here waits for an expiry.
    let (cluster, repo, mut worker) = script_agent_world_with(
        "agent-egress",
        EGRESS_PROVIDER,
        60_000,
        2_000,
        &["--egress-ca", &ca],
    );
    let url = cluster.url(1);
    let secret = format!("sk-agent-egress-{}", std::process::id() * 7919);
    put_credential(&url, "cred_up", &secret);
    bind_to(&url, &upstream.url());
    let profile = project_with_coder(&url, "egress", json!(["claude"]));
    let id = profile.to_string();
    let out = squadron(
        &url,
        &[
            "profile",
            "credentials-set",
            &id,
            "--ref",
            "cred_up=anthropic_api_key",
        ],
    );
    assert!(out.status.success(), "{out:?}");

    let (rt, client, first, sandbox) = launch_first(&cluster, &worker, &repo, profile, "egress");
    let g1 = wait_log(&sandbox, 1, "call 1 ");
    assert!(g1.contains("file=none key=sqd_egress_"), "{g1}");
    assert!(
        g1.contains("forged 401"),
        "a forged placeholder is refused: {g1}"
    );
    assert!(
        g1.contains("call 1 200 data: one  data: two"),
        "the answer streamed back: {g1}"
    );
    // An upstream that echoes the value sends it into the sandbox scrubbed, in its header
    // and in a body that split it across two pieces.
    assert!(
        g1.contains("echoed [REDACTED:cred_up] data: got [REDACTED:cred_up] ok"),
        "{g1}"
    );
    // An upstream that compresses anyway is not relayed: the scrub could not see inside.
    assert!(g1.contains("gzipped 502 "), "{g1}");
    assert!(g1.contains("content-encoding gzip"), "{g1}");
    let requests = upstream.requests();
    assert!(!requests.is_empty());
    for got in &requests {
        let path = got["path"].as_str().unwrap_or_default();
        assert!(
            ["/api/v1/messages", "/api/v1/echo", "/api/v1/gzip"].contains(&path),
            "{got}"
        );
        assert_eq!(got["headers"]["accept-encoding"], "identity", "{got}");
        assert_eq!(got["headers"]["x-api-key"], secret, "{got}");
        assert!(!got.to_string().contains("sqd_egress_"), "{got}");
    }
    // Its processes hold the placeholder, never the value; no file of the sandbox does.
    assert_placeholder_holders_lack(secret.as_bytes(), "the sandbox");
    assert!(pids_with_env(&secret).is_empty(), "an environment holds it");
    assert_no_cmdline_holds(secret.as_bytes());
    assert_no_bytes_below(&sandbox, secret.as_bytes(), "the project sandbox", "");

    // kill -9 and back: the adopted generation's proxy is served again, accepting the
    // placeholder its provider holds (the proxy's socket was the dead worker's: without
    // the serving again, every call after the kill is refused at the connection).
    worker.kill();
    worker.spawn();
    wait_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&worker.log)
            .is_ok_and(|l| l.contains("egress injection served again"))
    })
    .expect("the adopted generation's proxy is served again");
    // A call begun after that is answered: the number of the last call made so far, plus one.
    let mut last = log_of(&sandbox, 1);
    let made = last
        .lines()
        .filter_map(|l| {
            l.strip_prefix("call ")?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap_or(0);
    wait_until(Duration::from_secs(30), || {
        last = log_of(&sandbox, 1);
        calls_answered(&last, "200").last() > Some(&made)
    })
    .unwrap_or_else(|_| panic!("no call answered after the restart: {last}"));
    assert_eq!(first.generation.get(), 1);

    // Revoked: the agent credential lease ends, and the proxy refuses from then on.
    let out = squadron(&url, &["credential", "revoke", "cred_up"]);
    assert!(out.status.success(), "{out:?}");
    wait_until(Duration::from_secs(30), || {
        last = log_of(&sandbox, 1);
        last.contains(" 403 ") && last.contains("ended: credential cred_up revoked")
    })
    .unwrap_or_else(|_| panic!("the revoked lease is still served: {last}"));
    let relayed = upstream.requests().len();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        upstream.requests().len(),
        relayed,
        "relayed after revocation"
    );

    // The stop closes the proxy with the generation's other sockets.
    rt.block_on(client.agent_stop(profile, &StopAgent { grace_ms: None }))
        .expect("stop");
    let log = std::fs::read_to_string(&worker.log).unwrap_or_default();
    let closed = format!("profile {id} generation 1");
    assert!(
        log.lines()
            .any(|l| l.contains("egress proxy closed") && l.contains(&closed)),
        "{log}"
    );
    assert!(!log.contains(&secret), "the worker's log holds the value");
    assert!(
        log.contains("egress request relayed"),
        "the relay is logged"
    );
    assert_no_bytes_below(&worker.data_dir, secret.as_bytes(), "worker data", "");
    assert_no_bytes_below(
        cluster.dir.path(),
        secret.as_bytes(),
        "node data and logs",
        "",
    );

    // Put again and bound again: the next generation is served the new value. Once its
    // lease is revoked, a restarted worker never serves that generation again, whatever the
    // credential holds by then: the value put after the revocation never leaves.
    put_credential(&url, "cred_up", &format!("{secret}-second"));
    bind_to(&url, &upstream.url());
    let second = rt
        .block_on(client.agent_launch(profile, &LaunchAgent::default()))
        .expect("launch g2");
    assert_eq!(second.generation.get(), 2);
    wait_log(&sandbox, 2, "call 1 200");
    let out = squadron(&url, &["credential", "revoke", "cred_up"]);
    assert!(out.status.success(), "{out:?}");
    wait_log(&sandbox, 2, "ended: credential cred_up revoked");
    let third = format!("{secret}-third");
    put_credential(&url, "cred_up", &third);
    bind_to(&url, &upstream.url());
    worker.kill();
    worker.spawn();
    wait_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&worker.log)
            .is_ok_and(|l| l.contains("egress injection not served again"))
    })
    .expect("the adopted generation is not served again");
    std::thread::sleep(Duration::from_secs(1));
    let log = log_of(&sandbox, 2);
    let last_call = log.lines().rev().find(|l| l.starts_with("call "));
    assert!(
        last_call.is_some_and(|l| l.contains("unreachable")),
        "{log}"
    );
    assert!(
        upstream
            .requests()
            .iter()
            .all(|r| r["headers"]["x-api-key"] != third.as_str()),
        "the value put after the revocation reached the upstream"
    );
    rt.block_on(client.agent_stop(profile, &StopAgent { grace_ms: None }))
        .expect("stop g2");
}

/// Binds `cred_up` to `upstream` in `x-api-key`.
fn bind_to(url: &str, upstream: &str) {
    let out = squadron(
        url,
        &[
            "credential",
            "egress-set",
            "cred_up",
            "--upstream",
            upstream,
            "--header",
            "x-api-key",
        ],
    );
    assert!(out.status.success(), "{out:?}");
}
