//! INV-13 for agent profiles, end to end: an admin names the credentials a profile is given;
//! each generation gets them as 0400 files of the sandbox user under a lease tied to its
//! runtime lease; a takeover, a stop and a revocation end the lease, and the files go with
//! the generation's reap, its logs redacted first. A real node (RocksDB on disk), a real
//! worker with bubblewrap and cgroups, a git repository made here.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use squadron_client::{LaunchAgent, SandboxRepository, StopAgent, TakeoverAgent, TakeoverKind};
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
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "creds", "max_profiles": 2, "max_active": 2}),
    )
    .expect("project");
    assert!(r.ok(), "{r:?}");
    let r = post(
        &format!("{url}/api/v1/projects/acme/creds/profiles"),
        json!({"key": "coder", "providers": ["codex", "claude"]}),
    )
    .expect("profile");
    let profile =
        ProfileId::new(r.body["profile_created"]["profile"].as_u64().expect("id")).expect("id");
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

    let rt = rt();
    let client = client_with_timeouts(
        cluster.urls(),
        Duration::from_secs(120),
        Duration::from_secs(2),
    );
    let first = rt
        .block_on(client.agent_launch(
            profile,
            &LaunchAgent {
                worker: Some(WorkerId::new(worker.id.clone()).expect("worker id")),
                repository: Some(SandboxRepository {
                    url: repo.display().to_string(),
                    branch: Some("main".into()),
                }),
                ..LaunchAgent::default()
            },
        ))
        .expect("launch");
    assert_eq!(first.generation.get(), 1);
    let sandbox = worker
        .data_dir
        .canonicalize()
        .expect("data dir")
        .join("projects/acme/creds");

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

    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(".credentials"),
        "a credential tmpfs is still mounted"
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

    // Injected at egress: agent generations have no proxy, so the launch is refused naming
    // the credential — never a file — and holds no slot.
    let out = squadron(
        &url,
        &[
            "credential",
            "egress-set",
            "cred_agent",
            "--upstream",
            "https://api.example.com",
            "--header",
            "x-api-key",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = rt
        .block_on(client.agent_launch(profile, &LaunchAgent::default()))
        .expect_err("a credential injected at egress refuses the launch");
    assert!(
        err.to_string().contains("cred_agent is injected at egress"),
        "{err}"
    );
    let p = http_get(&format!("{url}/api/v1/profiles/{id}")).expect("profile");
    assert!(
        p["live_lease"].is_null(),
        "the refused launch holds a lease: {p:#}"
    );
    assert!(!session_of(&sandbox, 5).exists());
    let out = squadron(&url, &["credential", "egress-clear", "cred_agent"]);
    assert!(out.status.success());

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
    assert!(!session_of(&sandbox, 6).exists());
}
