//! INV-13 end to end: a value stored with `squadron credential put` reaches only the file the
//! sandbox reads, sealed everywhere else. A real node (RocksDB on disk), a real worker with
//! bubblewrap and cgroups, a git repository made here.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use support::*;

const TASK_TIMEOUT: Duration = Duration::from_secs(120);

fn manifest(repo: &Path, runtime: &str, credential: &str, script: &str) -> String {
    let indented: String = script.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: creds\nrepository:\n  url: {repo}\n  \
         branch: main\nagent:\n  prompt: use the key\n  provider: script\n  script: |\n{indented}\
         vm:\n  runtime: {runtime}\nstartup_profile:\n  id: s\n  trigger: on_instance_ready\n  \
         session: {{ launcher: script, workdir: /workspace, cols: 80, rows: 24 }}\n  \
         credential_refs:\n    - {{ id: {credential}, mount: api_key }}\n  readiness: {{ probes: [] }}\n  \
         observation: {{ retention_class: short, redaction_profile: credentials }}\n",
        repo = repo.display()
    )
}

fn task_id(reply: &Reply) -> u64 {
    assert!(reply.ok(), "submission refused: {reply:?}");
    reply.body["task_submitted"]["task"]
        .as_u64()
        .expect("task id")
}

fn session_dir(worker: &WorkerProc, task: u64) -> PathBuf {
    worker
        .data_dir
        .join("credentials")
        .join(format!("task-{task}-a1"))
}

fn leases(url: &str, task: u64) -> Vec<Value> {
    let v = http_get(&format!("{url}/api/v1/tasks/{task}/credential-leases")).expect("leases");
    v.as_array().cloned().unwrap_or_default()
}

/// One task on `runtime`: the file, the output and patch redacted, the lease ended, nothing
/// left of the value anywhere the worker keeps.
fn run_and_check(url: &str, repo: &Path, worker: &WorkerProc, runtime: &str, secret: &str) {
    // The provider reads the value from its file (0400, the sandbox user's), prints it, and
    // commits a copy; then waits while the test looks at every process.
    let script =
        "set -e\nstat -c '%a %u' \"$API_KEY_FILE\"\necho \"key: $(cat \"$API_KEY_FILE\")\"\n\
                  cat \"$API_KEY_FILE\" >> README.md\ntest ! -w \"$API_KEY_FILE\"\nsleep 6\n";
    let task = task_id(&submit_yaml(
        url,
        &manifest(repo, runtime, "cred_ci", script),
    ));
    wait_task_state(url, task, &["RUNNING"], TASK_TIMEOUT);
    let host = session_dir(worker, task);
    assert!(
        host.join("api_key").exists(),
        "the session file exists while it runs"
    );
    assert!(assert_no_cmdline_holds(secret.as_bytes()) > 10);
    if runtime == "docker" {
        let inspect = docker_inspect_all();
        assert!(
            inspect.contains("/run/squadron/credentials/"),
            "the bind is there"
        );
        assert!(!inspect.contains(secret), "docker inspect shows the secret");
    }
    assert_live_output_is_redacted(url, task, secret);

    let done = wait_task_state(url, task, &["COMPLETED", "FAILED"], TASK_TIMEOUT);
    let (_, stdout) =
        http_text(&format!("{url}/api/v1/tasks/{task}/logs?stream=stdout")).expect("logs");
    assert_eq!(done["state"], "COMPLETED", "{runtime}: {done:#}\n{stdout}");
    assert!(stdout.contains("400 65534"), "{stdout}");
    assert!(stdout.contains("key: [REDACTED:cred_ci]"), "{stdout}");
    assert!(!stdout.contains(secret), "{stdout}");
    let mut redacted_artifacts = 0;
    for name in done["artifacts"].as_array().cloned().unwrap_or_default() {
        let name = name.as_str().expect("name");
        let (_, body) =
            http_text(&format!("{url}/api/v1/tasks/{task}/artifacts/{name}")).expect("artifact");
        assert!(!body.contains(secret), "artifact {name} holds the secret");
        redacted_artifacts += usize::from(body.contains("[REDACTED:cred_ci]"));
    }
    assert!(
        redacted_artifacts > 0,
        "the copy reached no artifact: {done:#}"
    );

    // The lease ended with the task; the files and the tmpfs are gone.
    let ended = leases(url, task);
    assert_eq!(ended.len(), 1, "{ended:?}");
    let reason = ended[0]["revoked_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("COMPLETED"), "{ended:?}");
    assert!(!host.exists(), "{} outlived the task", host.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains(&host.display().to_string()));

    // Nowhere else: the task record, events, logs, RocksDB, the worker's files.
    let record = http_get(&format!("{url}/api/v1/tasks/{task}")).expect("task");
    assert!(!record.to_string().contains(secret));
    let (_, events) =
        http_text(&format!("{url}/api/v1/tasks/{task}/logs?stream=events")).expect("events");
    assert!(
        events.contains("credentials_leased") && !events.contains(secret),
        "{events}"
    );
}

/// While the task runs, its output as the logs API and the live stream serve it shows the
/// stand-in, from every offset a reader may start at.
fn assert_live_output_is_redacted(url: &str, task: u64, secret: &str) {
    let logs = format!("{url}/api/v1/tasks/{task}/logs?stream=stdout");
    let mut seen = String::new();
    wait_until(Duration::from_secs(30), || {
        seen = http_text(&logs).map(|(_, t)| t).unwrap_or_default();
        seen.contains("key: ")
    })
    .unwrap_or_else(|_| panic!("no output while running: {seen:?}"));
    assert!(seen.contains("key: [REDACTED:cred_ci]"), "{seen:?}");
    let head = &secret[..8];
    for offset in 0..seen.len() {
        let (_, part) = http_text(&format!("{logs}&offset={offset}")).expect("logs");
        assert!(!part.contains(head), "offset {offset}: {part:?}");
    }
    let (_, tail) = http_text(&format!("{logs}&tail=5")).expect("tail");
    assert!(!tail.contains(head), "{tail:?}");
    // The live stream (what the WebSocket relays): until the frame with the line arrives.
    let mut frames = String::new();
    let _ = wait_until(Duration::from_secs(20), || {
        let (_, body) = http_text(&format!(
            "{url}/api/v1/tasks/{task}/logs?stream=all&follow=true"
        ))
        .unwrap_or_default();
        frames = body;
        frames.contains("key: ")
    });
    assert!(frames.contains("[REDACTED:cred_ci]"), "{frames}");
    assert!(!frames.contains(head), "{frames}");
}

/// `docker inspect` of every container there is.
fn docker_inspect_all() -> String {
    let ids = std::process::Command::new("docker")
        .args(["ps", "-aq"])
        .output()
        .expect("docker ps");
    let ids: Vec<String> = String::from_utf8_lossy(&ids.stdout)
        .split_whitespace()
        .map(String::from)
        .collect();
    assert!(!ids.is_empty(), "no container runs");
    let out = std::process::Command::new("docker")
        .arg("inspect")
        .args(&ids)
        .output()
        .expect("docker inspect");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn inv_13_a_credential_reaches_only_its_sandbox_file_and_is_gone_at_the_end() {
    // Snapshots every 16 entries: the scan of the node's files below covers one built after
    // the value was stored (`snapshot/current.snap`).
    let cluster = Cluster::start_with(
        1,
        ClusterOptions {
            snapshot_after_entries: 16,
            keep_entries_after_snapshot: 8,
            ..ClusterOptions::default()
        },
    );
    let url = cluster.url(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = git_repo(dir.path());
    let worker_id = unique_worker_id("cred");
    let mut worker = WorkerProc::start(dir.path(), &worker_id, vec![url.clone()], "process");
    let docker_id = unique_worker_id("cred-docker");
    let docker = WorkerProc::start(dir.path(), &docker_id, vec![url.clone()], "docker");
    let secret = format!("sk-squadron-test-{}", std::process::id() * 7919);
    put_credential(&url, "cred_ci", &secret);
    let stored_at = status(&url)["applied"].as_u64().expect("applied");

    // A typo fails at submission, naming the credential, and stores nothing.
    let before = http_get(&format!("{url}/api/v1/tasks")).expect("tasks");
    let typo = submit_yaml(&url, &manifest(&repo, "process", "cred_typo", "true"));
    assert_eq!(typo.status, 404, "{typo:?}");
    assert!(typo.body.to_string().contains("cred_typo"), "{typo:?}");
    assert_eq!(
        http_get(&format!("{url}/api/v1/tasks")).expect("tasks"),
        before
    );

    run_and_check(&url, &repo, &worker, "process", &secret);
    run_and_check(&url, &repo, &docker, "docker", &secret);
    let listed = http_get(&format!("{url}/api/v1/credentials")).expect("list");
    assert!(!listed.to_string().contains(&secret));
    let snapshot = status(&url)["snapshot"].as_u64().unwrap_or(0);
    assert!(
        snapshot > stored_at,
        "no snapshot after the value was stored at {stored_at} (last: {snapshot})"
    );
    assert_eq!(listed[0]["version"], 1, "{listed}");
    assert_no_bytes_below(
        cluster.dir.path(),
        secret.as_bytes(),
        "node data and logs",
        "",
    );
    // The work tree is the agent's own: it copied the value there on purpose (the copy
    // reached the patch redacted, checked above).
    for w in [&worker, &docker] {
        assert_no_bytes_below(&w.data_dir, secret.as_bytes(), "worker data", "inbox");
        let log = std::fs::read_to_string(&w.log).unwrap_or_default();
        assert!(
            !log.contains(&secret),
            "the log of {} holds the secret",
            w.id
        );
    }

    // kill -9 of the worker while a task holds the value: the restarted worker wipes the
    // session at once, and the lease ends with the task.
    let task = task_id(&submit_yaml(
        &url,
        &manifest(&repo, "process", "cred_ci", "sleep 6\n"),
    ));
    wait_task_state(&url, task, &["RUNNING"], TASK_TIMEOUT);
    let host = session_dir(&worker, task);
    assert!(host.join("api_key").exists());
    worker.kill();
    worker.spawn();
    assert!(
        !host.exists(),
        "a restarted worker wipes what it was handed before"
    );
    wait_task_state(&url, task, &["COMPLETED", "FAILED"], TASK_TIMEOUT);
    let ended = leases(&url, task);
    assert!(ended[0]["revoked_at_ms"].is_u64(), "{ended:?}");

    // kill -9 while the provider holds a value it printed, and the credential revoked before
    // the worker comes back: the restarted worker cannot take the lease again to redact, so
    // none of the attempt's output is served (fail closed), not the value in clear.
    let gone = format!("sk-squadron-gone-{}", std::process::id() * 7919);
    put_credential(&url, "cred_gone", &gone);
    let task = task_id(&submit_yaml(
        &url,
        &manifest(
            &repo,
            "process",
            "cred_gone",
            "echo \"key: $(cat \"$API_KEY_FILE\")\"\nsleep 20\n",
        ),
    ));
    let printed = wait_until(TASK_TIMEOUT, || {
        http_text(&format!("{url}/api/v1/tasks/{task}/logs?stream=stdout"))
            .is_ok_and(|(status, text)| status == 200 && text.contains("[REDACTED:cred_gone]"))
    });
    assert!(printed.is_ok(), "the provider never printed its key");
    worker.kill();
    revoke(&url, "cred_gone");
    worker.spawn();
    // Refused from the adoption on, while the provider still runs, not only at its end.
    let refused = wait_until(Duration::from_secs(20), || {
        http_text(&format!("{url}/api/v1/tasks/{task}/logs?stream=stdout"))
            .is_ok_and(|(status, _)| status == 403)
    });
    assert!(
        refused.is_ok(),
        "the adopted attempt's output is still served"
    );
    assert_eq!(
        http_get(&format!("{url}/api/v1/tasks/{task}")).expect("task")["state"],
        "RUNNING",
        "the refusal must come while the provider runs"
    );
    wait_task_state(&url, task, &["COMPLETED", "FAILED"], TASK_TIMEOUT);
    let marker = worker.task_dir(task).join("outbox-unredacted");
    assert!(
        wait_until(Duration::from_secs(20), || marker.exists()).is_ok(),
        "the outbox is not marked unredacted"
    );
    let (status, body) =
        http_text(&format!("{url}/api/v1/tasks/{task}/logs?stream=stdout")).expect("logs");
    assert_eq!(status, 403, "{body}");
    assert!(!body.contains(&gone), "the value was served: {body}");

    // A revoked credential: a new task naming it is refused at submission.
    revoke(&url, "cred_ci");
    let refused = submit_yaml(&url, &manifest(&repo, "process", "cred_ci", "true"));
    assert_eq!(refused.status, 409, "{refused:?}");
    assert!(refused.body.to_string().contains("revoked"), "{refused:?}");
}

fn status(url: &str) -> Value {
    http_get(&format!("{url}/api/v1/cluster/status")).expect("cluster status")
}

fn revoke(url: &str, credential: &str) {
    let out = cli(url)
        .args(["--endpoint", url, "credential", "revoke", credential])
        .output()
        .expect("squadron credential revoke");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The secret scans read files through their data only (a project volume is a 20 GiB sparse
/// image): a value in a written extent far into a sparse file is found, also one that straddles
/// two of the pieces it is read in, and a file of only holes and other bytes holds none.
#[test]
fn the_secret_scan_reads_sparse_files_by_their_data_and_across_pieces() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let needle = b"sk-scan-needle-0123456789";
    let path = dir.path().join("image.img");
    let mut file = std::fs::File::create(&path).expect("create");
    file.set_len(4 << 30).expect("a 4 GiB sparse file");
    file.seek(SeekFrom::Start(1 << 30)).expect("seek");
    file.write_all(&vec![b'x'; 16 << 20])
        .expect("an extent of other bytes");
    file.sync_all().expect("sync");
    assert!(!file_holds(&path, needle));
    // Across the 8 MiB pieces the extent is read in.
    let straddle = (1 << 30) + (8 << 20) - 10;
    file.seek(SeekFrom::Start(straddle)).expect("seek");
    file.write_all(needle).expect("write");
    file.sync_all().expect("sync");
    assert!(file_holds(&path, needle));
    // Alone, in an extent of its own far into the file.
    let lone = dir.path().join("lone.img");
    let mut file = std::fs::File::create(&lone).expect("create");
    file.set_len(4 << 30).expect("sparse");
    file.seek(SeekFrom::Start(3 << 30)).expect("seek");
    file.write_all(needle).expect("write");
    file.sync_all().expect("sync");
    assert!(file_holds(&lone, needle));
}
