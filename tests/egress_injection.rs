//! Issue 14 item 8 end to end: a credential an admin binds to an upstream never enters the
//! sandbox. A real node, real workers (bubblewrap, cgroups, an `isolated` namespace of
//! loopback only; dockerd, an `outbound` container; libvirt, a guest without a NIC), and a TLS
//! stand-in for the upstream in a namespace of the test's own: the upstream gets the key,
//! while no process of the sandbox has it in its environment, command line or memory (a
//! guest's: QEMU's, its RAM included), and no file in the sandbox holds it.

mod egress_upstream;
mod support;

use std::path::Path;
use std::time::Duration;

use egress_upstream::Upstream;
use support::*;

const TASK_TIMEOUT: Duration = Duration::from_secs(120);

/// What the provider does: calls the API through its base URL with its placeholder, and once
/// with a forged one; waits while the test looks at its processes and revokes the
/// credential; calls again.
const SCRIPT: &str = r#"echo "file=${ANTHROPIC_API_KEY_FILE:-none}"
python3 - <<'PY'
import os, urllib.request, urllib.error
base, key = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_API_KEY"]
def post(k):
    r = urllib.request.Request(base + "/v1/messages?beta=true", data=b'{"model":"m"}', method="POST",
        headers={"x-api-key": k, "content-type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=30) as a: return a.status, a.read().decode().replace("\n", " ")
    except urllib.error.HTTPError as e: return e.code, e.read().decode()
print("good", *post(key), flush=True)
print("forged", *post("sqd_egress_forged_0123456789abcdef"), flush=True)
import time; time.sleep(20)
print("after", *post(key), flush=True)
PY
"#;

/// Calls the API, prints the file credential's value (for redaction to find), then calls again
/// after the test has killed and restarted the worker.
const RESTART_SCRIPT: &str = r#"python3 - <<'PY'
import os, urllib.request, urllib.error, time
base, key = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_API_KEY"]
def post(k):
    r = urllib.request.Request(base + "/v1/messages", data=b'{"model":"m"}', method="POST",
        headers={"x-api-key": k, "content-type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=30) as a: return a.status, a.read().decode().replace("\n", " ")
    except urllib.error.HTTPError as e: return e.code, e.read().decode()
    except OSError as e: return "unreachable", str(e)
print("file", open(os.environ["GH_TOKEN_FILE"]).read(), flush=True)
print("before", *post(key), flush=True)
time.sleep(15)
print("after", *post(key), flush=True)
PY
"#;

/// The same calls from a container of the agent image, which has busybox's `wget`: the
/// answer, or wget's line naming the status it refused.
const WGET_SCRIPT: &str = r#"echo "file=${ANTHROPIC_API_KEY_FILE:-none}"
call() { wget -q -O - --header "x-api-key: $1" --header "content-type: application/json" --post-data '{"model":"m"}' "$ANTHROPIC_BASE_URL/v1/messages?beta=true" 2>&1 | tr '\n' ' '; }
echo "good $(call "$ANTHROPIC_API_KEY")"
echo "forged $(call sqd_egress_forged_0123456789abcdef)"
sleep 8
"#;

fn manifest(repo: &Path, vm: &str) -> String {
    manifest_with(repo, vm, SCRIPT)
}

fn manifest_with(repo: &Path, vm: &str, script: &str) -> String {
    manifest_with_refs(
        repo,
        vm,
        script,
        "    - { id: cred_up, mount: anthropic_api_key }\n",
    )
}

fn manifest_with_refs(repo: &Path, vm: &str, script: &str, refs: &str) -> String {
    let indented: String = script.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: egress\nrepository:\n  url: {repo}\n  \
         branch: main\nagent:\n  prompt: call the API\n  provider: script\n  script: |\n{indented}\
         vm:\n{vm}startup_profile:\n  id: s\n  trigger: on_instance_ready\n  \
         session: {{ launcher: script, workdir: /workspace, cols: 80, rows: 24 }}\n  \
         credential_refs:\n{refs}  \
         readiness: {{ probes: [] }}\n  \
         observation: {{ retention_class: short, redaction_profile: credentials }}\n",
        repo = repo.display()
    )
}

fn bind(url: &str, upstream: &str) {
    let out = cli(url)
        .args(["--endpoint", url, "credential", "egress-set", "cred_up"])
        .args(["--upstream", upstream, "--header", "x-api-key"])
        .output()
        .expect("squadron credential egress-set");
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn a_credential_injected_at_egress_reaches_its_upstream_and_never_the_sandbox() {
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = git_repo(dir.path());
    let upstream = Upstream::start(dir.path());
    let worker = WorkerProc::start_with(
        dir.path(),
        &unique_worker_id("egress"),
        vec![url.clone()],
        "process",
        vec!["--egress-ca".into(), upstream.ca.display().to_string()],
    );
    let secret = format!("sk-egress-test-{}", std::process::id() * 7919);
    put_credential(&url, "cred_up", &secret);

    // The upstream is the admin's: a binding that is not https is refused, naming the field.
    let plain = cli(&url)
        .args(["--endpoint", &url, "credential", "egress-set", "cred_up"])
        .args(["--upstream", "http://example.com", "--header", "x-api-key"])
        .output()
        .expect("cli");
    assert!(!plain.status.success());
    assert!(
        String::from_utf8_lossy(&plain.stderr).contains("egress.upstream"),
        "{plain:?}"
    );
    bind(&url, &upstream.url());
    let listed = http_get(&format!("{url}/api/v1/credentials")).expect("list");
    assert_eq!(listed[0]["egress"]["upstream"], upstream.url(), "{listed}");

    // A sandbox that cannot take it is refused at submission, naming the field; nothing stored.
    let before = http_get(&format!("{url}/api/v1/tasks")).expect("tasks");
    for (vm, field) in [
        (
            "  runtime: docker\n  network_mode: full\n",
            "vm.network_mode",
        ),
        ("  network_mode: full\n", "vm.network_mode"),
    ] {
        let refused = submit_yaml(&url, &manifest(&repo, vm));
        assert_eq!(refused.status, 400, "{refused:?}");
        assert_eq!(refused.body["field"], field, "{refused:?}");
    }
    assert_eq!(
        http_get(&format!("{url}/api/v1/tasks")).expect("tasks"),
        before
    );

    // Docker: the proxy listens in the container's own namespace, on its loopback, before the
    // sandbox agent starts the provider.
    let docker_id = unique_worker_id("egress-docker");
    let docker = WorkerProc::start_with(
        dir.path(),
        &docker_id,
        vec![url.clone()],
        "docker",
        vec!["--egress-ca".into(), upstream.ca.display().to_string()],
    );
    run_in_docker(&url, &repo, &docker, &docker_id, &secret);
    let requests = upstream.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0]["headers"]["x-api-key"], secret, "{requests:?}");
    assert_eq!(requests[0]["path"], "/api/v1/messages?beta=true");
    let log = std::fs::read_to_string(&docker.log).unwrap_or_default();
    assert!(
        !log.contains(&secret),
        "the Docker worker's log holds the value"
    );
    assert_no_bytes_below(&docker.data_dir, secret.as_bytes(), "worker data", "inbox");

    // `isolated`: no network but its own loopback, where the worker's proxy listens (the
    // real CLIs run it under `outbound`, in tests/real_providers.rs).
    let reply = submit_yaml(
        &url,
        &manifest(&repo, "  runtime: process\n  network_mode: isolated\n"),
    );
    assert!(reply.ok(), "{reply:?}");
    let task = reply.body["task_submitted"]["task"].as_u64().expect("id");
    wait_task_state(&url, task, &["RUNNING"], TASK_TIMEOUT);
    let stdout_url = format!("{url}/api/v1/tasks/{task}/logs?stream=stdout");
    wait_until(TASK_TIMEOUT, || {
        http_text(&stdout_url).is_ok_and(|(_, t)| t.contains("forged"))
    })
    .expect("the provider called the API");

    // While it runs: its processes hold the placeholder, never the value.
    assert_placeholder_holders_lack(secret.as_bytes(), "the sandbox");
    assert_no_cmdline_or_environ_holds(&secret);
    // Revoking the credential ends the lease: the proxy refuses from then on.
    let revoke = cli(&url)
        .args(["--endpoint", &url, "credential", "revoke", "cred_up"])
        .output()
        .expect("squadron credential revoke");
    assert!(revoke.status.success(), "{revoke:?}");

    let t = wait_task_state(&url, task, &["COMPLETED", "FAILED"], TASK_TIMEOUT);
    assert_eq!(t["state"], "COMPLETED", "{t:#}");
    let (_, stdout) = http_text(&stdout_url).expect("stdout");
    assert!(stdout.contains("file=none"), "no file for it: {stdout}");
    assert!(
        stdout.contains("good 200 data: one  data: two"),
        "the answer streamed back: {stdout}"
    );
    assert!(stdout.contains("forged 401"), "{stdout}");
    assert!(
        stdout.contains("after 403") && stdout.contains("ended: credential cred_up revoked"),
        "the revoked lease is refused: {stdout}"
    );

    // The upstream got the value, once, in its header, on the bound path; never the
    // placeholder. The forged request and the one after the revocation never left the worker.
    let requests = upstream.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let got = &requests[1];
    assert_eq!(got["path"], "/api/v1/messages?beta=true", "{got}");
    assert_eq!(got["headers"]["x-api-key"], secret, "{got}");
    assert_eq!(got["body"], "{\"model\":\"m\"}", "{got}");
    assert!(!got.to_string().contains("sqd_egress_"), "{got}");

    // The driver closes the proxy once the end is committed: the event may follow the state.
    let events = task_events_with(&url, task, "egress_closed");
    assert!(events.contains("egress_closed"), "{events}");
    assert_no_bytes_below(&worker.data_dir, secret.as_bytes(), "worker data", "inbox");
    let log = std::fs::read_to_string(&worker.log).unwrap_or_default();
    assert!(!log.contains(&secret), "the worker's log holds the value");
    assert!(
        log.contains("egress request relayed"),
        "the relay is logged"
    );
    assert_no_bytes_below(
        cluster.dir.path(),
        secret.as_bytes(),
        "node data and logs",
        "",
    );
}

/// How long a guest task may take, booting under software emulation included.
const GUEST_TASK_TIMEOUT: Duration = Duration::from_secs(300);
/// A guest's memory in the KVM test, and so the size of QEMU's mapping of its RAM.
const GUEST_MEMORY_BYTES: u64 = 512 << 20;

/// A KVM guest (QEMU's software emulation here) in `isolated`, which has no NIC at all: the
/// provider calls its own loopback, where the guest's agent accepts and carries each connection
/// over its virtio-serial channel to the worker's proxy. The upstream gets the value; QEMU's
/// memory, the guest's RAM included, holds the placeholder the provider has and never the
/// value; the guest's files and the worker's neither.
#[test]
fn a_kvm_guest_reaches_its_upstream_over_the_agent_channel_and_never_holds_the_value() {
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = git_repo(dir.path());
    let upstream = Upstream::start(dir.path());
    let mut args = kvm_worker_args(1);
    args.extend(["--egress-ca".into(), upstream.ca.display().to_string()]);
    let worker = WorkerProc::start_with(
        dir.path(),
        &unique_worker_id("egress-kvm"),
        vec![url.clone()],
        "kvm",
        args,
    );
    let secret = format!("sk-egress-guest-{}", std::process::id() * 7919);
    put_credential(&url, "cred_up", &secret);
    bind(&url, &upstream.url());

    let vm = format!(
        "  runtime: kvm\n  network_mode: isolated\n  memory: {}Mi\n",
        GUEST_MEMORY_BYTES >> 20
    );
    // The guest stays up for the memory scans after its calls.
    let script = WGET_SCRIPT.replace("sleep 8", "sleep 40");
    let (task, stdout_url) = submit_calling(&url, &manifest_with(&repo, &vm, &script), &worker);

    // While it runs: the guest's memory holds the placeholder (the scan sees it), not the value.
    let placeholder = placeholder_under(&worker.data_dir);
    let qemu = qemu_pids_of(&worker.data_dir);
    assert_eq!(qemu.len(), 1, "one guest: {qemu:?}");
    let whole = GUEST_MEMORY_BYTES * 2;
    assert!(
        memory_holds_within(qemu[0], placeholder.as_bytes(), whole),
        "the guest's memory does not hold the provider's placeholder: the scan misses it"
    );
    assert!(
        !memory_holds_within(qemu[0], secret.as_bytes(), whole),
        "the guest's memory holds the value"
    );
    assert_no_cmdline_or_environ_holds(&secret);

    assert_wget_task_ended(&url, task, &stdout_url, &secret);
    let requests = upstream.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0]["headers"]["x-api-key"], secret, "{requests:?}");
    assert_eq!(requests[0]["path"], "/api/v1/messages?beta=true");
    let log = std::fs::read_to_string(&worker.log).unwrap_or_default();
    assert!(!log.contains(&secret), "the worker's log holds the value");
    assert_no_bytes_below(&worker.data_dir, secret.as_bytes(), "worker data", "inbox");
    for kvm_dir in kvm_dirs_of(&worker.data_dir) {
        assert_no_bytes_below(&kvm_dir, secret.as_bytes(), "the KVM runtime's files", "");
    }
}

/// The placeholder the worker wrote into the one `egress.env` below `data_dir`.
fn placeholder_under(data_dir: &Path) -> String {
    let tasks = data_dir.join("tasks");
    let mut found = Vec::new();
    for task in std::fs::read_dir(&tasks).into_iter().flatten().flatten() {
        let env = task.path().join("run").join("egress.env");
        if let Ok(text) = std::fs::read_to_string(&env) {
            found.extend(
                text.lines()
                    .filter_map(|l| l.strip_prefix("export ANTHROPIC_API_KEY="))
                    .map(|v| v.trim_matches('\'').to_string()),
            );
        }
    }
    assert_eq!(
        found.len(),
        1,
        "one egress.env below {}: {found:?}",
        tasks.display()
    );
    assert!(found[0].starts_with("sqd_egress_"), "{found:?}");
    found.remove(0)
}

/// No host process has `secret` on its command line or in its environment.
fn assert_no_cmdline_or_environ_holds(secret: &str) {
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        for file in ["cmdline", "environ"] {
            let path = entry.path().join(file);
            let bytes = std::fs::read(&path).unwrap_or_default();
            assert!(
                !memchr_find(&bytes, secret.as_bytes()),
                "{} holds the value",
                path.display()
            );
        }
    }
}

/// A task in an `outbound` container: it calls through the proxy, the forged placeholder is
/// refused, and neither the container's configuration nor its output holds the value.
fn run_in_docker(url: &str, repo: &Path, docker: &WorkerProc, worker: &str, secret: &str) {
    let vm = "  runtime: docker\n  network_mode: outbound\n";
    let (task, stdout_url) = submit_calling(url, &manifest_with(repo, vm, WGET_SCRIPT), docker);
    // While it runs: the container's configuration has the placeholder's file, not the value.
    let ps = std::process::Command::new("docker")
        .args([
            "ps",
            "-q",
            "--filter",
            &format!("label=squadron.worker={worker}"),
        ])
        .output()
        .expect("docker ps");
    let ids = String::from_utf8_lossy(&ps.stdout).into_owned();
    assert_eq!(ids.split_whitespace().count(), 1, "{ids:?}");
    let inspect = std::process::Command::new("docker")
        .arg("inspect")
        .args(ids.split_whitespace())
        .output()
        .expect("docker inspect");
    let inspect = String::from_utf8_lossy(&inspect.stdout);
    assert!(inspect.contains("/mnt/run"), "{inspect}");
    assert!(!inspect.contains(secret), "docker inspect holds the value");
    assert_placeholder_holders_lack(secret.as_bytes(), "the container");
    assert_wget_task_ended(url, task, &stdout_url, secret);
}

/// Submits `manifest` and waits until its provider made its calls (its stdout names the
/// forged one), as long as a guest may take to boot; returns the task and its stdout's URL.
fn submit_calling(url: &str, manifest: &str, worker: &WorkerProc) -> (u64, String) {
    submit_until(url, manifest, worker, "forged", GUEST_TASK_TIMEOUT)
}

/// Submits `manifest` and waits up to `timeout` until its stdout holds `seen`; returns the task
/// and its stdout's URL.
fn submit_until(
    url: &str,
    manifest: &str,
    worker: &WorkerProc,
    seen: &str,
    timeout: Duration,
) -> (u64, String) {
    let reply = submit_yaml(url, manifest);
    assert!(reply.ok(), "{reply:?}");
    let task = reply.body["task_submitted"]["task"].as_u64().expect("id");
    let stdout_url = format!("{url}/api/v1/tasks/{task}/logs?stream=stdout");
    wait_until(timeout, || {
        http_text(&stdout_url).is_ok_and(|(_, t)| t.contains(seen))
    })
    .unwrap_or_else(|_| {
        panic!(
            "no {seen:?} on stdout: {:?}\n{:?}\n{}",
            http_text(&stdout_url),
            http_get(&format!("{url}/api/v1/tasks/{task}")),
            tail(&worker.log)
        )
    });
    (task, stdout_url)
}

/// The end of a task running `WGET_SCRIPT`: COMPLETED, the answer streamed back through the
/// proxy, the forged placeholder refused, no file for the credential, the proxy closed, and
/// the value in no event.
fn assert_wget_task_ended(url: &str, task: u64, stdout_url: &str, secret: &str) {
    let t = wait_task_state(url, task, &["COMPLETED", "FAILED"], GUEST_TASK_TIMEOUT);
    let (_, stdout) = http_text(stdout_url).expect("stdout");
    assert_eq!(t["state"], "COMPLETED", "{t:#}\n{stdout}");
    assert!(stdout.contains("file=none"), "no file for it: {stdout}");
    assert!(
        stdout.contains("good data: one  data: two"),
        "the answer streamed back: {stdout}"
    );
    assert!(
        stdout.contains("forged") && stdout.contains("401"),
        "a forged placeholder is refused: {stdout}"
    );
    let events = task_events_with(url, task, "egress_closed");
    assert!(events.contains("egress_closed"), "{events}");
    assert!(!events.contains(secret), "{events}");
}

/// A worker killed with SIGKILL while an attempt with an injected credential runs, then
/// restarted: it adopts the sandbox, takes the credential lease again and serves the proxy
/// again in the sandbox's namespace, accepting the placeholder the provider already holds; and
/// what the provider printed of a file credential is still redacted at the end, though the
/// values went with the killed worker.
/// A process task with an injected credential (`cred_up`) and a file one (`cred_file`) whose
/// provider has made its first call (`RESTART_SCRIPT`), on a worker the test kills and starts.
struct RestartCase {
    _cluster: Cluster,
    url: String,
    _dir: tempfile::TempDir,
    upstream: Upstream,
    worker: WorkerProc,
    task: u64,
    stdout_url: String,
}

impl RestartCase {
    fn start(prefix: &str, secret: &str, file_secret: &str) -> RestartCase {
        let cluster = Cluster::start(1);
        let url = cluster.url(1);
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = git_repo(dir.path());
        let upstream = Upstream::start(dir.path());
        let worker = WorkerProc::start_with(
            dir.path(),
            &unique_worker_id(prefix),
            vec![url.clone()],
            "process",
            vec!["--egress-ca".into(), upstream.ca.display().to_string()],
        );
        put_credential(&url, "cred_up", secret);
        put_credential(&url, "cred_file", file_secret);
        bind(&url, &upstream.url());
        let refs = "    - { id: cred_up, mount: anthropic_api_key }\n    - { id: cred_file, mount: gh_token }\n";
        let vm = "  runtime: process\n  network_mode: isolated\n";
        let manifest = manifest_with_refs(&repo, vm, RESTART_SCRIPT, refs);
        let (task, stdout_url) = submit_until(&url, &manifest, &worker, "before", TASK_TIMEOUT);
        RestartCase {
            _cluster: cluster,
            url,
            _dir: dir,
            upstream,
            worker,
            task,
            stdout_url,
        }
    }
}

#[test]
fn a_restarted_worker_serves_an_adopted_attempts_egress_again_and_still_redacts() {
    let secret = format!("sk-egress-restart-{}", std::process::id() * 7919);
    let file_secret = format!("ghp-file-restart-{}", std::process::id() * 104_729);
    // Whole: the cluster and the directories live as long as the case.
    let mut case = RestartCase::start("egress-restart", &secret, &file_secret);
    let (url, task, stdout_url) = (case.url.clone(), case.task, case.stdout_url.clone());
    let (worker, upstream) = (&mut case.worker, &case.upstream);
    worker.kill();
    worker.spawn();
    let t = wait_task_state(&url, task, &["COMPLETED", "FAILED"], TASK_TIMEOUT);
    let (_, stdout) = http_text(&stdout_url).expect("stdout");
    assert_eq!(
        t["state"],
        "COMPLETED",
        "{t:#}\n{stdout}\n{}",
        tail(&worker.log)
    );
    assert_eq!(t["attempt"], 1, "the same attempt: {t:#}");
    assert!(stdout.contains("before 200"), "{stdout}");
    assert!(
        stdout.contains("after 200 data: one  data: two"),
        "the proxy serves again after the restart: {stdout}"
    );
    assert!(
        stdout.contains("file [REDACTED:cred_file]") && !stdout.contains(&file_secret),
        "the file credential is redacted after the restart: {stdout}"
    );
    let requests = upstream.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    for got in &requests {
        assert_eq!(got["headers"]["x-api-key"], secret, "{got}");
    }
    let events = task_events_with(&url, task, "egress_closed");
    assert!(
        events.contains("\"credentials_resumed\"") && events.contains("\"egress\":true"),
        "{events}"
    );
    assert!(events.contains("egress_closed"), "{events}");
    assert_no_bytes_below(&worker.data_dir, secret.as_bytes(), "worker data", "inbox");
    assert_no_bytes_below(
        &worker.data_dir,
        file_secret.as_bytes(),
        "worker data",
        "inbox",
    );
}

/// The same restart, but the credential is revoked and put again with a new value while the
/// worker is down: the resumed attempt asks for the lease it held (`only_lease`), which ended,
/// so it is given none — its proxy is not served again and the new value never reaches the
/// upstream. A plain grant would have recorded a new lease with the new value and served it.
#[test]
fn a_credential_revoked_and_put_again_while_the_worker_is_down_never_reaches_the_upstream() {
    let secret = format!("sk-egress-old-{}", std::process::id() * 7919);
    let next = format!("sk-egress-new-{}", std::process::id() * 104_729);
    let mut case = RestartCase::start("egress-revoked", &secret, "ghp-file-unused-value");
    let (url, task) = (case.url.clone(), case.task);
    let (worker, upstream) = (&mut case.worker, &case.upstream);
    worker.kill();
    let revoke = cli(&url)
        .args(["--endpoint", &url, "credential", "revoke", "cred_up"])
        .output()
        .expect("squadron credential revoke");
    assert!(revoke.status.success(), "{revoke:?}");
    put_credential(&url, "cred_up", &next);
    bind(&url, &upstream.url());
    worker.spawn();
    let t = wait_task_state(&url, task, &["COMPLETED", "FAILED"], TASK_TIMEOUT);
    let requests = upstream.requests();
    assert_eq!(
        requests.len(),
        1,
        "only the call before the kill: {requests:?}"
    );
    assert_eq!(requests[0]["headers"]["x-api-key"], secret, "{t:#}");
    let events = std::fs::read_to_string(
        worker
            .task_dir(task)
            .join("outbox")
            .join("progress")
            .join("events.jsonl"),
    )
    .expect("events");
    assert!(
        events.contains("\"credentials_not_resumed\"") && events.contains("only_lease"),
        "{events}"
    );
    assert!(!events.contains("\"credentials_resumed\""), "{events}");
}
