//! The real provider CLIs under Squadron (issue 16): the pinned Claude Code and Codex
//! (`providers/versions.env`, installed by `scripts/test`) each complete a task on the process
//! runtime against a scripted model server, offline. A real node, a real worker with
//! bubblewrap and cgroups; the model server listens in a network namespace the test made,
//! which the sandbox reaches through its `outbound` egress; the API key is a credential the
//! test put, delivered as a credential lease.

mod model_server;
mod support;

use std::time::Duration;

use model_server::{ModelServer, Recorded, Step, TestNet, MODEL_PORT};
use serde_json::{json, Value};
use support::*;

const TASK_TIMEOUT: Duration = Duration::from_secs(180);

/// One provider's run: what it is told to use, and what it did.
struct ProviderRun {
    server: ModelServer,
    url: String,
    id: u64,
    task: Value,
    _worker: WorkerProc,
    _cluster: Cluster,
    _net: TestNet,
}

impl ProviderRun {
    /// A one-node cluster, the key as credential `key-test` (mount `mount`), a process worker
    /// that hands `base_var` (the model server's URL) to sandboxes, and a task of `provider`
    /// run to its end.
    fn start(
        runtime: &str,
        provider: &str,
        (mount, key, base_var): (&str, &str, &str),
        script: Vec<Step>,
    ) -> Self {
        let net = TestNet::new(provider);
        let server = ModelServer::start(net.listen(MODEL_PORT), script);
        let cluster = Cluster::start(1);
        let url = cluster.url(1);
        put_credential(&url, "key-test", key);
        let base = match base_var {
            "OPENAI_BASE_URL" => format!("{}/v1", server.url),
            _ => server.url.clone(),
        };
        let worker = WorkerProc::start_with_env(
            cluster.dir.path(),
            &unique_worker_id(&format!("w-{provider}-{runtime}")),
            cluster.urls(),
            runtime,
            vec!["--env-allow".into(), base_var.into()],
            vec![(base_var.into(), base)],
        );
        let repo = git_repo(cluster.dir.path());
        let r = submit_yaml(&url, &manifest(&repo, runtime, provider, mount));
        assert!(r.ok(), "submission refused: {r:?}");
        let id = r.body["task_submitted"]["task"].as_u64().expect("task id");
        let task = wait_task_state(
            &url,
            id,
            &["COMPLETED", "FAILED", "FAILED_PRESERVED"],
            TASK_TIMEOUT,
        );
        let run = ProviderRun {
            server,
            url,
            id,
            task,
            _worker: worker,
            _cluster: cluster,
            _net: net,
        };
        assert_eq!(
            run.task["state"],
            "COMPLETED",
            "{:#}\nstdout:\n{}\nstderr:\n{}\nworker:\n{}",
            run.task,
            run.output("stdout"),
            run.output("stderr"),
            tail(&run._worker.log)
        );
        run
    }

    fn output(&self, stream: &str) -> String {
        http_text(&format!(
            "{}/api/v1/tasks/{}/logs?stream={stream}",
            self.url, self.id
        ))
        .map(|(_, t)| t)
        .unwrap_or_default()
    }

    /// The `provider_summary` event the worker wrote from the CLI's own stream.
    fn summary(&self) -> Value {
        let events = self.output("events");
        events
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["event"] == "provider_summary")
            .unwrap_or_else(|| panic!("no provider_summary event in:\n{events}"))
    }

    fn artifact(&self, name: &str) -> String {
        let (status, text) = http_text(&format!(
            "{}/api/v1/tasks/{}/artifacts/{name}",
            self.url, self.id
        ))
        .expect("artifact");
        assert_eq!(status, 200, "{name}: {text}");
        text
    }

    /// The edit to src/lib.txt is the patch, the new file is in the untracked list, and the
    /// key is in no output of the task.
    fn check_outputs(&self, new_file: &str, key: &str) {
        let patch = self.artifact(&format!("{}.patch", self.id));
        assert!(
            patch.contains("src/lib.txt") && patch.contains("+three"),
            "{patch}\nstdout:\n{}",
            self.output("stdout")
        );
        let untracked = self.artifact(&format!("{}-untracked.txt", self.id));
        assert!(untracked.lines().any(|l| l == new_file), "{untracked}");
        for stream in ["stdout", "stderr", "events"] {
            assert!(!self.output(stream).contains(key), "the key is in {stream}");
        }
    }
}

fn manifest(repo: &std::path::Path, runtime: &str, provider: &str, mount: &str) -> String {
    format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: {provider}-e2e\nrepository:\n  url: {repo}\n  \
         branch: main\nagent:\n  prompt: \"Read TASK.md, then change src/lib.txt and add a file\"\n  \
         provider: {provider}\n  model: {provider}-scripted-1\nvm:\n  runtime: {runtime}\n\
         startup_profile:\n  id: s\n  trigger: on_instance_ready\n  \
         session: {{ launcher: {provider}, workdir: /workspace, cols: 80, rows: 24 }}\n  \
         credential_refs:\n    - {{ id: key-test, mount: {mount} }}\n  \
         readiness: {{ probes: [] }}\n  \
         observation: {{ retention_class: short, redaction_profile: secrets-v1 }}\n",
        repo = repo.display()
    )
}

/// The model saw the tool's output in a later turn.
fn saw(turns: &[Recorded], text: &str) -> bool {
    turns.iter().any(|t| t.body.to_string().contains(text))
}

#[test]
fn claude_code_completes_a_task_on_the_process_runtime() {
    claude_code_completes_a_task("process");
}

/// The same in a container of the agent image, which carries the pinned CLIs.
#[test]
fn claude_code_completes_a_task_in_docker() {
    claude_code_completes_a_task("docker");
}

#[test]
fn codex_completes_a_task_on_the_process_runtime() {
    codex_completes_a_task("process");
}

#[test]
fn codex_completes_a_task_in_docker() {
    codex_completes_a_task("docker");
}

/// Claude Code reads the task, edits a file, writes one, runs a command and answers; the patch
/// has the edit, the model server saw what the CLI sent (the model, the tools, the key from
/// the credential lease, the tool results), and the key is in none of the task's output.
fn claude_code_completes_a_task(runtime: &str) {
    const KEY: &str = "sk-ant-scripted-0123456789abcdef";
    let run = ProviderRun::start(
        runtime,
        "claude",
        ("anthropic_api_key", KEY, "ANTHROPIC_BASE_URL"),
        vec![
            Step::Tool {
                name: "Read",
                input: json!({"file_path": "{cwd}/TASK.md"}),
            },
            // Claude Code edits only a file it has read.
            Step::Tool {
                name: "Read",
                input: json!({"file_path": "{cwd}/src/lib.txt"}),
            },
            Step::Tool {
                name: "Edit",
                input: json!({"file_path": "{cwd}/src/lib.txt", "old_string": "two\n",
                              "new_string": "two\nthree\n"}),
            },
            Step::Tool {
                name: "Write",
                input: json!({"file_path": "{cwd}/hello.txt", "content": "hello from claude\n"}),
            },
            Step::Tool {
                name: "Bash",
                input: json!({"command": "cat hello.txt && id -u", "description": "check"}),
            },
            Step::Text("Wrote hello.txt."),
        ],
    );
    run.check_outputs("hello.txt", KEY);
    let turns = run.server.main_loop();
    assert!(turns.len() >= 6, "{} turns: {turns:#?}", turns.len());
    let first = &turns[0];
    assert_eq!(first.body["model"], "claude-scripted-1");
    assert_eq!(first.header("x-api-key"), Some(KEY));
    for tool in ["Read", "Edit", "Write", "Bash"] {
        assert!(
            first.tool_names().iter().any(|t| t == tool),
            "{tool} not offered: {:?}",
            first.tool_names()
        );
    }
    let cwd = model_server::working_directory(&first.all_text());
    assert!(cwd.starts_with("/mnt/inbox"), "working directory {cwd:?}");
    // TASK.md (headed by the task's name, which nothing else sent holds) reached the model
    // through the Read tool, and the command's output through Bash.
    assert!(
        saw(&turns, "# claude-e2e"),
        "TASK.md never reached the model"
    );
    assert!(
        saw(&turns, "hello from claude\\n"),
        "the command's output never reached the model"
    );
    assert!(
        !saw(&turns, "hello from claude\\n0"),
        "the provider ran as root"
    );
    // The CLI's own stream is the task's stdout, and its account of the run is an event.
    assert!(run.output("stdout").contains("\"type\":\"result\""));
    let summary = run.summary();
    assert_eq!(summary["tool_calls"], 5, "{summary:#}");
    assert_eq!(summary["tools"]["Read"], 2, "{summary:#}");
    assert_eq!(summary["last_tool"], "Bash", "{summary:#}");
    assert_eq!(summary["model"], "claude-scripted-1", "{summary:#}");
    assert_eq!(summary["result"], "success", "{summary:#}");
    assert!(summary["input_tokens"].as_u64() > Some(0), "{summary:#}");
    assert!(summary["cost_usd"].as_f64().is_some(), "{summary:#}");
}

/// Codex (`codex exec --json`) does the same through its `exec_command` tool: the worker's
/// `OPENAI_BASE_URL` became its model provider, the key reached it as a bearer token, and
/// the command output came back to the model.
fn codex_completes_a_task(runtime: &str) {
    const KEY: &str = "sk-openai-scripted-0123456789abcdef";
    let run = ProviderRun::start(
        runtime,
        "codex",
        ("openai_api_key", KEY, "OPENAI_BASE_URL"),
        vec![
            Step::Tool {
                name: "exec_command",
                input: json!({"cmd": "cat TASK.md"}),
            },
            Step::Tool {
                name: "exec_command",
                input: json!({"cmd": "printf 'three\\n' >> src/lib.txt && echo hello from codex > hello-codex.txt && cat hello-codex.txt && id -u"}),
            },
            Step::Text("Changed src/lib.txt and added hello-codex.txt."),
        ],
    );
    run.check_outputs("hello-codex.txt", KEY);
    let turns: Vec<Recorded> = run
        .server
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/responses"))
        .collect();
    assert!(turns.len() >= 3, "{} turns: {turns:#?}", turns.len());
    let first = &turns[0];
    assert_eq!(first.body["model"], "codex-scripted-1");
    assert_eq!(
        first.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert!(
        first.tool_names().iter().any(|t| t == "exec_command"),
        "{:?}",
        first.tool_names()
    );
    assert!(
        saw(&turns, "# codex-e2e"),
        "TASK.md never reached the model"
    );
    assert!(
        saw(&turns, "hello from codex"),
        "the command's output never reached the model"
    );
    assert!(
        !saw(&turns, "hello from codex\\n0"),
        "the provider ran as root"
    );
    assert!(run.output("stdout").contains("\"type\":\"turn.completed\""));
    let summary = run.summary();
    assert_eq!(summary["tool_calls"], 2, "{summary:#}");
    assert_eq!(summary["tools"]["command_execution"], 2, "{summary:#}");
    assert_eq!(summary["turns"], 1, "{summary:#}");
    assert!(summary["input_tokens"].as_u64() > Some(0), "{summary:#}");
    assert!(summary["session_id"].is_string(), "{summary:#}");
}

/// An agent profile's provider is the real CLI too: launched headless with the operator's
/// prompt, its key from the credential the profile is given (a file, moved into the CLI's
/// environment), it works in the profile's worktree, finishes, and its lease is released.
#[test]
fn claude_code_runs_as_an_agent_profile_s_provider() {
    const KEY: &str = "sk-ant-profile-0123456789abcdef";
    let net = TestNet::new("claude-profile");
    let server = ModelServer::start(
        net.listen(MODEL_PORT),
        vec![
            Step::Tool {
                name: "Bash",
                input: json!({"command": "echo profile was here > notes.txt && cat notes.txt",
                              "description": "leave a note"}),
            },
            Step::Text("Left a note."),
        ],
    );
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    put_credential(&url, "key-test", KEY);
    let worker = WorkerProc::start_with_env(
        cluster.dir.path(),
        &unique_worker_id("w-claude-profile"),
        cluster.urls(),
        "process",
        vec!["--env-allow".into(), "ANTHROPIC_BASE_URL".into()],
        vec![("ANTHROPIC_BASE_URL".into(), server.url.clone())],
    );
    let repo = git_repo(cluster.dir.path());
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "scribes", "max_profiles": 1, "max_active": 1}),
    )
    .expect("project");
    assert!(r.ok(), "{r:?}");
    let r = post(
        &format!("{url}/api/v1/projects/acme/scribes/profiles"),
        json!({"key": "scribe", "providers": ["claude"]}),
    )
    .expect("profile");
    let id = r.body["profile_created"]["profile"].as_u64().expect("id");
    let r = http_send(
        "PUT",
        &format!("{url}/api/v1/profiles/{id}/credentials"),
        Some(json!({"credential_refs": [{"id": "key-test", "mount": "anthropic_api_key"}]})),
        None,
    )
    .expect("credentials");
    assert!(r.ok(), "{r:?}");

    let rt = rt();
    let client = client_with_timeouts(
        cluster.urls(),
        Duration::from_secs(120),
        Duration::from_secs(2),
    );
    let profile = squadron_core::ids::ProfileId::new(id).expect("id");
    let first_launch = squadron_client::LaunchAgent {
        worker: Some(squadron_core::ids::WorkerId::new(worker.id.clone()).expect("worker id")),
        repository: Some(squadron_client::SandboxRepository {
            url: repo.display().to_string(),
            branch: Some("main".into()),
        }),
        ..squadron_client::LaunchAgent::default()
    };
    // A headless CLI has nobody to ask: without a prompt (or a capsule) nothing starts.
    let err = rt
        .block_on(client.agent_launch(profile, &first_launch))
        .expect_err("no prompt");
    assert!(err.to_string().contains("prompt"), "{err}");
    let launched = rt
        .block_on(client.agent_launch(
            profile,
            &squadron_client::LaunchAgent {
                prompt: Some("Leave a note in notes.txt.".into()),
                ..first_launch
            },
        ))
        .expect("launch");
    assert_eq!(launched.generation.get(), 1);

    // It runs to its end; the exit releases the lease.
    let mut p = Value::Null;
    let done = wait_until(TASK_TIMEOUT, || {
        p = http_get(&format!("{url}/api/v1/profiles/{id}")).unwrap_or_default();
        p["live_lease"].is_null()
    });
    let sandbox = worker
        .data_dir
        .canonicalize()
        .expect("data dir")
        .join("projects/acme/scribes");
    let log = |stream: &str| {
        std::fs::read_to_string(sandbox.join(format!("state/scribe/logs/g1.{stream}.log")))
            .unwrap_or_default()
    };
    assert!(
        done.is_ok(),
        "the provider never finished: {p:#}\nstdout:\n{}\nstderr:\n{}",
        log("stdout"),
        log("stderr")
    );
    let turns = server.main_loop();
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
    let note = std::fs::read_to_string(sandbox.join("worktrees/scribe/notes.txt")).expect("note");
    assert_eq!(note, "profile was here\n");
    assert!(
        log("stdout").contains("\"type\":\"result\""),
        "{}",
        log("stdout")
    );
    assert!(!log("stdout").contains(KEY) && !log("stderr").contains(KEY));
    let view = http_get(&format!("{url}/api/v1/profiles/{id}/credentials")).expect("view");
    assert!(view["leases"][0]["revoked_at_ms"].is_u64(), "{view:#}");
    assert!(!sandbox.join("run/scribe/g1.credentials").exists());
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
    let net = TestNet::new("handover");
    let codex_model = ModelServer::start(
        net.listen(MODEL_PORT),
        vec![
            Step::Tool {
                name: "exec_command",
                input: json!({"cmd": "echo started > started.txt"}),
            },
            Step::Hold,
        ],
    );
    let claude_model = ModelServer::start(
        net.listen(MODEL_PORT + 1),
        vec![Step::Text("Continuing from the capsule.")],
    );
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    put_credential(&url, "key-openai", OPENAI_KEY);
    put_credential(&url, "key-anthropic", ANTHROPIC_KEY);
    let worker = WorkerProc::start_with_env(
        cluster.dir.path(),
        &unique_worker_id("w-handover"),
        cluster.urls(),
        "process",
        [
            "--env-allow",
            "OPENAI_BASE_URL",
            "--env-allow",
            "ANTHROPIC_BASE_URL",
            "--agent-stop-grace-ms",
            "3000",
        ]
        .map(String::from)
        .to_vec(),
        vec![
            ("OPENAI_BASE_URL".into(), format!("{}/v1", codex_model.url)),
            ("ANTHROPIC_BASE_URL".into(), claude_model.url.clone()),
        ],
    );
    let repo = git_repo(cluster.dir.path());
    for (path, body) in [
        (
            "projects".to_owned(),
            json!({"tenant": "acme", "project": "handover", "max_profiles": 1, "max_active": 1}),
        ),
        (
            "projects/acme/handover/profiles".to_owned(),
            json!({"key": "writer", "providers": ["codex", "claude"]}),
        ),
    ] {
        let r = post(&format!("{url}/api/v1/{path}"), body).expect(&path);
        assert!(r.ok(), "{r:?}");
    }
    let id = 1;
    let r = http_send(
        "PUT",
        &format!("{url}/api/v1/profiles/{id}/credentials"),
        Some(json!({"credential_refs": [
            {"id": "key-openai", "mount": "openai_api_key"},
            {"id": "key-anthropic", "mount": "anthropic_api_key"},
        ]})),
        None,
    )
    .expect("credentials");
    assert!(r.ok(), "{r:?}");

    let rt = rt();
    let client = client_with_timeouts(
        cluster.urls(),
        Duration::from_secs(120),
        Duration::from_secs(2),
    );
    let profile = squadron_core::ids::ProfileId::new(id).expect("id");
    let launched = rt
        .block_on(client.agent_launch(
            profile,
            &squadron_client::LaunchAgent {
                worker: Some(
                    squadron_core::ids::WorkerId::new(worker.id.clone()).expect("worker id"),
                ),
                repository: Some(squadron_client::SandboxRepository {
                    url: repo.display().to_string(),
                    branch: Some("main".into()),
                }),
                prompt: Some(PROMPT.into()),
                ..squadron_client::LaunchAgent::default()
            },
        ))
        .expect("launch codex");
    assert_eq!(launched.provider, squadron_core::provider::Provider::Codex);
    let sandbox = worker
        .data_dir
        .canonicalize()
        .expect("data dir")
        .join("projects/acme/handover");
    let log = |generation: u64, stream: &str| {
        std::fs::read_to_string(
            sandbox.join(format!("state/writer/logs/g{generation}.{stream}.log")),
        )
        .unwrap_or_default()
    };
    // Codex ran its command and now waits on its model.
    let held = wait_until(TASK_TIMEOUT, || {
        codex_model
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/responses"))
            .count()
            >= 2
    });
    assert!(
        held.is_ok(),
        "codex never came back to its model:\n{}\n{}",
        log(1, "stdout"),
        log(1, "stderr")
    );
    assert_eq!(
        std::fs::read_to_string(sandbox.join("worktrees/writer/started.txt")).ok(),
        Some("started\n".to_owned())
    );

    let next = rt
        .block_on(client.agent_takeover(
            profile,
            &squadron_client::TakeoverAgent {
                kind: squadron_client::TakeoverKind::Graceful,
                provider: None,
                wait_for_expiry_ms: None,
                prompt: None,
            },
        ))
        .expect("graceful takeover");
    assert_eq!(next.provider, squadron_core::provider::Provider::Claude);
    assert_eq!(next.generation.get(), 2);

    // The committed capsule is Codex's own account.
    let capsules = rt
        .block_on(client.list_capsules(profile, squadron_client::Consistency::Linearizable))
        .expect("capsules");
    let capsule = capsules.last().expect("a capsule was committed");
    let p = &capsule.payload;
    assert!(
        p.task_state.contains("generation 1 (codex, session"),
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

    // Claude's first turn carried it, then finished; its exit released the lease.
    let turns = wait_until(TASK_TIMEOUT, || !claude_model.main_loop().is_empty());
    assert!(
        turns.is_ok(),
        "claude never asked its model:\n{}",
        log(2, "stderr")
    );
    let first = &claude_model.main_loop()[0];
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
    let released = wait_until(TASK_TIMEOUT, || {
        http_get(&format!("{url}/api/v1/profiles/{id}")).is_ok_and(|p| p["live_lease"].is_null())
    });
    assert!(
        released.is_ok(),
        "claude never finished:\n{}",
        log(2, "stderr")
    );
    for generation in [1, 2] {
        for stream in ["stdout", "stderr"] {
            let text = log(generation, stream);
            assert!(!text.contains(OPENAI_KEY) && !text.contains(ANTHROPIC_KEY));
        }
    }
}
