//! The real provider CLIs under Squadron (issue 16): the pinned Claude Code and Codex
//! (`providers/versions.env`, installed by `scripts/test`) each complete a task on the process
//! runtime against a scripted model server, offline. A real node, a real worker with
//! bubblewrap and cgroups; the model server listens in a network namespace the test made,
//! which the sandbox reaches through its `outbound` egress; the API key is a credential the
//! test put, delivered as a credential lease — as a file, or injected at egress by the
//! worker's proxy on the way to a TLS model server (issue 14 item 8).

mod model_server;
mod support;

use std::time::Duration;

use model_server::{ModelServer, Recorded, Step, TestNet, MODEL_PORT};
use serde_json::{json, Value};
use support::*;

const TASK_TIMEOUT: Duration = Duration::from_secs(180);
/// In a guest under software emulation: the CLIs run several times slower there.
const VM_TASK_TIMEOUT: Duration = Duration::from_secs(420);

/// How the key reaches the provider.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// A credential file in the sandbox; the worker hands the model server's URL over in
    /// the provider's base-URL variable.
    File,
    /// Injected at egress: the credential is bound to the model server (over TLS), whose
    /// header is `(name, value prefix)`; the sandbox holds only a placeholder.
    Egress(&'static str, &'static str),
}

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
    /// A one-node cluster, the key as credential `key-test` (mount `mount`), a worker that
    /// hands `base_var` (the model server's URL) to sandboxes — or, injected at egress, binds
    /// the credential to the model server over TLS —, and a task of `provider` run to its end.
    fn start_with(
        runtime: &str,
        provider: &str,
        (mount, key, base_var): (&str, &str, &str),
        script: Vec<Step>,
        delivery: Delivery,
    ) -> Self {
        let net = TestNet::new(provider);
        let cluster = Cluster::start(1);
        let ca = squadron_pki::ClusterCa::generate("model-server")
            .expect("CA")
            .0;
        let server = match delivery {
            Delivery::File => ModelServer::start(net.listen(MODEL_PORT), script),
            Delivery::Egress(..) => ModelServer::start_tls(net.listen(MODEL_PORT), script, &ca),
        };
        let url = cluster.url(1);
        put_credential(&url, "key-test", key);
        let base = match base_var {
            "OPENAI_BASE_URL" => format!("{}/v1", server.url),
            _ => server.url.clone(),
        };
        let (args, env) = match delivery {
            Delivery::File => (
                vec!["--env-allow".into(), base_var.into()],
                vec![(base_var.into(), base)],
            ),
            Delivery::Egress(header, prefix) => {
                let ca_file = cluster.dir.path().join("model-ca.pem");
                std::fs::write(&ca_file, ca.cert_pem()).expect("CA file");
                let bound = cli(&url)
                    .args(["--endpoint", &url, "credential", "egress-set", "key-test"])
                    .args(["--upstream", &base, "--header", header])
                    .args(["--value-prefix", prefix])
                    .output()
                    .expect("squadron credential egress-set");
                assert!(bound.status.success(), "{bound:?}");
                (
                    vec!["--egress-ca".into(), ca_file.display().to_string()],
                    Vec::new(),
                )
            }
        };
        let mut args = args;
        if runtime == "kvm" {
            args.extend(kvm_worker_args(1));
        }
        let worker = WorkerProc::start_with_env(
            cluster.dir.path(),
            // Both deliveries' tests run at once in this process: their workers' ids (and so
            // their cgroup roots) must differ.
            &unique_worker_id(&match delivery {
                Delivery::File => format!("w-{provider}-{runtime}"),
                Delivery::Egress(..) => format!("w-{provider}-{runtime}-egress"),
            }),
            cluster.urls(),
            runtime,
            args,
            env,
        );
        let repo = git_repo(cluster.dir.path());
        let r = submit_yaml(&url, &manifest(&repo, runtime, provider, mount));
        assert!(r.ok(), "submission refused: {r:?}");
        let id = r.body["task_submitted"]["task"].as_u64().expect("task id");
        let task = wait_task_state(
            &url,
            id,
            &["COMPLETED", "FAILED", "FAILED_PRESERVED"],
            if runtime == "kvm" {
                VM_TASK_TIMEOUT
            } else {
                TASK_TIMEOUT
            },
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

    /// The tools of the `tool_call` events the worker wrote while the CLI ran, in order, each
    /// numbered one after the other.
    fn tool_calls(&self) -> Vec<String> {
        let events = self.output("events");
        let calls: Vec<Value> = events
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == "tool_call")
            .collect();
        for (i, call) in calls.iter().enumerate() {
            assert_eq!(call["tool_calls"], i as u64 + 1, "{events}");
        }
        calls
            .iter()
            .map(|c| c["tool"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// The provider's account in the task's replicated record.
    fn provider(&self) -> Value {
        http_get(&format!("{}/api/v1/tasks/{}/provider", self.url, self.id))
            .expect("provider progress")
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

    /// Injected at egress, the worker served the proxy and closed it at the end, and the key
    /// reached no file of the worker's.
    fn check_delivery(&self, delivery: Delivery) {
        // The driver writes `egress_closed` once the end is committed: it may follow the state.
        if delivery != Delivery::File {
            let _ = wait_until(Duration::from_secs(10), || {
                self.output("events").contains("egress_closed")
            });
        }
        let events = self.output("events");
        let egress = events.contains("egress_closed");
        assert_eq!(egress, delivery != Delivery::File, "{events}");
        let log = std::fs::read_to_string(&self._worker.log).unwrap_or_default();
        assert_eq!(
            log.contains("egress request relayed"),
            delivery != Delivery::File
        );
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
         observation: {{ retention_class: short, redaction_profile: credentials }}\n",
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

/// Issue 14 item 8 with the real CLIs: the key never enters the sandbox; the worker's proxy
/// puts it in the request on its way to the model server, over TLS.
#[test]
fn claude_code_completes_a_task_with_its_key_injected_at_egress() {
    claude_code_completes_a_task_with("process", Delivery::Egress("x-api-key", ""));
}

#[test]
fn codex_completes_a_task_with_its_key_injected_at_egress() {
    codex_completes_a_task_with("process", Delivery::Egress("authorization", "Bearer "));
}

/// The same in a container: the proxy listens on the container's own loopback.
#[test]
fn claude_code_completes_a_task_in_docker_with_its_key_injected_at_egress() {
    claude_code_completes_a_task_with("docker", Delivery::Egress("x-api-key", ""));
}

#[test]
fn codex_completes_a_task_in_docker_with_its_key_injected_at_egress() {
    codex_completes_a_task_with("docker", Delivery::Egress("authorization", "Bearer "));
}

/// The pinned CLIs in a KVM guest (QEMU's software emulation here): the VM image's
/// `providers/` share, the model server reached through the guest's `outbound` NIC. One guest
/// at a time: two at once under emulation starve the other tests on two cores.
static ONE_GUEST_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_guest_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_GUEST_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

#[test]
fn claude_code_completes_a_task_in_a_vm() {
    let _one = one_guest_at_a_time();
    claude_code_completes_a_task("kvm");
}

#[test]
fn codex_completes_a_task_in_a_vm() {
    let _one = one_guest_at_a_time();
    codex_completes_a_task("kvm");
}

fn claude_code_completes_a_task(runtime: &str) {
    claude_code_completes_a_task_with(runtime, Delivery::File);
}

/// Claude Code reads the task, edits a file, writes one, runs a command and answers; the patch
/// has the edit, the model server saw what the CLI sent (the model, the tools, the key from
/// the credential lease, the tool results), and the key is in none of the task's output.
fn claude_code_completes_a_task_with(runtime: &str, delivery: Delivery) {
    const KEY: &str = "sk-ant-scripted-0123456789abcdef";
    let run = ProviderRun::start_with(
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
        delivery,
    );
    run.check_outputs("hello.txt", KEY);
    run.check_delivery(delivery);
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
    // Each call was told while the CLI ran.
    let told = run.tool_calls();
    assert_eq!(told.len(), 5, "{told:?}");
    assert_eq!(told.iter().filter(|t| *t == "Read").count(), 2, "{told:?}");
    assert_eq!(told.last().map(String::as_str), Some("Bash"), "{told:?}");
    let recorded = run.provider();
    assert_eq!(recorded["progress"]["tool_calls"], 5, "{recorded:#}");
    assert_eq!(recorded["progress"]["current_tool"], "Bash", "{recorded:#}");
    assert_eq!(
        recorded["progress"]["model"], "claude-scripted-1",
        "{recorded:#}"
    );
    assert!(
        recorded["progress"]["cost_micro_usd"].as_u64().is_some(),
        "{recorded:#}"
    );
}

/// Codex (`codex exec --json`) does the same through its `exec_command` tool: the worker's
/// `OPENAI_BASE_URL` became its model provider, the key reached it as a bearer token, and
/// the command output came back to the model.
fn codex_completes_a_task(runtime: &str) {
    codex_completes_a_task_with(runtime, Delivery::File);
}

fn codex_completes_a_task_with(runtime: &str, delivery: Delivery) {
    const KEY: &str = "sk-openai-scripted-0123456789abcdef";
    let run = ProviderRun::start_with(
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
        delivery,
    );
    run.check_outputs("hello-codex.txt", KEY);
    run.check_delivery(delivery);
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
    assert_eq!(
        run.tool_calls(),
        ["command_execution", "command_execution"],
        "each call told while the CLI ran"
    );
    let recorded = run.provider();
    assert_eq!(recorded["progress"]["tool_calls"], 2, "{recorded:#}");
    assert!(
        recorded["progress"]["input_tokens"].as_u64() > Some(0),
        "{recorded:#}"
    );
}
