//! Agent profiles with the real CLIs (issue 16): the pinned Claude Code and Codex as a
//! profile's providers against scripted model servers, offline — launched headless with the
//! operator's prompt and the profile's credentials, carried across a graceful takeover by a
//! capsule Squadron builds from the CLI's own stream, and resumed in their own session by the
//! next generation of the same CLI, after a takeover or after a crash (kill -9 of the worker)
//! that left no handover at all; reaching an MCP server only through the worker's gateway and
//! only with the profile's grant. A real node, a real worker with bubblewrap and cgroups; the
//! model servers listen in a network namespace the test made.

mod mcp_server;
mod model_server;
mod support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use mcp_server::McpServer;

use model_server::{ModelServer, Recorded, Step, TestNet, MODEL_PORT};
use serde_json::{json, Value};
use squadron_client::{
    AgentStatus, LaunchAgent, SandboxRepository, StopAgent, TakeoverAgent, TakeoverKind,
};
use squadron_core::ids::{ProfileId, WorkerId};
use squadron_core::provider::Provider;
use squadron_isolation::{CommitOutcome, CommitRequest, GitBrokerClient, RefusalCode};
use support::*;

const TURN_TIMEOUT: Duration = Duration::from_secs(180);
/// The worker's agent lease TTL in the crash test: expiry, and so the crash takeover, comes
/// soon.
const LEASE_TTL_MS: u64 = 3_000;

/// A provider's model: the CLI, its scripted server, and the key it must present.
struct Model {
    provider: Provider,
    script: Vec<Step>,
    key: &'static str,
}

/// A one-node cluster, a process worker whose sandboxes reach the models' servers, and the
/// agent profiles of project `acme/{name}` (one, key `writer`, unless made by
/// [`Rig::start_project`]), each with a credential for each model.
struct Rig {
    servers: Vec<ModelServer>,
    url: String,
    id: u64,
    profile: ProfileId,
    sandbox: PathBuf,
    repo: PathBuf,
    client: squadron_client::SquadronClient,
    rt: tokio::runtime::Runtime,
    worker: WorkerProc,
    _cluster: Cluster,
    _net: TestNet,
}

impl Rig {
    fn start(name: &str, models: Vec<Model>, worker_args: &[&str]) -> Rig {
        Rig::start_project(name, models, worker_args, &["writer"], 1)
    }

    /// As [`Rig::start`], with a profile per key in `keys` (ids 1, 2, … in that order, each
    /// given every model's credential), at most `max_active` of them running.
    fn start_project(
        name: &str,
        models: Vec<Model>,
        worker_args: &[&str],
        keys: &[&str],
        max_active: usize,
    ) -> Rig {
        let net = TestNet::new(name);
        let cluster = Cluster::start(1);
        let url = cluster.url(1);
        let (mut servers, mut args, mut env, mut refs, mut providers) =
            (vec![], vec![], vec![], vec![], vec![]);
        for (i, m) in models.into_iter().enumerate() {
            let server = ModelServer::start(net.listen(MODEL_PORT + i as u16), m.script);
            let (var, base, mount) = match m.provider {
                Provider::Codex => (
                    "OPENAI_BASE_URL",
                    format!("{}/v1", server.url),
                    "openai_api_key",
                ),
                _ => (
                    "ANTHROPIC_BASE_URL",
                    server.url.clone(),
                    "anthropic_api_key",
                ),
            };
            let credential = format!("key-{}", m.provider);
            put_credential(&url, &credential, m.key);
            refs.push(json!({"id": credential, "mount": mount}));
            args.extend(["--env-allow".to_owned(), var.to_owned()]);
            env.push((var.to_owned(), base));
            providers.push(m.provider.to_string());
            servers.push(server);
        }
        args.extend(worker_args.iter().map(|a| a.to_string()));
        let worker = WorkerProc::start_with_env(
            cluster.dir.path(),
            &unique_worker_id(&format!("w-{name}")),
            cluster.urls(),
            "process",
            args,
            env,
        );
        let repo = git_repo(cluster.dir.path());
        let project = json!({"tenant": "acme", "project": name,
                             "max_profiles": keys.len(), "max_active": max_active});
        let r = post(&format!("{url}/api/v1/projects"), project).expect("project");
        assert!(r.ok(), "{r:?}");
        for (i, key) in keys.iter().enumerate() {
            let r = post(
                &format!("{url}/api/v1/projects/acme/{name}/profiles"),
                json!({"key": key, "providers": providers}),
            )
            .expect("profile");
            assert!(r.ok(), "{r:?}");
            assert_eq!(r.body["profile_created"]["profile"], i + 1, "{r:?}");
            let r = http_send(
                "PUT",
                &format!("{url}/api/v1/profiles/{}/credentials", i + 1),
                Some(json!({ "credential_refs": refs })),
                None,
            )
            .expect("credentials");
            assert!(r.ok(), "{r:?}");
        }
        let id = 1;
        let sandbox = worker
            .data_dir
            .canonicalize()
            .expect("data dir")
            .join(format!("projects/acme/{name}"));
        Rig {
            servers,
            url,
            id,
            profile: ProfileId::new(id).expect("id"),
            sandbox,
            repo,
            client: client_with_timeouts(
                cluster.urls(),
                Duration::from_secs(120),
                Duration::from_secs(2),
            ),
            rt: rt(),
            worker,
            _cluster: cluster,
            _net: net,
        }
    }

    /// The first launch: on this worker, in a sandbox of the test's repository.
    fn first_launch(&self, prompt: Option<&str>) -> LaunchAgent {
        LaunchAgent {
            worker: Some(WorkerId::new(self.worker.id.clone()).expect("worker id")),
            repository: Some(SandboxRepository {
                url: self.repo.display().to_string(),
                branch: Some("main".into()),
            }),
            prompt: prompt.map(String::from),
            ..LaunchAgent::default()
        }
    }

    fn launch(&self, launch: &LaunchAgent) -> squadron_client::AgentView {
        self.rt
            .block_on(self.client.agent_launch(self.profile, launch))
            .expect("launch")
    }

    fn takeover(&self, kind: TakeoverKind, provider: Option<Provider>) -> u64 {
        let next = self
            .rt
            .block_on(self.client.agent_takeover(
                self.profile,
                &TakeoverAgent {
                    kind,
                    provider,
                    wait_for_expiry_ms: Some(LEASE_TTL_MS * 10),
                    prompt: None,
                },
            ))
            .expect("takeover");
        next.generation.get()
    }

    fn log(&self, generation: u64, stream: &str) -> String {
        self.log_of("writer", generation, stream)
    }

    /// Profile `key`'s log of `generation` (`stream`: stdout or stderr).
    fn log_of(&self, key: &str, generation: u64, stream: &str) -> String {
        std::fs::read_to_string(
            self.sandbox
                .join(format!("state/{key}/logs/g{generation}.{stream}.log")),
        )
        .unwrap_or_default()
    }

    /// Waits until `server` has answered `n` requests of the CLI's loop.
    fn wait_for_turns(&self, server: usize, n: usize, generation: u64) -> Vec<Recorded> {
        let turns = || loop_requests(&self.servers[server]);
        let seen = wait_until(TURN_TIMEOUT, || turns().len() >= n);
        assert!(
            seen.is_ok(),
            "generation {generation} never reached turn {n}:\n{}\n{}",
            self.log(generation, "stdout"),
            self.log(generation, "stderr")
        );
        turns()
    }

    fn profile_view(&self) -> Value {
        http_get(&format!("{}/api/v1/profiles/{}", self.url, self.id)).unwrap_or_default()
    }

    /// Waits until the profile holds no lease (its provider exited and was released).
    fn wait_released(&self, generation: u64) {
        let released = wait_until(TURN_TIMEOUT, || self.profile_view()["live_lease"].is_null());
        assert!(
            released.is_ok(),
            "generation {generation} never finished:\n{}",
            self.log(generation, "stderr")
        );
    }

    fn capsules(&self) -> Vec<squadron_core::capsule::ContinuityCapsule> {
        self.rt
            .block_on(
                self.client
                    .list_capsules(self.profile, squadron_client::Consistency::Linearizable),
            )
            .expect("capsules")
    }

    fn assert_no_key_in_logs(&self, generations: u64, keys: &[&str]) {
        for generation in 1..=generations {
            for stream in ["stdout", "stderr"] {
                let text = self.log(generation, stream);
                for key in keys {
                    assert!(
                        !text.contains(key),
                        "g{generation}.{stream}.log holds a key"
                    );
                }
            }
        }
    }
}

/// The requests of a CLI's agent loop, either API.
fn loop_requests(server: &ModelServer) -> Vec<Recorded> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.is_main_loop() || r.path.ends_with("/responses"))
        .collect()
}

/// Whether any request holds `text` anywhere (a tool's output is nested in its result).
fn saw(turns: &[Recorded], text: &str) -> bool {
    turns.iter().any(|t| t.raw().contains(text))
}

/// An agent profile's provider is the real CLI: launched headless with the operator's
/// prompt, its key from the credential the profile is given (a file, moved into the CLI's
/// environment), it works in the profile's worktree, finishes, and its lease is released.
#[test]
fn claude_code_runs_as_an_agent_profile_s_provider() {
    const KEY: &str = "sk-ant-profile-0123456789abcdef";
    let rig = Rig::start(
        "scribes",
        vec![Model {
            provider: Provider::Claude,
            script: vec![
                Step::Tool {
                    name: "Bash",
                    input: json!({"command": "echo profile was here > notes.txt && cat notes.txt",
                                  "description": "leave a note"}),
                },
                Step::Text("Left a note."),
            ],
            key: KEY,
        }],
        &[],
    );
    // A headless CLI has nobody to ask: without a prompt (or a capsule) nothing starts.
    let err = rig
        .rt
        .block_on(
            rig.client
                .agent_launch(rig.profile, &rig.first_launch(None)),
        )
        .expect_err("no prompt");
    assert!(err.to_string().contains("prompt"), "{err}");
    let launched = rig.launch(&rig.first_launch(Some("Leave a note in notes.txt.")));
    assert_eq!(launched.generation.get(), 1);

    // It runs to its end; the exit releases the lease.
    rig.wait_released(1);
    let turns = rig.servers[0].main_loop();
    assert!(turns.len() >= 2, "{} turns: {turns:#?}", turns.len());
    assert_eq!(turns[0].header("x-api-key"), Some(KEY));
    assert!(
        saw(&turns, "Leave a note in notes.txt."),
        "the prompt never reached the model"
    );
    assert!(
        saw(&turns, "profile was here"),
        "the command's output never reached the model"
    );
    let cwd = model_server::working_directory(&turns[0].all_text());
    assert_eq!(cwd, "/workspace", "working directory");
    let note =
        std::fs::read_to_string(rig.sandbox.join("worktrees/writer/notes.txt")).expect("note");
    assert_eq!(note, "profile was here\n");
    assert!(
        rig.log(1, "stdout").contains("\"type\":\"result\""),
        "{}",
        rig.log(1, "stdout")
    );
    rig.assert_no_key_in_logs(1, &[KEY]);
    let view = http_get(&format!(
        "{}/api/v1/profiles/{}/credentials",
        rig.url, rig.id
    ))
    .expect("view");
    assert!(view["leases"][0]["revoked_at_ms"].is_u64(), "{view:#}");
    assert!(!rig.sandbox.join("run/writer/g1.credentials").exists());
}

/// Issue 16's handover with the real CLIs: Codex works as an agent profile's provider (one
/// command, then it waits on its model); a graceful takeover stops it, builds the capsule
/// from Codex's own stream — its session, the command it ran, the pending work, the branch's
/// revision —, commits it, and starts Claude Code with that capsule as its first turn.
#[test]
fn a_graceful_takeover_carries_codex_s_capsule_into_claude_s_first_turn() {
    const OPENAI_KEY: &str = "sk-openai-handover-0123456789abcdef";
    const ANTHROPIC_KEY: &str = "sk-ant-handover-0123456789abcdef";
    const PROMPT: &str = "Write the release notes in NOTES.md.";
    let rig = Rig::start(
        "handover",
        vec![
            Model {
                provider: Provider::Codex,
                script: vec![
                    Step::Tool {
                        name: "exec_command",
                        input: json!({"cmd": "echo started > started.txt"}),
                    },
                    Step::Hold,
                ],
                key: OPENAI_KEY,
            },
            Model {
                provider: Provider::Claude,
                script: vec![Step::Text("Continuing from the capsule.")],
                key: ANTHROPIC_KEY,
            },
        ],
        &["--agent-stop-grace-ms", "3000"],
    );
    let launched = rig.launch(&rig.first_launch(Some(PROMPT)));
    assert_eq!(launched.provider, Provider::Codex);
    // Codex ran its command and now waits on its model.
    rig.wait_for_turns(0, 2, 1);
    assert_eq!(
        std::fs::read_to_string(rig.sandbox.join("worktrees/writer/started.txt")).ok(),
        Some("started\n".to_owned())
    );

    assert_eq!(rig.takeover(TakeoverKind::Graceful, None), 2);

    // The committed capsule is Codex's own account.
    let capsules = rig.capsules();
    let capsule = capsules.last().expect("a capsule was committed");
    let p = &capsule.payload;
    assert!(
        p.task_state.contains("generation 1 (codex, session")
            && p.task_state.contains("stopped for a takeover"),
        "{p:?}"
    );
    assert!(
        p.task_state
            .contains("1 tool calls (last: command_execution)"),
        "{p:?}"
    );
    assert_eq!(p.pending_work, [PROMPT], "{p:?}");
    assert!(p.context_ref.starts_with("codex-session:"), "{p:?}");
    assert_eq!(p.repository_revision.len(), 40, "{p:?}");

    // Claude's first turn carried it — a swap starts a new conversation, never the other
    // CLI's —, then finished; its exit released the lease.
    let turns = rig.wait_for_turns(1, 1, 2);
    let first = &turns[0];
    assert_eq!(first.header("x-api-key"), Some(ANTHROPIC_KEY));
    let text = first.all_text();
    for part in [
        "generation 1 left this continuity capsule",
        "Pending work:\n- Write the release notes in NOTES.md.",
        &p.context_ref,
        "Continue the pending work above.",
    ] {
        assert!(
            text.contains(part),
            "{part:?} not in Claude's first turn:\n{text}"
        );
    }
    assert!(
        !text.contains("echo started"),
        "Claude was given Codex's conversation"
    );
    rig.wait_released(2);
    rig.assert_no_key_in_logs(2, &[OPENAI_KEY, ANTHROPIC_KEY]);
}

/// The same CLI resumes its own session: a graceful takeover from Codex to Codex starts
/// `codex exec resume {session}`, so generation 2's first request to the model holds
/// generation 1's whole conversation — the prompt, the command and its output — and not
/// only the capsule.
#[test]
fn a_takeover_by_the_same_cli_resumes_codex_s_own_session() {
    const KEY: &str = "sk-openai-resume-0123456789abcdef";
    const PROMPT: &str = "Count the files in the repository.";
    let rig = Rig::start(
        "resume-codex",
        vec![Model {
            provider: Provider::Codex,
            script: vec![
                Step::Tool {
                    name: "exec_command",
                    input: json!({"cmd": "echo first generation > g1.txt && cat g1.txt"}),
                },
                Step::Hold,
                Step::Text("Resumed and done."),
            ],
            key: KEY,
        }],
        &["--agent-stop-grace-ms", "3000"],
    );
    rig.launch(&rig.first_launch(Some(PROMPT)));
    rig.wait_for_turns(0, 2, 1);
    assert_eq!(
        rig.takeover(TakeoverKind::Graceful, Some(Provider::Codex)),
        2
    );
    let capsule = rig.capsules().pop().expect("a capsule");
    let session = capsule
        .payload
        .context_ref
        .strip_prefix("codex-session:")
        .expect("codex's session in the capsule")
        .to_owned();
    let script =
        std::fs::read_to_string(rig.sandbox.join("run/writer/g2/provider.sh")).expect("script");
    assert!(
        script.contains(&format!("resume {session} -")),
        "generation 2 does not resume the session:\n{script}"
    );
    let turns = rig.wait_for_turns(0, 3, 2);
    let resumed = turns.last().expect("generation 2's request").raw();
    for part in [
        PROMPT,
        "first generation",
        "generation 1 left this continuity capsule",
    ] {
        assert!(
            resumed.contains(part),
            "{part:?} not in generation 2's request:\n{resumed}"
        );
    }
    rig.wait_released(2);
    assert!(
        rig.log(2, "stdout").contains(&session),
        "generation 2 ran another session:\n{}",
        rig.log(2, "stdout")
    );
    rig.assert_no_key_in_logs(2, &[KEY]);
}

/// A crash leaves no handover: kill -9 of the worker while Claude Code waits on its model.
/// The provider fences itself at its deadline, the lease expires, and the restarted worker's
/// crash takeover starts generation 2 — which first commits generation 1's account from its
/// stream (its session, its tool call, the prompt as pending work) under its own fence, then
/// resumes Claude's own session with `--resume`: the model sees generation 1's conversation.
#[test]
fn after_a_crash_the_next_generation_commits_the_account_and_resumes_claude_s_session() {
    const KEY: &str = "sk-ant-crash-0123456789abcdef";
    const PROMPT: &str = "Write the changelog.";
    let mut rig = Rig::start(
        "resume-claude",
        vec![Model {
            provider: Provider::Claude,
            script: vec![
                Step::Tool {
                    name: "Bash",
                    input: json!({"command": "echo before the crash > crash.txt && cat crash.txt",
                                  "description": "work"}),
                },
                Step::Hold,
                Step::Text("Resumed after the crash."),
            ],
            key: KEY,
        }],
        &["--agent-lease-ttl-ms", &LEASE_TTL_MS.to_string()],
    );
    let first = rig.launch(&rig.first_launch(Some(PROMPT)));
    rig.wait_for_turns(0, 2, 1);
    assert!(rig.capsules().is_empty(), "nothing was handed over yet");

    rig.worker.kill();
    let events = PathBuf::from(&first.cgroup).join("cgroup.events");
    wait_until(Duration::from_secs(LEASE_TTL_MS / 1000 + 20), || {
        std::fs::read_to_string(&events).is_ok_and(|e| e.contains("populated 0"))
    })
    .expect("the provider stopped itself after its deadline");
    rig.worker.spawn();
    assert_eq!(rig.takeover(TakeoverKind::Crash, Some(Provider::Claude)), 2);

    // Generation 2 committed generation 1's account, under its own lease.
    let capsules = rig.capsules();
    assert_eq!(capsules.len(), 1, "{capsules:#?}");
    let c = &capsules[0];
    assert_eq!(
        c.generation.get(),
        2,
        "committed under generation 2's fence"
    );
    let p = &c.payload;
    assert!(
        p.task_state.contains("generation 1 (claude, session")
            && p.task_state.contains("ended without a handover")
            && p.task_state.contains("(last: Bash)"),
        "{p:?}"
    );
    assert_eq!(p.pending_work, [PROMPT], "{p:?}");
    assert_eq!(p.repository_revision.len(), 40, "{p:?}");
    let session = p
        .context_ref
        .strip_prefix("claude-session:")
        .expect("claude's session in the capsule")
        .to_owned();

    // It resumed Claude's own session: the model saw generation 1's conversation.
    let turns = rig.wait_for_turns(0, 3, 2);
    let resumed = turns.last().expect("generation 2's request").raw();
    for part in [PROMPT, "before the crash", "ended without a handover"] {
        assert!(
            resumed.contains(part),
            "{part:?} not in generation 2's request:\n{resumed}"
        );
    }
    let script =
        std::fs::read_to_string(rig.sandbox.join("run/writer/g2/provider.sh")).expect("script");
    assert!(script.contains(&format!("--resume {session}")), "{script}");
    rig.wait_released(2);
    assert!(rig.log(2, "stdout").contains("Resumed after the crash."));
    rig.assert_no_key_in_logs(2, &[KEY]);
}

/// One MCP message to a gateway socket, as the bridge sends it: the status and the whole
/// answer (head and body).
fn gateway_post(
    socket: &Path,
    server: &str,
    token: Option<&str>,
    message: &Value,
) -> (u16, String) {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).expect("gateway socket");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let body = message.to_string();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    // One write: a gateway that refuses on the head alone closes before reading the rest,
    // and a second write would then meet a closed pipe.
    let request = format!(
        "POST /mcp/{server} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

/// Issue 16 item 7: the real Claude Code is configured with the MCP servers its profile is
/// granted (and no other), calls one through the worker's gateway — a stdio bridge in the
/// sandbox, the profile's socket, the grant checked, the upstream on host loopback the
/// sandbox cannot reach — and gets its answer. At the same socket a message without the
/// generation's token is refused 401, one for a server without the grant 403
/// `insufficient_scope` and counted for `squadron evidence`, and a revoked grant is refused at
/// the next message. The upstream never sees the token; the socket closes with the
/// generation.
#[test]
fn claude_code_reaches_a_granted_mcp_server_only_through_the_gateway() {
    const KEY: &str = "sk-ant-mcp-0123456789abcdef";
    let mcp = McpServer::start();
    let offered = [format!("notes={}", mcp.url), format!("secrets={}", mcp.url)];
    let rig = Rig::start(
        "toolsmiths",
        vec![Model {
            provider: Provider::Claude,
            script: vec![
                Step::Tool {
                    name: "mcp__notes__add_note",
                    input: json!({"text": "from claude"}),
                },
                Step::Hold,
            ],
            key: KEY,
        }],
        &["--mcp-server", &offered[0], "--mcp-server", &offered[1]],
    );
    let grants = format!("{}/api/v1/profiles/{}/mcp/notes", rig.url, rig.id);
    let r = http_send("PUT", &grants, None, None).expect("grant");
    assert!(r.ok(), "{r:?}");
    rig.launch(&rig.first_launch(Some("Add a note saying: from claude.")));
    let turns = rig.wait_for_turns(0, 2, 1);

    // Configured with the granted server only; the call went through and its answer came back.
    let tools: Vec<&str> = turns[0].body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(tools.contains(&"mcp__notes__add_note"), "{tools:?}");
    assert!(!tools.iter().any(|t| t.contains("secrets")), "{tools:?}");
    assert_eq!(mcp.notes(), [json!({"text": "from claude"})]);
    assert!(
        saw(&turns, "noted: from claude"),
        "the tool's answer never reached the model:\n{}",
        rig.log(1, "stderr")
    );
    let token = std::fs::read_to_string(rig.sandbox.join("run/writer/g1/mcp-token"))
        .expect("the generation's token");
    let token = token.trim();
    assert!(token.starts_with("sqd_mcp_"), "not a gateway token");
    for got in mcp.received() {
        assert_eq!(got.header("authorization"), None, "{got:?}");
        assert!(
            !format!("{got:?}").contains(token),
            "the upstream saw the token"
        );
    }
    // The session the server gave at `initialize` is relayed both ways.
    let received = mcp.received();
    let initialize = received
        .iter()
        .position(|r| r.method() == "initialize")
        .expect("initialize");
    assert!(
        received[initialize + 1..]
            .iter()
            .all(|r| r.header("mcp-session-id") == Some(mcp_server::SESSION)),
        "the session id was not relayed: {received:?}"
    );

    // The same socket, from outside: what a provider without the token or the grant gets.
    let evidence_url = format!("{}/api/v1/projects/acme/toolsmiths/evidence", rig.url);
    let denied = || {
        http_get(&evidence_url).expect("evidence")["unauthorized_mcp_denied"]
            .as_u64()
            .expect("count")
    };
    let before = denied();
    let socket = rig
        .worker
        .data_dir
        .join(format!("agent-sockets/p{}/mcp.sock", rig.id));
    let ping = json!({"jsonrpc": "2.0", "id": 7, "method": "ping"});
    let received = mcp.received().len();
    let (status, answer) = gateway_post(&socket, "notes", None, &ping);
    assert_eq!(status, 401, "{answer}");
    assert!(
        answer.to_lowercase().contains("www-authenticate: bearer"),
        "{answer}"
    );
    let forged = format!("sqd_mcp_{}_{}", "0".repeat(16), "0".repeat(64));
    let (status, answer) = gateway_post(&socket, "notes", Some(&forged), &ping);
    assert_eq!(status, 401, "{answer}");
    assert!(answer.contains("invalid_token"), "{answer}");
    let (status, answer) = gateway_post(&socket, "secrets", Some(token), &ping);
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("insufficient_scope"), "{answer}");
    assert!(answer.contains("mcp_server:use:secrets"), "{answer}");
    assert_eq!(
        mcp.received().len(),
        received,
        "a refused message reached the server"
    );
    let (status, answer) = gateway_post(&socket, "notes", Some(token), &ping);
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"id\":7"), "{answer}");
    // Revoked: the next message is refused; the grant is asked at every message.
    let r = http_send("DELETE", &grants, None, None).expect("revoke");
    assert!(r.ok(), "{r:?}");
    let (status, answer) = gateway_post(&socket, "notes", Some(token), &ping);
    assert_eq!(status, 403, "{answer}");
    assert_eq!(denied(), before + 2, "each 403 is counted once");

    // The socket goes with the generation.
    rig.rt
        .block_on(
            rig.client
                .agent_stop(rig.profile, &StopAgent { grace_ms: None }),
        )
        .expect("stop");
    let closed = wait_until(Duration::from_secs(30), || !socket.exists());
    assert!(closed.is_ok(), "the gateway socket outlived its generation");
    rig.assert_no_key_in_logs(1, &[KEY, token]);
}

/// Codex's half of issue 16 item 7: the real Codex is given the servers its profile is granted
/// (`-c mcp_servers.…`, the bridge to the gateway) and no other; its MCP client reaches the
/// granted server through the gateway (initialize, the session, the tool list), and the
/// model is told of that server's tools only. (Codex 0.171 defers MCP tools behind a search
/// step of its own, so the call itself is Claude Code's test above.)
#[test]
fn codex_reaches_only_its_granted_mcp_server_through_the_gateway() {
    let mcp = McpServer::start();
    let offered = [format!("notes={}", mcp.url), format!("secrets={}", mcp.url)];
    let rig = Rig::start(
        "codexmcp",
        vec![Model {
            provider: Provider::Codex,
            script: vec![Step::Text("Done.")],
            key: "sk-openai-mcp-0123456789abcdef",
        }],
        &["--mcp-server", &offered[0], "--mcp-server", &offered[1]],
    );
    let grants = format!("{}/api/v1/profiles/{}/mcp/notes", rig.url, rig.id);
    let r = http_send("PUT", &grants, None, None).expect("grant");
    assert!(r.ok(), "{r:?}");
    rig.launch(&rig.first_launch(Some("Say done.")));
    rig.wait_released(1);
    let methods: Vec<String> = mcp
        .received()
        .iter()
        .map(|r| r.method().to_string())
        .collect();
    assert!(
        methods.starts_with(&["initialize".into()]) && methods.contains(&"tools/list".into()),
        "{methods:?}\n{}",
        rig.log(1, "stderr")
    );
    let received = mcp.received();
    assert!(
        received[1..]
            .iter()
            .all(|r| r.header("mcp-session-id") == Some(mcp_server::SESSION)
                && r.header("authorization").is_none()),
        "{received:?}"
    );
    let turns = rig.wait_for_turns(0, 1, 1);
    assert!(
        saw(&turns, "mcp__notes"),
        "the model was not told of the granted server"
    );
    assert!(
        !saw(&turns, "mcp__secrets"),
        "the model was told of a server not granted"
    );
}

/// Commits the paths it is given through the Git broker under the generation's own fence
/// (the worktree's `.git` is read-only to providers), printing the broker's answer: what a
/// real CLI runs, as a shell command, to commit its work in the canary below.
const COMMIT_PY: &str = r#"import json, os, socket, sys
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
print(json.dumps(ask(dict(op="commit", expected_head=head.get("head"), paths=sys.argv[1:],
    message="notes of generation %d" % fence["generation"],
    idempotency_key="notes-g%d" % fence["generation"], **fence))))
"#;

/// ADR-0011's canary with the real CLIs (issue 16): 8 profiles of one project in one
/// sandbox, each preferring Codex and falling back to Claude Code; 4 launched at most, the
/// rest refused while the project is full. Each running CLI commits its notes through the
/// broker (a shell command its model asks for) and then waits on its model. A graceful
/// takeover swaps Codex for Claude Code with Codex's capsule in Claude's first request; the
/// fenced generation's commit is refused and writes nothing; kill -9 of another provider
/// and a crash takeover start Claude Code from the account of the dead Codex; an MCP
/// message for a server the profile was not granted is refused 403; once stopped, nothing
/// is left — no lease, cgroup leaf or credential file — and `squadron evidence` passes every
/// claim.
/// The canary's agent lease TTL: short, so the crash takeover's expiry comes soon, yet with
/// room for renewals on a 2-core machine running six CLIs at once.
const CANARY_LEASE_TTL_MS: u64 = 6_000;

#[test]
fn the_adr_canary_runs_on_the_real_clis() {
    const OPENAI_KEY: &str = "sk-openai-canary-0123456789abcdef";
    const ANTHROPIC_KEY: &str = "sk-ant-canary-0123456789abcdef";
    const COMMIT: &str = r#"echo "$SQUADRON_PROVIDER g$SQUADRON_GENERATION" >> notes.txt && python3 commit.py notes.txt"#;
    let mcp = McpServer::start();
    let offered = format!("notes={}", mcp.url);
    let keys: Vec<String> = (0..8).map(|i| format!("agent-{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let rig = Rig::start_project(
        "canary",
        vec![
            Model {
                provider: Provider::Codex,
                script: vec![
                    Step::Tool {
                        name: "exec_command",
                        input: json!({ "cmd": COMMIT }),
                    },
                    Step::Hold,
                ],
                key: OPENAI_KEY,
            },
            Model {
                provider: Provider::Claude,
                script: vec![
                    Step::Tool {
                        name: "Bash",
                        input: json!({"command": COMMIT, "description": "commit the notes"}),
                    },
                    Step::Hold,
                ],
                key: ANTHROPIC_KEY,
            },
        ],
        &[
            "--agent-stop-grace-ms",
            "3000",
            "--agent-lease-ttl-ms",
            &CANARY_LEASE_TTL_MS.to_string(),
            "--mcp-server",
            &offered,
        ],
        &keys,
        4,
    );
    std::fs::write(rig.repo.join("commit.py"), COMMIT_PY).expect("commit.py");
    git(&rig.repo, &["add", "commit.py"]);
    git(
        &rig.repo,
        &["commit", "-q", "-m", "the broker's commit helper"],
    );
    let id = |i: usize| ProfileId::new(i as u64 + 1).expect("id");
    let prompt = |i: usize| format!("You are agent-{i}. Keep the notes in notes.txt.");
    // A CLI's requests of profile `i`'s conversations (its prompt is in each of them).
    let turns_of = |server: usize, i: usize| -> Vec<Recorded> {
        loop_requests(&rig.servers[server])
            .into_iter()
            .filter(|r| r.raw().contains(&prompt(i)))
            .collect()
    };
    let wait_turns = |server: usize, i: usize, n: usize, generation: u64| -> Vec<Recorded> {
        let seen = wait_until(TURN_TIMEOUT, || turns_of(server, i).len() >= n);
        assert!(
            seen.is_ok(),
            "agent-{i} generation {generation} never reached turn {n}:\n{}",
            rig.log_of(keys[i], generation, "stderr")
        );
        turns_of(server, i)
    };
    let head_subject = |i: usize| {
        git(
            &rig.sandbox.join("worktrees").join(keys[i]),
            &["log", "-1", "--format=%s"],
        )
    };

    // The first launch makes the sandbox; the other seven at once fill the other 3 slots.
    let first = rig.launch(&rig.first_launch(Some(&prompt(0))));
    assert_eq!(first.provider, Provider::Codex, "codex is preferred");
    let results = rig.rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for i in 1..8 {
            let (c, launch) = (
                rig.client.clone(),
                LaunchAgent {
                    prompt: Some(prompt(i)),
                    ..LaunchAgent::default()
                },
            );
            set.spawn(async move { (i, c.agent_launch(id(i), &launch).await) });
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
                assert_eq!(view.provider, Provider::Codex);
                running.push(*i);
            }
            Err(squadron_client::ClientError::Api { status: 429, .. }) => {}
            Err(e) => panic!("agent-{i}: a full project refuses with 429, not {e}"),
        }
    }
    assert_eq!(running.len(), 4, "exactly 4 launched: {results:?}");

    // Each Codex ran its command — a commit through the broker under its own lease — and
    // waits on its model.
    for &i in &running {
        wait_turns(0, i, 2, 1);
        assert_eq!(head_subject(i), "notes of generation 1", "agent-{i}");
    }

    // Graceful takeover of agent-0: Codex → Claude Code, carrying Codex's capsule.
    let old = rig.rt.block_on(rig.client.agent_view(id(0))).expect("view");
    let swapped = rig
        .rt
        .block_on(rig.client.agent_takeover(
            id(0),
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
    assert!(!swapped.replaced.expect("the old generation").populated);
    let capsules = rig
        .rt
        .block_on(
            rig.client
                .list_capsules(id(0), squadron_client::Consistency::Linearizable),
        )
        .expect("capsules");
    assert_eq!(capsules.len(), 1, "{capsules:#?}");
    assert!(capsules[0].verify(), "the committed capsule verifies");
    let p = &capsules[0].payload;
    assert!(
        p.task_state.contains("generation 1 (codex, session"),
        "{p:?}"
    );
    assert_eq!(p.pending_work, [prompt(0)], "{p:?}");
    let claude = wait_turns(1, 0, 1, 2);
    let text = claude[0].all_text();
    assert_eq!(claude[0].header("x-api-key"), Some(ANTHROPIC_KEY));
    for part in ["generation 1 left this continuity capsule", &p.context_ref] {
        assert!(
            text.contains(part),
            "{part:?} not in Claude's first turn:\n{text}"
        );
    }
    // Claude Code commits under generation 2's fence.
    wait_turns(1, 0, 2, 2);
    assert_eq!(head_subject(0), "notes of generation 2");

    // The fenced generation's commit is refused and writes nothing.
    let worktree = rig.sandbox.join("worktrees/agent-0");
    let head_before = git(&worktree, &["rev-parse", "HEAD"]);
    std::fs::write(worktree.join("stale.txt"), "stale\n").expect("write");
    let broker = rig.worker.data_dir.join("agent-sockets/p1/git.sock");
    let stale = rig
        .rt
        .block_on(GitBrokerClient::commit(
            &broker,
            &CommitRequest {
                profile: 1,
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
    assert_eq!(git(&worktree, &["rev-parse", "HEAD"]), head_before);

    // Crash takeover: kill -9 of every process of another Codex; Claude Code starts from the
    // account the next generation committed of it.
    let victim = running[1];
    let view = rig
        .rt
        .block_on(rig.client.agent_view(id(victim)))
        .expect("view");
    let procs = std::fs::read_to_string(Path::new(&view.cgroup).join("cgroup.procs"))
        .expect("cgroup.procs");
    for pid in procs.split_whitespace() {
        let _ = std::process::Command::new("kill")
            .args(["-9", pid])
            .stderr(std::process::Stdio::null())
            .status();
    }
    wait_until(Duration::from_secs(30), || {
        rig.rt
            .block_on(rig.client.agent_view(id(victim)))
            .is_ok_and(|v| v.status == AgentStatus::Crashed)
    })
    .expect("the worker sees the crash");
    let crashed = rig
        .rt
        .block_on(rig.client.agent_takeover(
            id(victim),
            &TakeoverAgent {
                kind: TakeoverKind::Crash,
                provider: Some(Provider::Claude),
                wait_for_expiry_ms: Some(CANARY_LEASE_TTL_MS * 4),
                prompt: None,
            },
        ))
        .expect("crash takeover");
    assert_eq!(crashed.generation.get(), 2);
    assert_eq!(crashed.provider, Provider::Claude);
    let replaced = crashed.replaced.expect("evidence");
    assert!(!replaced.populated);
    assert_eq!(replaced.cgroup, view.cgroup, "evidence names the dead leaf");
    let claude = wait_turns(1, victim, 1, 2);
    assert!(
        claude[0].all_text().contains("ended without a handover"),
        "{}",
        claude[0].all_text()
    );
    wait_turns(1, victim, 2, 2);
    assert_eq!(head_subject(victim), "notes of generation 2");

    // An MCP message for a server the profile was not granted: 403, counted.
    let denied = || {
        http_get(&format!("{}/api/v1/projects/acme/canary/evidence", rig.url)).expect("evidence")
            ["unauthorized_mcp_denied"]
            .as_u64()
            .expect("count")
    };
    let before = denied();
    let token = std::fs::read_to_string(rig.sandbox.join("run/agent-0/g2/mcp-token"))
        .expect("generation 2's MCP token");
    let socket = rig.worker.data_dir.join("agent-sockets/p1/mcp.sock");
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let (status, answer) = gateway_post(&socket, "notes", Some(token.trim()), &ping);
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("insufficient_scope"), "{answer}");
    assert!(
        mcp.received().is_empty(),
        "a refused message reached the server"
    );
    assert_eq!(denied(), before + 1, "the 403 is counted once");

    // Stopped, nothing is left, and the evidence passes every claim.
    for &i in &running {
        let v = rig
            .rt
            .block_on(rig.client.agent_stop(id(i), &StopAgent::default()))
            .expect("stop");
        assert_eq!(v.status, AgentStatus::Stopped, "agent-{i}");
    }
    let out = cli(&rig.url)
        .args(["--endpoint", &rig.url, "--output", "json", "evidence"])
        .args(["--tenant", "acme", "--project", "canary"])
        .output()
        .expect("squadron evidence");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ev: Value = serde_json::from_slice(&out.stdout).expect("evidence json");
    let failed: Vec<&Value> = ev["verdicts"]
        .as_array()
        .expect("verdicts")
        .iter()
        .filter(|v| v["pass"] != true)
        .collect();
    assert!(failed.is_empty(), "failed claims: {failed:#?}");
    assert_eq!(ev["peak_slots_held"], 4, "{ev:#}");
    assert_eq!(ev["takeovers_graceful"], 1, "{ev:#}");
    assert_eq!(ev["takeovers_crash"], 1, "{ev:#}");
    let w = &ev["worker"];
    assert_eq!(w["broker"]["accepted_from_non_current"], 0, "{ev:#}");
    assert!(
        w["broker"]["refused_stale_generation"].as_u64() >= Some(1),
        "{ev:#}"
    );
    assert!(
        w["broker"]["commits_accepted"].as_u64() >= Some(6),
        "{ev:#}"
    );
    assert_eq!(w["cgroup_leaves_left"], json!([]), "{ev:#}");
    assert_eq!(w["credential_files_left"], json!([]), "{ev:#}");
    assert_eq!(w["processes_now"], 0, "{ev:#}");
    for &i in &running {
        let (key, generations) = (keys[i], if i == 0 || i == victim { 2 } else { 1 });
        for g in 1..=generations {
            assert!(
                !rig.log_of(key, g, "stdout").is_empty(),
                "{key} g{g} wrote no stdout log"
            );
            for stream in ["stdout", "stderr"] {
                let text = rig.log_of(key, g, stream);
                assert!(
                    !text.contains(OPENAI_KEY) && !text.contains(ANTHROPIC_KEY),
                    "{key} g{g}.{stream}.log holds a key"
                );
            }
        }
    }
}
