//! The Docker runtime's warm pool end to end: a real `squadron worker --docker-warm-pool 1`
//! against dockerd, a one-node cluster, tasks one after another. A claimed container runs
//! the task in the task's own directories with its limits and the sandbox user, is never
//! used for a second task, and leaves no bind behind; the claims are counted in the worker's
//! metrics, relayed by the node; a restarted worker replaces the idle container its last
//! life left, adopts a claimed one, and a stop on SIGTERM removes the idle ones. The
//! scheduler's tick is longer than the test, so each placement also proves that a submission
//! (and a task's end) wakes the scheduler at once.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::*;

const TASK_TIMEOUT: Duration = Duration::from_secs(120);
/// 256 MiB: differs from the worker's default and the pool's idle limit, so the container's
/// limit shows the claim set the task's own.
const TASK_MEMORY_BYTES: u64 = 256 * 1024 * 1024;
/// Longer than the test: a task placed at all was placed by a wake.
const SCHEDULE_TICK_MS: u64 = 600_000;
/// The worker's default sandbox user (nobody).
const SANDBOX_UID: u32 = 65534;

fn manifest(repo: &std::path::Path, network: &str, then: &str) -> String {
    let script = [
        "echo \"pwd=$(pwd)\"",
        "echo \"uid=$(id -u)\"",
        "echo \"memory=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max)\"",
        "echo \"task=$SQUADRON_TASK_ID\"",
        "touch /mnt/run/x 2>/dev/null && echo run:written || echo run:denied",
        then,
    ];
    let indented: String = script
        .iter()
        .flat_map(|l| l.lines())
        .map(|l| format!("    {l}\n"))
        .collect();
    format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: warm\nrepository:\n  url: {repo}\n  \
         branch: main\nagent:\n  prompt: warm\n  provider: script\n  script: |\n{indented}\
         vm:\n  runtime: docker\n  memory: 256Mi\n  network_mode: {network}\n",
        repo = repo.display(),
    )
}

fn wait_idle(url: &str, worker: &str) {
    let idle = "squadron_worker_sandbox_pool_idle{runtime=\"docker\"}";
    let mut last = String::new();
    let ready = wait_until(Duration::from_secs(60), || {
        last = worker_metrics(url, worker);
        last.lines()
            .any(|l| l.starts_with(idle) && l.ends_with(" 1"))
    });
    assert!(
        ready.is_ok(),
        "the pool never held a warm container:\n{last}"
    );
}

/// Runs one task to its end; answers its stdout and the container it ran in.
fn run(url: &str, yaml: &str) -> (u64, String, String) {
    let r = submit_yaml(url, yaml);
    assert!(r.ok(), "submission refused: {r:?}");
    let id = r.body["task_submitted"]["task"].as_u64().expect("task id");
    let task = wait_task_state(url, id, &["COMPLETED", "FAILED"], TASK_TIMEOUT);
    let events = task_events_with(url, id, "\"reaped\"");
    assert_eq!(task["state"], "COMPLETED", "{task:#}\n{events}");
    let (_, stdout) =
        http_text(&format!("{url}/api/v1/tasks/{id}/logs?stream=stdout")).expect("stdout");
    let container = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "provisioned")
        .and_then(|e| e["sandbox"].as_str().map(String::from))
        .unwrap_or_else(|| panic!("no provisioned event:\n{events}"));
    (id, stdout, container)
}

/// The engine's containers that match every `key=value` filter, by id.
fn containers(filters: &[&str]) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args(["ps", "-a", "--no-trunc"])
        .args(filters.iter().flat_map(|f| ["--filter", f]))
        .args(["--format", "{{.ID}}"])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect()
}

/// Mount points beneath the worker's pool directory, the pool's own shared mount left out.
fn slot_mounts(pool: &std::path::Path) -> Vec<String> {
    let pool = std::fs::canonicalize(pool).expect("pool dir");
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mount table")
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(String::from))
        .filter(|p| std::path::Path::new(p).starts_with(&pool) && std::path::Path::new(p) != pool)
        .collect()
}

#[test]
fn warm_containers_are_claimed_once_set_to_the_task_and_replaced() {
    // The scheduler's tick is ten minutes: every placement below is the one a submission
    // or a task's end woke at once.
    let cluster = Cluster::start_with(
        1,
        ClusterOptions {
            schedule_interval_ms: SCHEDULE_TICK_MS,
            ..ClusterOptions::default()
        },
    );
    let url = cluster.urls()[0].clone();
    let id = unique_worker_id("w-warm");
    let mut worker = WorkerProc::start_with(
        cluster.dir.path(),
        &id,
        cluster.urls(),
        "docker",
        vec!["--docker-warm-pool".into(), "1".into()],
    );
    let repo = git_repo(cluster.dir.path());
    let pool = worker.data_dir.join("docker-pool");

    let mut ran = Vec::new();
    for _ in 0..2 {
        wait_idle(&url, &id);
        ran.push(run(&url, &manifest(&repo, "outbound", "")));
    }
    let metrics = worker_metrics(&url, &id);
    assert_eq!(docker_pool_claims(&metrics, "hit"), 2, "{metrics}");
    assert_eq!(docker_pool_claims(&metrics, "miss"), 0, "{metrics}");
    for (task, stdout, _) in &ran {
        // The task's own directory, environment and limits; never root.
        assert!(stdout.contains("pwd=/mnt/inbox\n"), "{stdout}");
        assert!(stdout.contains(&format!("task={task}\n")), "{stdout}");
        assert!(stdout.contains(&format!("uid={SANDBOX_UID}\n")), "{stdout}");
        // run/ is bound read-only beneath the slot, and stays so inside the container.
        assert!(stdout.contains("run:denied\n"), "{stdout}");
        assert!(
            stdout.contains(&format!("memory={TASK_MEMORY_BYTES}\n")),
            "{stdout}"
        );
    }
    // Each task had a container of its own.
    assert_ne!(ran[0].2, ran[1].2);
    // Claimed containers went with their tasks, and so did their binds.
    for (_, _, container) in &ran {
        assert!(containers(&[&format!("id={container}")]).is_empty());
    }
    let left = wait_until(Duration::from_secs(10), || slot_mounts(&pool).is_empty());
    assert!(left.is_ok(), "binds left: {:?}", slot_mounts(&pool));

    // A shape the pool does not hold starts cold and is counted so.
    run(&url, &manifest(&repo, "isolated", ""));
    let metrics = worker_metrics(&url, &id);
    assert_eq!(docker_pool_claims(&metrics, "ineligible"), 1, "{metrics}");
    assert_eq!(docker_pool_claims(&metrics, "hit"), 2, "{metrics}");

    // kill -9 leaves the idle container; the next life removes it and makes a new one.
    wait_idle(&url, &id);
    let ours = format!("label=squadron.worker={id}");
    let idle_before = containers(&[&ours, "name=squadron-pool-"]);
    assert_eq!(idle_before.len(), 1, "{idle_before:?}");
    worker.kill();
    assert_eq!(
        containers(&[&ours, "name=squadron-pool-", "status=running"]),
        idle_before,
        "the idle container outlives a kill"
    );
    worker.spawn();
    wait_idle(&url, &id);
    for old in &idle_before {
        assert!(
            containers(&[&format!("id={old}")]).is_empty(),
            "the last life's idle container {old} is still there"
        );
    }
    let (_, stdout, _) = run(&url, &manifest(&repo, "outbound", ""));
    assert!(stdout.contains("pwd=/mnt/inbox\n"), "{stdout}");
    assert_eq!(docker_pool_claims(&worker_metrics(&url, &id), "hit"), 1);

    // A claimed container outlives a kill -9 of its worker: the next life adopts it by the
    // attempt's name and the task ends there, its binds gone with it.
    wait_idle(&url, &id);
    let r = submit_yaml(&url, &manifest(&repo, "outbound", "sleep 3\necho slept"));
    assert!(r.ok(), "submission refused: {r:?}");
    let task = r.body["task_submitted"]["task"].as_u64().expect("task id");
    wait_task_state(&url, task, &["RUNNING"], TASK_TIMEOUT);
    worker.kill();
    worker.spawn();
    let ended = wait_task_state(&url, task, &["COMPLETED", "FAILED"], TASK_TIMEOUT);
    let events = task_events_with(&url, task, "\"reaped\"");
    assert_eq!(ended["state"], "COMPLETED", "{ended:#}\n{events}");
    let (_, stdout) =
        http_text(&format!("{url}/api/v1/tasks/{task}/logs?stream=stdout")).expect("stdout");
    assert!(
        stdout.contains("pwd=/mnt/inbox\n") && stdout.contains("slept\n"),
        "{stdout}"
    );
    let left = wait_until(Duration::from_secs(10), || {
        slot_mounts(&pool).is_empty() && containers(&[&ours, "name=squadron-task-"]).is_empty()
    });
    assert!(
        left.is_ok(),
        "binds left: {:?}; containers left: {:?}",
        slot_mounts(&pool),
        containers(&[&ours, "name=squadron-task-"])
    );

    // A stop on SIGTERM removes the idle containers: nothing of the pool outlives the worker.
    wait_idle(&url, &id);
    worker.terminate();
    assert_eq!(
        containers(&[&ours, "name=squadron-pool-"]),
        Vec::<String>::new(),
        "idle warm containers outlive the stop"
    );
    assert!(slot_mounts(&pool).is_empty(), "{:?}", slot_mounts(&pool));
}
