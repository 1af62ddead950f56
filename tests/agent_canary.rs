//! ADR-0011's canary on one machine, end to end: a 3-node cluster, one worker, one project
//! with 8 profiles sharing one sandbox.
//!
//! - 4 providers launched, more attempted at the same time: never more than 4 processes;
//! - a graceful takeover from "codex" to "claude" carries the capsule the old provider
//!   wrote on SIGTERM;
//! - a crash takeover after kill -9, with reap evidence (`populated 0`);
//! - a stale generation's commit through the Git broker is refused and writes nothing;
//! - every roster delta reaches the running profiles' mailboxes;
//! - an unauthorized MCP check is answered 403, a missing required skill denies a launch;
//! - at the end no lease holds a slot and no cgroup is left;
//! - `squadron evidence` reports all of it.
//!
//! The providers are shell scripts registered as "codex" and "claude" (`--provider-script`).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use squadron_client::{
    AgentStatus, ClientError, Consistency, LaunchAgent, SandboxRepository, StopAgent,
    TakeoverAgent, TakeoverKind,
};
use squadron_core::ids::{McpServerId, ProfileId};
use squadron_core::provider::Provider;
use squadron_isolation::{CommitOutcome, CommitRequest, GitBrokerClient, RefusalCode};
use support::*;

const LEASE_TTL_MS: u64 = 3_000;

/// Prints where it runs, shows the capsule it resumed from, writes a capsule on SIGTERM,
/// commits `notes.txt` through the broker, then works until stopped.
const PROVIDER: &str = r#"#!/bin/sh
name="$SQUADRON_PROVIDER"
gen="$SQUADRON_GENERATION"
echo "provider $name generation $gen of profile $SQUADRON_PROFILE_ID started"
if [ -f /mnt/run/capsule.json ]; then echo "resumed from capsule:"; cat /mnt/run/capsule.json; echo; fi
trap 'printf "{\"task_state\":\"handoff from %s g%s\",\"decisions\":[\"keep the notes\"],\"pending_work\":[\"finish\"]}" "$name" "$gen" > /state/capsule.json; echo "capsule written"; exit 0' TERM
echo "generation $gen ($name)" >> /workspace/notes.txt
python3 - > /state/commit-g$gen.json 2>&1 <<'PY'
import json, os, socket
def ask(req):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["SQUADRON_BROKER_SOCKET"])
    s.sendall((json.dumps(req) + "\n").encode())
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return json.loads(data)
fence = {"profile": int(os.environ["SQUADRON_PROFILE_ID"]),
         "lease": int(os.environ["SQUADRON_LEASE_ID"]),
         "generation": int(os.environ["SQUADRON_GENERATION"])}
head = ask(dict(op="head", **fence))
print(json.dumps(ask(dict(op="commit", expected_head=head.get("head"), paths=["notes.txt"],
    message="notes of generation %d" % fence["generation"],
    idempotency_key="notes-g%d" % fence["generation"], **fence))))
PY
while :; do sleep 0.2; done
"#;

fn api_code(e: &ClientError) -> (u16, String) {
    match e {
        ClientError::Api { status, body, .. } => (*status, body.code.as_str().to_owned()),
        other => panic!("expected an API error, got {other}"),
    }
}

struct Canary {
    worker: WorkerProc,
    sandbox: PathBuf,
}

impl Canary {
    fn state(&self, key: &str) -> PathBuf {
        self.sandbox.join("state").join(key)
    }
    fn worktree(&self, key: &str) -> PathBuf {
        self.sandbox.join("worktrees").join(key)
    }
    fn run_dir(&self, key: &str, generation: u64) -> PathBuf {
        self.sandbox
            .join("run")
            .join(key)
            .join(format!("g{generation}"))
    }
    fn log(&self, key: &str, generation: u64) -> String {
        std::fs::read_to_string(
            self.state(key)
                .join("logs")
                .join(format!("g{generation}.stdout.log")),
        )
        .unwrap_or_default()
    }
}

fn wait_file_containing(path: &Path, needle: &str, what: &str) -> String {
    let mut last = String::new();
    let found = wait_until(Duration::from_secs(30), || {
        last = std::fs::read_to_string(path).unwrap_or_default();
        last.contains(needle)
    });
    assert!(
        found.is_ok(),
        "{what}: {} never contained {needle:?}; last: {last}",
        path.display()
    );
    last
}

/// A cluster of `nodes`, a git repository to clone, and a worker that runs the test provider
/// as both "codex" and "claude" with a short lease TTL (plus `extra` worker flags).
fn agent_world(nodes: u64, worker_prefix: &str, extra: &[&str]) -> (Cluster, PathBuf, WorkerProc) {
    let cluster = Cluster::start(nodes);
    cluster.wait_for_leader(Duration::from_secs(30));
    let dir = cluster.dir.path().to_path_buf();
    let repo = git_repo(&dir);
    let script = dir.join("provider.sh");
    std::fs::write(&script, PROVIDER).expect("provider script");
    let mut args = vec![
        "--provider-script".to_string(),
        format!("codex={}", script.display()),
        "--provider-script".into(),
        format!("claude={}", script.display()),
        "--agent-lease-ttl-ms".into(),
        LEASE_TTL_MS.to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let worker = WorkerProc::start_with(
        &dir,
        &unique_worker_id(worker_prefix),
        cluster.urls(),
        "process",
        args,
    );
    (cluster, repo, worker)
}

#[test]
fn eight_profiles_share_one_sandbox_with_at_most_four_writers_and_survive_takeovers() {
    let (mut cluster, repo, worker) = agent_world(
        3,
        "canary",
        &[
            "--agent-stop-grace-ms",
            "3000",
            "--skills",
            "review",
            // Offered, never reached: the canary's MCP checks go to the control plane.
            "--mcp-server",
            "github=http://127.0.0.1:9/mcp",
        ],
    );
    let urls = cluster.urls();
    let url = cluster.url(1);
    let sandbox = worker
        .data_dir
        .canonicalize()
        .expect("data dir")
        .join("projects/acme/canary");
    let mut canary = Canary { worker, sandbox };

    // One project, 8 profiles preferring codex, falling back to claude.
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "canary", "max_profiles": 8, "max_active": 4}),
    )
    .expect("project");
    assert!(r.ok(), "{r:?}");
    let ids: Vec<ProfileId> = (0..8)
        .map(|i| {
            let r = post(
                &format!("{url}/api/v1/projects/acme/canary/profiles"),
                json!({"key": format!("agent-{i}"), "providers": ["codex", "claude"]}),
            )
            .expect("profile");
            assert!(r.ok(), "{r:?}");
            ProfileId::new(r.body["profile_created"]["profile"].as_u64().expect("id")).expect("id")
        })
        .collect();

    let rt = rt();
    let client = client_with_timeouts(
        urls.clone(),
        Duration::from_secs(120),
        Duration::from_secs(2),
    );
    let github = McpServerId::new("github").expect("server");

    // MCP: only a relation tuple for the profile subject grants use.
    rt.block_on(client.grant_mcp(ids[0], &github, None))
        .expect("grant");
    rt.block_on(client.check_mcp(ids[0], &github, Consistency::Linearizable))
        .expect("granted profile may use github");
    let denied = rt
        .block_on(client.check_mcp(ids[1], &github, Consistency::Linearizable))
        .expect_err("no relation, no use");
    assert_eq!(api_code(&denied), (403, "permission_denied".into()));

    // A required skill the worker does not offer denies the launch; nothing is granted.
    let r = http_send(
        "PUT",
        &format!("{url}/api/v1/profiles/{}/capabilities", ids[7]),
        Some(json!({"expected_version": 0, "required_skills": ["review", "deploy"]})),
        None,
    )
    .expect("manifest");
    assert!(r.ok(), "{r:?}");

    // A launch into a project without a sandbox must say how to make one.
    let err = rt
        .block_on(client.agent_launch(ids[0], &LaunchAgent::default()))
        .expect_err("no sandbox, no worker named");
    assert_eq!(api_code(&err).0, 400, "{err}");
    assert!(err.to_string().contains("worker"), "{err}");

    // The first launch makes the project's one sandbox on the worker (INV-1).
    let first = rt
        .block_on(client.agent_launch(
            ids[0],
            &LaunchAgent {
                worker: Some(
                    squadron_core::ids::WorkerId::new(canary.worker.id.clone()).expect("worker id"),
                ),
                repository: Some(SandboxRepository {
                    url: repo.display().to_string(),
                    branch: Some("main".into()),
                }),
                ..LaunchAgent::default()
            },
        ))
        .expect("first launch");
    assert_eq!(first.provider, Provider::Codex, "codex is preferred");
    assert_eq!(first.generation.get(), 1);
    assert_eq!(first.status, AgentStatus::Running);

    // The other seven at once: the capability denial, then at most 3 more slots.
    let results = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for (i, id) in ids.iter().enumerate().skip(1) {
            let (c, id) = (client.clone(), *id);
            set.spawn(async move { (i, c.agent_launch(id, &LaunchAgent::default()).await) });
        }
        let mut all = Vec::new();
        while let Some(r) = set.join_next().await {
            all.push(r.expect("join"));
        }
        all.sort_by_key(|(i, _)| *i);
        all
    });
    let mut running = vec![0usize];
    for (i, r) in &results {
        match r {
            Ok(view) => {
                assert_eq!(view.status, AgentStatus::Running);
                running.push(*i);
            }
            Err(e) if *i == 7 => {
                assert_eq!(api_code(e), (409, "failed_precondition".into()), "{e}");
                assert!(
                    e.to_string().contains("deploy"),
                    "names the missing skill: {e}"
                );
            }
            Err(e) => {
                assert_eq!(api_code(e).0, 429, "a full project refuses: {e}");
            }
        }
    }
    assert_eq!(running.len(), 4, "exactly 4 launched: {results:?}");
    let profile7 = rt
        .block_on(client.get_profile(ids[7], Consistency::Linearizable))
        .expect("profile 7");
    assert_eq!(
        profile7.generation.get(),
        0,
        "the denied launch granted nothing"
    );

    // Each provider committed its notes through the broker under its own lease.
    for &i in &running {
        let key = format!("agent-{i}");
        let answer = wait_file_containing(
            &canary.state(&key).join("commit-g1.json"),
            "\"ok\"",
            "broker commit",
        );
        assert!(answer.contains("\"ok\": true"), "{key}: {answer}");
    }
    let notes_commit = git(&canary.worktree("agent-0"), &["log", "-1", "--format=%s"]);
    assert_eq!(notes_commit, "notes of generation 1");

    // Graceful takeover of agent-0: codex → claude, carrying the capsule.
    let old = rt
        .block_on(client.agent_view(ids[0]))
        .expect("view agent-0");
    let swapped = rt
        .block_on(client.agent_takeover(
            ids[0],
            &TakeoverAgent {
                kind: TakeoverKind::Graceful,
                provider: None,
                wait_for_expiry_ms: None,
                prompt: None,
            },
        ))
        .expect("graceful takeover");
    assert_eq!(
        swapped.provider,
        Provider::Claude,
        "the takeover swaps provider"
    );
    assert_eq!(swapped.generation.get(), 2);
    assert_eq!(swapped.key, old.key, "same identity");
    assert_eq!(swapped.capsule_sequence, Some(1));
    let replaced = swapped.replaced.clone().expect("the old generation");
    assert!(!replaced.populated, "reaped with populated 0");
    assert_eq!(replaced.generation.get(), 1);
    let capsules = rt
        .block_on(client.list_capsules(ids[0], Consistency::Linearizable))
        .expect("capsules");
    assert_eq!(capsules.len(), 1);
    assert!(capsules[0].verify(), "the committed capsule verifies");
    assert_eq!(capsules[0].payload.task_state, "handoff from codex g1");
    assert_eq!(capsules[0].generation.get(), 1);
    wait_until(Duration::from_secs(20), || {
        canary.log("agent-0", 2).contains("handoff from codex g1")
    })
    .unwrap_or_else(|_| {
        panic!(
            "claude did not start from the capsule; log: {}",
            canary.log("agent-0", 2)
        )
    });
    assert!(canary.log("agent-0", 1).contains("capsule written"));

    // The stale generation's commit is refused and writes nothing (once the new
    // generation's own commit is in, so HEAD stands still).
    wait_file_containing(
        &canary.state("agent-0").join("commit-g2.json"),
        "\"ok\": true",
        "claude commits",
    );
    let head_before = git(&canary.worktree("agent-0"), &["rev-parse", "HEAD"]);
    std::fs::write(canary.worktree("agent-0").join("stale.txt"), "stale\n").expect("write");
    let socket = canary
        .worker
        .data_dir
        .join(format!("agent-sockets/p{}/git.sock", ids[0]));
    let stale = rt
        .block_on(GitBrokerClient::commit(
            &socket,
            &CommitRequest {
                profile: ids[0].get(),
                lease: old.lease.get(),
                generation: old.generation.get(),
                expected_head: Some(head_before.clone()),
                paths: vec!["stale.txt".into()],
                message: "from a fenced generation".into(),
                idempotency_key: "stale-1".into(),
            },
        ))
        .expect("broker answers");
    match stale {
        CommitOutcome::Refused(r) => assert_eq!(r.code, RefusalCode::StaleGeneration, "{r}"),
        other => panic!("a stale generation committed: {other:?}"),
    }
    assert_eq!(
        git(&canary.worktree("agent-0"), &["rev-parse", "HEAD"]),
        head_before,
        "nothing written"
    );

    // Refusals of the facade: a crash takeover of a running, renewed provider, and a body
    // with an unknown field.
    let err = rt
        .block_on(client.agent_takeover(
            ids[0],
            &TakeoverAgent {
                kind: TakeoverKind::Crash,
                provider: None,
                wait_for_expiry_ms: None,
                prompt: None,
            },
        ))
        .expect_err("crash takeover of a live provider");
    assert_eq!(api_code(&err), (409, "failed_precondition".into()), "{err}");
    let r = post(
        &format!("{url}/api/v1/profiles/{}/agent/stop", ids[0]),
        json!({"grace": 5}),
    )
    .expect("stop with a bad body");
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.body["field"], "grace", "{r:?}");
    let still = rt.block_on(client.agent_view(ids[0])).expect("view");
    assert_eq!(
        still.status,
        AgentStatus::Running,
        "bad input changed nothing"
    );

    // Crash takeover: kill -9 of every process of agent-1's generation.
    let victim = running[1];
    let victim_id = ids[victim];
    let view = rt.block_on(client.agent_view(victim_id)).expect("view");
    let procs = std::fs::read_to_string(Path::new(&view.cgroup).join("cgroup.procs"))
        .expect("cgroup.procs");
    for pid in procs.split_whitespace() {
        let _ = Command::new("kill")
            .args(["-9", pid])
            .stderr(std::process::Stdio::null())
            .status();
    }
    wait_until(Duration::from_secs(20), || {
        rt.block_on(client.agent_view(victim_id))
            .is_ok_and(|v| v.status == AgentStatus::Crashed)
    })
    .expect("the worker sees the crash");
    // Still holding its slot: the project stays full until the takeover.
    let full = rt
        .block_on(
            client.agent_launch(
                ids[results
                    .iter()
                    .find(|(_, r)| r.is_err())
                    .expect("a refused one")
                    .0],
                &LaunchAgent::default(),
            ),
        )
        .expect_err("a crashed generation keeps its slot until reaped");
    assert_eq!(api_code(&full).0, 429, "{full}");
    let crashed = rt
        .block_on(client.agent_takeover(
            victim_id,
            &TakeoverAgent {
                kind: TakeoverKind::Crash,
                provider: Some(Provider::Claude),
                wait_for_expiry_ms: Some(LEASE_TTL_MS * 4),
                prompt: None,
            },
        ))
        .expect("crash takeover");
    assert_eq!(crashed.generation.get(), 2);
    assert_eq!(crashed.provider, Provider::Claude);
    let replaced = crashed.replaced.clone().expect("evidence");
    assert!(!replaced.populated);
    assert_eq!(
        replaced.cgroup, view.cgroup,
        "evidence names the dead generation's leaf"
    );
    let victim_key = format!("agent-{victim}");
    wait_file_containing(
        &canary.state(&victim_key).join("commit-g2.json"),
        "\"ok\": true",
        "the new generation commits",
    );

    // Roster deltas: every running profile got every message of its mailbox, in order, and
    // acknowledged them.
    let running_now: Vec<(usize, u64)> = running
        .iter()
        .map(|&i| {
            let v = rt.block_on(client.agent_view(ids[i])).expect("view");
            (i, v.generation.get())
        })
        .collect();
    for (i, generation) in &running_now {
        let id = ids[*i];
        let mut mailbox = None;
        wait_until(Duration::from_secs(20), || {
            let m = rt
                .block_on(client.read_mailbox(id, Consistency::Linearizable))
                .expect("mailbox");
            let done = m.messages.is_empty() && m.acked_through + 1 == m.next_seq;
            mailbox = Some(m);
            done
        })
        .unwrap_or_else(|_| panic!("agent-{i}: mailbox not drained: {mailbox:?}"));
        let m = mailbox.expect("mailbox");
        // Each generation gets the messages that arrived while it ran.
        let text: String = (1..=*generation)
            .map(|g| {
                let file = canary
                    .run_dir(&format!("agent-{i}"), g)
                    .join("mailbox.jsonl");
                std::fs::read_to_string(file).unwrap_or_default()
            })
            .collect();
        // Delivery is at least once (a lost acknowledgement means a redelivery): one line
        // per message after removing repeats.
        let mut seqs: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).expect("json line")["seq"]
                    .as_u64()
                    .expect("seq")
            })
            .collect();
        seqs.dedup();
        assert!(!seqs.is_empty(), "agent-{i}: nothing delivered");
        assert_eq!(seqs[0], 1, "agent-{i}: the first message was not delivered");
        assert_eq!(*seqs.last().expect("last"), m.acked_through, "agent-{i}");
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "agent-{i}: gaps {seqs:?}"
        );
        assert!(text.contains("roster_delta"), "agent-{i}: {text}");
    }

    // Stop everything; the project ends with no slot held and no cgroup left.
    for &i in &running {
        let v = rt
            .block_on(client.agent_stop(ids[i], &StopAgent::default()))
            .expect("stop");
        assert_eq!(v.status, AgentStatus::Stopped, "agent-{i}");
    }

    let key = cluster.dir.path().join("evidence.key");
    let bundle = cluster.dir.path().join("evidence.json");
    let keygen = cli(&url)
        .args(["evidence", "keygen", "--out"])
        .arg(&key)
        .output()
        .expect("squadron evidence keygen");
    assert!(keygen.status.success(), "{keygen:?}");
    let out = cli(&url)
        .args(["--endpoint", &url, "--output", "json", "evidence"])
        .args(["--tenant", "acme", "--project", "canary", "--sign"])
        .arg(&key)
        .arg("--bundle")
        .arg(&bundle)
        .output()
        .expect("squadron evidence");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ev: Value = serde_json::from_slice(&out.stdout).expect("evidence json");
    // Every claim of the ADR's gate holds, each with its figure, and the bundle says so under
    // its signature; an edited bundle does not verify.
    let failed: Vec<&Value> = ev["verdicts"]
        .as_array()
        .expect("verdicts")
        .iter()
        .filter(|v| v["pass"] != true)
        .collect();
    assert!(failed.is_empty(), "failed claims: {failed:#?}");
    assert_eq!(
        ev["binary_sha256"].as_str().map(str::len),
        Some(64),
        "{ev:#}"
    );
    // Each of the 3 nodes, the worker and the binary that gathered the evidence have the
    // digest of the one build they all are.
    let digests = ev["build_digests"].as_array().expect("build digests");
    assert_eq!(digests.len(), 5, "{ev:#}");
    assert_eq!(digests[4]["member"], "evidence binary", "{ev:#}");
    assert!(
        digests.iter().all(|d| d["sha256"] == ev["binary_sha256"]),
        "{ev:#}"
    );
    let verify = |path: &std::path::Path| {
        cli(&url)
            .args(["evidence", "verify"])
            .arg(path)
            .arg("--key")
            .arg(key.with_extension("pub"))
            .output()
            .expect("squadron evidence verify")
    };
    let verified = verify(&bundle);
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stderr)
    );
    let edited = cluster.dir.path().join("edited.json");
    let text = std::fs::read_to_string(&bundle).expect("bundle");
    std::fs::write(
        &edited,
        text.replacen("takeovers_crash\\\":1", "takeovers_crash\\\":2", 1),
    )
    .expect("edited bundle");
    assert_ne!(
        std::fs::read_to_string(&edited).unwrap(),
        text,
        "the edit took"
    );
    // A signing key others can read is refused, and nothing is signed with it.
    let loose = cluster.dir.path().join("loose.key");
    std::fs::copy(&key, &loose).expect("copy key");
    std::fs::set_permissions(&loose, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("chmod");
    let loose_bundle = cluster.dir.path().join("loose.json");
    let signed = cli(&url)
        .args([
            "--endpoint",
            &url,
            "evidence",
            "--tenant",
            "acme",
            "--project",
            "canary",
        ])
        .arg("--sign")
        .arg(&loose)
        .arg("--bundle")
        .arg(&loose_bundle)
        .output()
        .expect("squadron evidence");
    assert!(!signed.status.success(), "a world-readable key signed");
    assert!(
        String::from_utf8_lossy(&signed.stderr).contains("chmod 600"),
        "{}",
        String::from_utf8_lossy(&signed.stderr)
    );
    assert!(!loose_bundle.exists());
    let refused = verify(&edited);
    assert!(!refused.status.success(), "an edited bundle verified");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("signature"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(ev["profiles"], 8, "{ev:#}");
    assert_eq!(ev["peak_slots_held"], 4, "{ev:#}");
    assert_eq!(ev["slots_held_now"], 0, "{ev:#}");
    assert_eq!(ev["takeovers_graceful"], 1, "{ev:#}");
    assert_eq!(ev["takeovers_crash"], 1, "{ev:#}");
    assert_eq!(ev["leases_not_terminal"], json!([]), "{ev:#}");
    assert!(ev["unauthorized_mcp_denied"].as_u64() >= Some(1), "{ev:#}");
    assert!(ev["roster_deltas_posted"].as_u64() > Some(0), "{ev:#}");
    let w = &ev["worker"];
    assert_eq!(w["sandboxes"], 1, "{ev:#}");
    let peak = w["peak_concurrent_processes"].as_u64().expect("peak");
    assert!((1..=4).contains(&peak), "peak processes {peak}: {ev:#}");
    assert_eq!(w["processes_now"], 0, "{ev:#}");
    assert_eq!(
        w["broker"]["accepted_from_non_current"], 0,
        "no dual writers: {ev:#}"
    );
    assert!(
        w["broker"]["refused_stale_generation"].as_u64() >= Some(1),
        "{ev:#}"
    );
    assert!(
        w["broker"]["commits_accepted"].as_u64() >= Some(5),
        "{ev:#}"
    );
    assert!(w["roster_deltas_delivered"].as_u64() > Some(0), "{ev:#}");
    assert_eq!(w["cgroup_leaves_left"], json!([]), "{ev:#}");
    assert_eq!(w["credential_files_left"], json!([]), "{ev:#}");

    // The counters outlive the processes that counted them: kill -9 of the worker and of
    // every node, a restart, and the evidence reports the same figures (issue 20).
    canary.worker.kill();
    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.start_node(id);
    }
    cluster.wait_for_leader(Duration::from_secs(30));
    canary.worker.spawn();
    let again = cli(&url)
        .args(["--endpoint", &url, "--output", "json", "evidence"])
        .args(["--tenant", "acme", "--project", "canary"])
        .output()
        .expect("squadron evidence");
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let after: Value = serde_json::from_slice(&again.stdout).expect("evidence json");
    for figure in [
        "/unauthorized_mcp_denied",
        "/worker/peak_concurrent_processes",
        "/worker/mailbox_messages_delivered",
        "/worker/roster_deltas_delivered",
        "/worker/self_fenced",
        "/worker/broker/commits_accepted",
        "/worker/broker/refused_stale_generation",
        "/worker/broker/accepted_from_non_current",
    ] {
        assert_eq!(
            after.pointer(figure),
            ev.pointer(figure),
            "{figure} changed across the restarts: {after:#}"
        );
    }

    // The audit names the operator who asked for each relayed operation, beside the worker
    // that then acted: a launch, both takeovers and the stop of agent-0.
    let mut records: Vec<Value> = Vec::new();
    let mut after = 0;
    loop {
        let page =
            http_get(&format!("{url}/api/v1/audit?limit=1000&after={after}")).expect("audit");
        records.extend(page["records"].as_array().expect("records").iter().cloned());
        match page["next_after"].as_u64() {
            Some(next) => after = next,
            None => break,
        }
    }
    let asked: Vec<&Value> = records
        .iter()
        .filter(|r| r["command"] == "request_agent_operation")
        .collect();
    let by_operator = |target: &str| {
        asked.iter().any(|r| {
            r["target"].as_str().is_some_and(|t| t.starts_with(target))
                && r["subject"].to_string().contains("operator")
        })
    };
    for (profile, op) in [
        (ids[0], "launch"),
        (ids[0], "stop"),
        (victim_id, "takeover"),
    ] {
        let target = format!("profile {profile}: {op} on worker");
        assert!(by_operator(&target), "no operator's {target}: {asked:#?}");
    }
    let acted_by_worker = records
        .iter()
        .any(|r| r["command"] == "acquire_lease" && r["subject"].to_string().contains("worker"));
    assert!(
        acted_by_worker,
        "the worker's acquires are its own: {records:#?}"
    );
}

/// The worker dies (kill -9) while its provider runs: the provider stops itself once the
/// lease could not have been renewed (self-fencing), the operator facade answers that the
/// worker is unreachable, and the restarted worker adopts the dead generation, proves it
/// empty and takes the profile over.
#[test]
fn a_provider_whose_worker_dies_fences_itself_and_the_restarted_worker_takes_over() {
    let (cluster, repo, mut worker) = agent_world(1, "selffence", &[]);
    let urls = cluster.urls();
    let url = cluster.url(1);
    let worker_id = worker.id.clone();
    let id = project_with_a_profile(&url, "solo", "lonely");
    let rt = rt();
    let client = client_with_timeouts(urls, Duration::from_secs(120), Duration::from_secs(2));
    let launched = rt
        .block_on(client.agent_launch(
            id,
            &LaunchAgent {
                worker: Some(squadron_core::ids::WorkerId::new(worker_id.clone()).expect("id")),
                repository: Some(SandboxRepository {
                    url: repo.display().to_string(),
                    branch: None,
                }),
                ..LaunchAgent::default()
            },
        ))
        .expect("launch");
    let sandbox = worker
        .data_dir
        .canonicalize()
        .expect("data dir")
        .join("projects/acme/solo");
    wait_file_containing(
        &sandbox.join("state/lonely/commit-g1.json"),
        "\"ok\": true",
        "first commit",
    );

    worker.kill();
    let leaf = PathBuf::from(&launched.cgroup);
    let events = leaf.join("cgroup.events");
    wait_until(Duration::from_secs(LEASE_TTL_MS / 1000 + 10), || {
        std::fs::read_to_string(&events).is_ok_and(|e| e.contains("populated 0"))
    })
    .expect("the provider stopped itself after its deadline");
    let stderr = std::fs::read_to_string(sandbox.join("state/lonely/logs/g1.stderr.log"))
        .unwrap_or_default();
    assert!(
        stderr.contains("was not renewed"),
        "the watchdog said why: {stderr}"
    );
    let unreachable = rt
        .block_on(client.agent_view(id))
        .expect_err("the worker is down");
    assert_eq!(api_code(&unreachable).0, 503, "{unreachable}");

    worker.spawn();
    wait_until(Duration::from_secs(20), || {
        rt.block_on(client.agent_view(id))
            .is_ok_and(|v| v.status == AgentStatus::Crashed && v.generation.get() == 1)
    })
    .expect("the restarted worker adopts the dead generation");
    let next = rt
        .block_on(client.agent_takeover(
            id,
            &TakeoverAgent {
                kind: TakeoverKind::Crash,
                provider: None,
                wait_for_expiry_ms: Some(LEASE_TTL_MS * 4),
                prompt: None,
            },
        ))
        .expect("crash takeover");
    assert_eq!(next.generation.get(), 2);
    // The dead generation's lease ended with evidence for its own leaf, whether the
    // takeover carried it or the restarted worker recorded it first.
    let old_lease = rt
        .block_on(client.get_lease(launched.lease, Consistency::Linearizable))
        .expect("old lease");
    match &old_lease.state {
        squadron_core::lease::LeaseState::Reaped { evidence, .. } => {
            assert!(!evidence.populated);
            assert_eq!(evidence.cgroup, launched.cgroup);
        }
        other => panic!("generation 1 not reaped: {other:?}"),
    }
    if let Some(ev) = &next.replaced {
        assert!(!ev.populated);
        assert_eq!(ev.cgroup, launched.cgroup);
    }
    wait_file_containing(
        &sandbox.join("state/lonely/commit-g2.json"),
        "\"ok\": true",
        "the next generation commits",
    );
    rt.block_on(client.agent_stop(id, &StopAgent::default()))
        .expect("stop");
    let e = rt
        .block_on(client.project_evidence(
            &"acme".parse().expect("tenant"),
            &"solo".parse().expect("project"),
        ))
        .expect("evidence");
    assert_eq!(e.takeovers_crash, 1);
    assert!(e.leases_not_terminal.is_empty(), "{e:?}");
    let w = e.worker.expect("worker evidence");
    assert!(w.cgroup_leaves_left.is_empty(), "{w:?}");
    assert_eq!(w.broker.accepted_from_non_current, 0);
}

/// The "one build" claim covers every live worker of the cluster, not only the sandbox's: a
/// real worker answers with the digest of the same binary, and one that does not answer fails
/// the claim by name.
#[test]
fn every_live_worker_s_build_is_part_of_the_one_build_claim() {
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    let worker = WorkerProc::start(
        cluster.dir.path(),
        &unique_worker_id("w-build"),
        cluster.urls(),
        "process",
    );
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "builds"}),
    )
    .expect("project");
    assert!(r.ok(), "{r:?}");
    let evidence = || {
        let out = cli(&url)
            .args(["--endpoint", &url, "--output", "json", "evidence"])
            .args(["--tenant", "acme", "--project", "builds"])
            .output()
            .expect("squadron evidence");
        let ev: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        let claim = ev["verdicts"]
            .as_array()
            .expect("verdicts")
            .iter()
            .find(|v| v["claim"] == "one build")
            .cloned()
            .expect("the one-build claim");
        (ev, claim)
    };
    let member = format!("worker {}", worker.id);
    let (ev, claim) = evidence();
    let digests = ev["build_digests"].as_array().expect("digests");
    let of_worker: Vec<&Value> = digests.iter().filter(|d| d["member"] == member).collect();
    assert_eq!(of_worker.len(), 1, "{ev:#}");
    assert_eq!(of_worker[0]["sha256"], ev["binary_sha256"], "{ev:#}");
    assert_eq!(claim["pass"], true, "{claim:#}");

    // A worker registered (live for its long heartbeat interval) but answering nothing.
    let r = worker_post(
        "w-silent",
        &format!("{url}/api/v1/workers"),
        json!({
            "worker": "w-silent", "address": "127.0.0.1:1", "runtimes": ["process"],
            "capacity": 1, "heartbeat_interval_ms": 600000
        }),
    )
    .expect("register");
    assert!(r.ok(), "{r:?}");
    let (ev, claim) = evidence();
    assert_eq!(claim["pass"], false, "{claim:#}");
    assert!(
        claim["figure"]
            .as_str()
            .is_some_and(|f| f.contains("no digest from worker w-silent")),
        "{claim:#}"
    );
    assert!(
        ev["build_digests"]
            .as_array()
            .expect("digests")
            .iter()
            .any(|d| d["member"] == member && d["sha256"] == ev["binary_sha256"]),
        "{ev:#}"
    );
}

/// Waits for a `placement: project` task of the `runner` profile of `acme/{project}` to
/// complete, checks that it ran in that generation's leaf under the project's cgroup, reaped
/// (`populated 0`), and returns its patch.
fn completed_project_task(url: &str, task: u64, project: &str, generation: u64) -> String {
    let done = wait_task_state(
        url,
        task,
        &["COMPLETED", "FAILED", "CANCELLED"],
        Duration::from_secs(120),
    );
    assert_eq!(done["state"], "COMPLETED", "{done:#}");
    let (_, events) =
        http_text(&format!("{url}/api/v1/tasks/{task}/logs?stream=events")).expect("events");
    let leaf = format!("/tenant-acme/project-{project}/profile-runner-g{generation}");
    let reaped = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "reaped");
    assert!(
        reaped.as_ref().is_some_and(|e| e["populated"] == false
            && e["sandbox"].as_str().is_some_and(|s| s.ends_with(&leaf))),
        "the generation's leaf in the project's cgroup, reaped: {events}"
    );
    let (status, patch) =
        http_text(&format!("{url}/api/v1/tasks/{task}/artifacts/{task}.patch")).expect("patch");
    assert_eq!(status, 200, "{patch}");
    patch
}

/// `placement: project` with real processes: four agents hold the project's four slots, a task
/// of the project's fifth profile waits in PENDING (never a fifth process), and runs to
/// COMPLETED under that profile's lease once an agent stops and frees a slot — as a generation
/// of the profile inside the project's sandbox: in its cgroup leaf under the project's cgroup,
/// in its worktree, where its change stays. A second task of the profile runs as the next
/// generation on top of that change, and its patch holds its own change only. Each lease
/// ends with its task.
#[test]
fn a_project_task_at_full_capacity_waits_then_runs_in_its_profile_s_worktree() {
    const IDLE: &str = "#!/bin/sh\ntrap 'exit 0' TERM\nwhile :; do sleep 0.2; done\n";
    let (cluster, repo, worker) = script_agent_world("ptask", IDLE, 10_000, 2_000);
    let url = cluster.url(1);
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "crowd", "max_profiles": 5, "max_active": 4}),
    )
    .expect("project");
    assert!(r.ok(), "{r:?}");
    let profile = |key: &str, provider: &str| {
        let r = post(
            &format!("{url}/api/v1/projects/acme/crowd/profiles"),
            json!({"key": key, "providers": [provider]}),
        )
        .expect("profile");
        assert!(r.ok(), "{r:?}");
        r.body["profile_created"]["profile"].as_u64().expect("id")
    };
    let agents: Vec<u64> = (0..4).map(|i| profile(&format!("a{i}"), "codex")).collect();
    let runner = profile("runner", "script");
    for a in &agents {
        let r = post(
            &format!("{url}/api/v1/profiles/{a}/agent/launch"),
            json!({"worker": worker.id,
                   "repository": {"url": repo.display().to_string(), "branch": "main"}}),
        )
        .expect("launch");
        assert_eq!(r.status, 201, "{r:?}");
    }
    let slots = || {
        http_get(&format!("{url}/api/v1/projects/acme/crowd")).expect("project")["slots_held"]
            .as_u64()
            .expect("slots_held")
    };
    assert_eq!(slots(), 4);

    let submit = |line: &str| {
        let manifest = format!(
            "version: \"1\"\nkind: Task\nmetadata:\n  name: crowd-task\nrepository:\n  url: {}\n  \
             branch: main\nagent:\n  prompt: change the readme\n  provider: script\n  script: |\n    \
             echo '{line}' >> README.md\n    \
             echo \"cwd=$(pwd) as $SQUADRON_PROFILE_KEY g$SQUADRON_GENERATION\"\nvm:\n  \
             runtime: process\n\
             placement:\n  kind: project\n  tenant: acme\n  project: crowd\n  profile: runner\n",
            repo.display()
        );
        let r = submit_yaml(&url, &manifest);
        assert!(r.ok(), "{r:?}");
        r.body["task_submitted"]["task"].as_u64().expect("task id")
    };
    let task = submit("changed by a project task");
    // Several scheduler passes at full capacity: still PENDING, no fifth slot, no lease.
    std::thread::sleep(Duration::from_secs(4));
    let t = http_get(&format!("{url}/api/v1/tasks/{task}")).expect("task");
    assert_eq!(t["state"], "PENDING", "{t:#}");
    assert_eq!(slots(), 4);
    let p = http_get(&format!("{url}/api/v1/profiles/{runner}")).expect("runner");
    assert_eq!(
        p["generation"], 0,
        "no lease granted to the waiting task: {p:#}"
    );

    let r = post(
        &format!("{url}/api/v1/profiles/{}/agent/stop", agents[0]),
        json!({}),
    )
    .expect("stop");
    assert!(r.ok(), "{r:?}");
    let sandbox = worker
        .data_dir
        .canonicalize()
        .expect("data dir")
        .join("projects/acme/crowd");
    let worktree = sandbox.join("worktrees/runner");
    let run_task = |task: u64, generation: u64| -> String {
        let patch = completed_project_task(&url, task, "crowd", generation);
        // It ran as the runner's generation, in the runner's worktree.
        let (status, out) =
            http_text(&format!("{url}/api/v1/tasks/{task}/logs?stream=stdout")).expect("logs");
        assert_eq!(status, 200, "{out}");
        assert!(
            out.contains(&format!("cwd=/mnt/inbox as runner g{generation}")),
            "{out}"
        );
        // Its lease ended with it; the three agents still hold theirs.
        let p = http_get(&format!("{url}/api/v1/profiles/{runner}")).expect("runner");
        assert_eq!(p["generation"], generation, "{p:#}");
        assert!(p["live_lease"].is_null(), "{p:#}");
        assert_eq!(slots(), 3);
        patch
    };
    let patch = run_task(task, 1);
    assert!(patch.contains("+changed by a project task"), "{patch}");
    let readme = std::fs::read_to_string(worktree.join("README.md")).expect("worktree readme");
    assert!(
        readme.ends_with("changed by a project task\n"),
        "the change stays in the profile's worktree: {readme}"
    );

    let second = submit("a second change");
    let patch = run_task(second, 2);
    assert!(patch.contains("+a second change"), "{patch}");
    assert!(
        !patch.contains("+changed by a project task"),
        "the first task's change is the worktree the second found, not its work: {patch}"
    );
    let readme = std::fs::read_to_string(worktree.join("README.md")).expect("worktree readme");
    assert!(
        readme.ends_with("changed by a project task\na second change\n"),
        "{readme}"
    );
    drop(worker);
}

/// A `placement: project` task whose worker is killed while it runs: the generation runs on
/// in the project's cgroup, the restarted worker adopts it from its record (and measures its
/// usage there), and the task completes with the whole of its work in the patch, its generation reaped and its lease
/// released.
#[test]
fn a_project_task_survives_its_worker_s_restart() {
    const IDLE: &str = "#!/bin/sh\ntrap 'exit 0' TERM\nwhile :; do sleep 0.2; done\n";
    let (cluster, repo, mut worker) = script_agent_world("prestart", IDLE, 10_000, 2_000);
    let url = cluster.url(1);
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "steady", "max_profiles": 2, "max_active": 4}),
    )
    .expect("project");
    assert!(r.ok(), "{r:?}");
    let mut ids = Vec::new();
    for (key, provider) in [("a0", "codex"), ("runner", "script")] {
        let r = post(
            &format!("{url}/api/v1/projects/acme/steady/profiles"),
            json!({"key": key, "providers": [provider]}),
        )
        .expect("profile");
        assert!(r.ok(), "{r:?}");
        ids.push(r.body["profile_created"]["profile"].as_u64().expect("id"));
    }
    // The first launch makes the project's sandbox on this worker.
    let r = post(
        &format!("{url}/api/v1/profiles/{}/agent/launch", ids[0]),
        json!({"worker": worker.id,
               "repository": {"url": repo.display().to_string(), "branch": "main"}}),
    )
    .expect("launch");
    assert_eq!(r.status, 201, "{r:?}");
    let manifest = format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: steady-task\nrepository:\n  url: {}\n  \
         branch: main\nagent:\n  prompt: change the readme\n  provider: script\n  script: |\n    \
         echo before >> README.md\n    sleep 10\n    echo after >> README.md\nvm:\n  \
         runtime: process\nplacement:\n  kind: project\n  tenant: acme\n  project: steady\n  \
         profile: runner\n",
        repo.display()
    );
    let r = submit_yaml(&url, &manifest);
    assert!(r.ok(), "{r:?}");
    let task = r.body["task_submitted"]["task"].as_u64().expect("task id");
    wait_task_state(&url, task, &["RUNNING"], Duration::from_secs(60));
    worker.kill();
    std::thread::sleep(Duration::from_secs(1));
    worker.spawn();
    // The adopted generation's usage is its leaf's, measured by the restarted worker.
    let mut last = String::new();
    let measured = wait_until(Duration::from_secs(8), || {
        let (status, body) =
            http_text(&format!("{url}/api/v1/tasks/{task}/usage")).unwrap_or_default();
        last = format!("{status}: {body}");
        status == 200
            && serde_json::from_str::<Value>(&body)
                .is_ok_and(|u| u["usage"]["memory_bytes"].as_u64() > Some(0))
    });
    assert!(
        measured.is_ok(),
        "usage of the running project task: {last}"
    );
    let patch = completed_project_task(&url, task, "steady", 1);
    assert!(
        patch.matches("+before").count() == 1 && patch.matches("+after").count() == 1,
        "{patch}"
    );
    // Started once: the restarted worker adopted the generation, it did not run it again.
    let worktree = worker
        .data_dir
        .canonicalize()
        .expect("data dir")
        .join("projects/acme/steady/worktrees/runner");
    let readme = std::fs::read_to_string(worktree.join("README.md")).expect("readme");
    assert!(readme.ends_with("\nbefore\nafter\n"), "{readme}");
    assert_eq!(readme.matches("before").count(), 1, "{readme}");
    let (_, events) =
        http_text(&format!("{url}/api/v1/tasks/{task}/logs?stream=events")).expect("events");
    assert_eq!(
        events.matches("\"event\":\"started\"").count(),
        1,
        "{events}"
    );
    let p = http_get(&format!("{url}/api/v1/profiles/{}", ids[1])).expect("runner");
    assert_eq!(p["generation"], 1, "{p:#}");
    assert!(p["live_lease"].is_null(), "{p:#}");
    drop(worker);
}

/// An agent profile's project sandbox lives on its disk quota (issue 14): a provider that
/// writes without end meets "no space left" at `--project-disk`, so the host keeps its space,
/// and the worker names the quota when the provider ends.
#[test]
fn a_provider_that_fills_its_project_sandbox_stops_at_the_quota_named() {
    // Its own output would go to the full volume too, so the test reads what is left.
    const FILL: &str = "#!/bin/sh\nhead -c 100000000 /dev/zero > fill.bin\nexit 3\n";
    let (cluster, repo, worker) = script_agent_world_with(
        "fill",
        FILL,
        LEASE_TTL_MS,
        2_000,
        &["--project-disk", "16Mi"],
    );
    let url = cluster.url(1);
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "full", "max_profiles": 2, "max_active": 2}),
    )
    .expect("project");
    assert!(r.ok(), "{r:?}");
    let r = post(
        &format!("{url}/api/v1/projects/acme/full/profiles"),
        json!({"key": "filler", "providers": ["codex"]}),
    )
    .expect("profile");
    assert!(r.ok(), "{r:?}");
    let profile = r.body["profile_created"]["profile"].as_u64().expect("id");
    let r = post(
        &format!("{url}/api/v1/profiles/{profile}/agent/launch"),
        json!({"worker": worker.id,
               "repository": {"url": repo.display().to_string(), "branch": "main"}}),
    )
    .expect("launch");
    assert_eq!(r.status, 201, "{r:?}");

    let sandbox = worker
        .data_dir
        .canonicalize()
        .expect("data dir")
        .join("projects/acme/full");
    wait_file_containing(
        &worker.log,
        "disk quota of 16777216 bytes is used up",
        "the worker's log",
    );
    let filled = std::fs::metadata(sandbox.join("worktrees/filler/fill.bin"))
        .expect("fill.bin")
        .len();
    assert!(filled <= 16 << 20, "{filled} bytes beyond a 16 MiB quota");
}

/// A project's sandbox no longer attached to its worker does not stay there for good: with
/// `--detached-sandbox-retention 0s` the worker's sweep removes it — directory, volume image
/// and `{project}.run` — once the project is detached (never while attached), and the project
/// can then be attached there again from another repository. With the default retention it
/// stays; a launch from another repository is refused naming the field and changes nothing
/// (its worktrees may hold unpushed work), and one from the same repository finds it again.
#[test]
fn a_detached_project_sandbox_is_removed_and_the_project_attached_again_from_another_repository() {
    let (cluster, repo, swept) = agent_world(
        1,
        "detach",
        &[
            "--detached-sandbox-retention",
            "0s",
            "--detached-sweep-interval-ms",
            "200",
        ],
    );
    let url = cluster.url(1);
    let dir = cluster.dir.path().to_path_buf();
    let other = git_repo(&dir.join("other"));
    let rt = rt();
    let client = client_with_timeouts(
        cluster.urls(),
        Duration::from_secs(60),
        Duration::from_secs(2),
    );

    let id = project_with_a_profile(&url, "swept", "mover");
    launch_from(&url, id, &swept.id, &repo);
    let data = swept.data_dir.canonicalize().expect("data dir");
    let sandbox = data.join("projects/acme/swept");
    let image = data.join("volumes/projects/acme/swept.img");
    let run = data.join("volumes/projects/acme/swept.run");
    let sockets = data.join(format!("agent-sockets/p{id}"));
    assert!(sandbox.join("sandbox.json").is_file() && image.is_file() && run.is_dir());
    assert!(sockets.join("git.sock").exists(), "the broker's socket");
    // Attached: sweeps come and go and it stays.
    std::thread::sleep(Duration::from_millis(1_000));
    assert!(
        sandbox.join("sandbox.json").is_file(),
        "an attached sandbox was removed"
    );
    detach(&rt, &client, id, "swept");
    let gone = wait_until(Duration::from_secs(30), || {
        !sandbox.exists() && !image.exists() && !run.exists() && !sockets.exists()
    });
    assert!(
        gone.is_ok(),
        "the detached sandbox is still at {} (or its image, run or socket directory); worker \
         log:\n{}",
        sandbox.display(),
        std::fs::read_to_string(&swept.log).unwrap_or_default()
    );
    assert!(!data.join("projects/acme/.swept.detached").exists());
    launch_from(&url, id, &swept.id, &other);
    let record = std::fs::read_to_string(sandbox.join("sandbox.json")).expect("record");
    assert!(record.contains(&other.display().to_string()), "{record}");
    rt.block_on(client.agent_stop(id, &StopAgent::default()))
        .expect("stop");

    // The default retention keeps a detached sandbox, sweeps or not.
    let kept = WorkerProc::start_with(
        &dir,
        &unique_worker_id("keep"),
        cluster.urls(),
        "process",
        vec![
            "--provider-script".to_string(),
            format!("codex={}", dir.join("provider.sh").display()),
            "--agent-lease-ttl-ms".into(),
            LEASE_TTL_MS.to_string(),
            "--detached-sweep-interval-ms".into(),
            "200".into(),
        ],
    );
    let id = project_with_a_profile(&url, "kept", "mover");
    launch_from(&url, id, &kept.id, &repo);
    detach(&rt, &client, id, "kept");
    let data = kept.data_dir.canonicalize().expect("data dir");
    let sandbox = data.join("projects/acme/kept");
    let marker = data.join("projects/acme/.kept.detached");
    wait_until(Duration::from_secs(10), || marker.is_file()).expect("seen detached");
    std::thread::sleep(Duration::from_millis(1_000));
    assert!(
        sandbox.join("sandbox.json").is_file(),
        "kept for its retention"
    );
    let r = post(
        &format!("{url}/api/v1/profiles/{id}/agent/launch"),
        json!({"worker": kept.id,
               "repository": {"url": other.display().to_string(), "branch": "main"}}),
    )
    .expect("launch");
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.body["field"], "repository.url", "{r:?}");
    let record = std::fs::read_to_string(sandbox.join("sandbox.json")).expect("record");
    assert!(
        record.contains(&repo.display().to_string()),
        "unchanged: {record}"
    );
    launch_from(&url, id, &kept.id, &repo);
    wait_until(Duration::from_secs(10), || !marker.exists()).expect("attached again");
    rt.block_on(client.agent_stop(id, &StopAgent::default()))
        .expect("stop");
}

/// Project `acme/{project}` with one slot and one profile, `key`, running Codex; its id.
fn project_with_a_profile(url: &str, project: &str, key: &str) -> ProfileId {
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": project, "max_profiles": 1, "max_active": 1}),
    )
    .expect("project");
    assert!(r.ok(), "{r:?}");
    let r = post(
        &format!("{url}/api/v1/projects/acme/{project}/profiles"),
        json!({"key": key, "providers": ["codex"]}),
    )
    .expect("profile");
    assert!(r.ok(), "{r:?}");
    ProfileId::new(r.body["profile_created"]["profile"].as_u64().expect("id")).expect("id")
}

/// Launches the profile on `worker`, its project's sandbox cloned from `repo` if it has none.
fn launch_from(url: &str, profile: ProfileId, worker: &str, repo: &Path) {
    let r = post(
        &format!("{url}/api/v1/profiles/{profile}/agent/launch"),
        json!({"worker": worker,
               "repository": {"url": repo.display().to_string(), "branch": "main"}}),
    )
    .expect("launch");
    assert_eq!(r.status, 201, "{r:?}");
}

/// Stops the profile's agent and detaches its project's sandbox.
fn detach(
    rt: &tokio::runtime::Runtime,
    client: &squadron_client::SquadronClient,
    profile: ProfileId,
    project: &str,
) {
    rt.block_on(client.agent_stop(profile, &StopAgent::default()))
        .expect("stop");
    let (tenant, project) = (
        "acme".parse().expect("tenant"),
        project.parse().expect("project"),
    );
    let read = rt
        .block_on(client.get_project(&tenant, &project, Consistency::Linearizable))
        .expect("project");
    let sandbox_ref = read.sandbox.expect("attached").sandbox_ref;
    // The stopped generation's lease is released as the stop ends; a detach is refused
    // while a slot is held.
    let mut last = String::new();
    let detached = wait_until(Duration::from_secs(30), || {
        match rt.block_on(client.detach_sandbox(&tenant, &project, &sandbox_ref, None)) {
            Ok(_) => true,
            Err(e) => {
                last = e.to_string();
                false
            }
        }
    });
    assert!(detached.is_ok(), "detach: {last}");
}
