//! `deploy/compose/`, for real: the image built from the binary under test by
//! `deploy/container/build-local-image` (no registry), the cluster prepared by
//! `deploy/compose/prepare`, three nodes and a worker brought up by Debian's docker-compose from
//! `deploy/compose/docker-compose.yml`, the worker from the image `build-local-image --worker`
//! builds. The nodes elect a leader and turn healthy (the image's own `cluster ready` check);
//! the compose worker, its sandboxes in bubblewrap and cgroups from inside its container,
//! completes a task submitted through a follower, and the node relays the task's log from the
//! worker's output server; the leader's container is stopped and the cluster goes on: a new
//! leader, and a second task completes.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{git_repo, BIN};

/// One project name: a run that died leaves it, and the next run's `down` removes it.
const PROJECT: &str = "squadron-deploy-test";
const IMAGE: &str = "squadron:deploy-test";
const WORKER_IMAGE: &str = "squadron-worker:deploy-test";
const NODE_URLS: [&str; 3] = [
    "https://100.80.0.11:8120",
    "https://100.80.0.12:8120",
    "https://100.80.0.13:8120",
];

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The compose project, torn down (containers, network) when dropped.
struct Compose {
    dir: PathBuf,
    /// The test's own additions to the shipped file (the repository's mount).
    overrides: PathBuf,
}

impl Compose {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("docker-compose");
        c.args(["-p", PROJECT, "-f"])
            .arg(repo_file("deploy/compose/docker-compose.yml"))
            .arg("-f")
            .arg(&self.overrides)
            .args(args)
            .env("SQUADRON_DIR", &self.dir)
            .env("SQUADRON_IMAGE", IMAGE)
            .env("SQUADRON_WORKER_IMAGE", WORKER_IMAGE);
        c
    }

    fn squadron(&self, url: &str, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(["--endpoint", url, "--output", "json"])
            .arg("--cacert")
            .arg(self.dir.join("node1/data/pki/ca.pem"))
            .arg("--token-file")
            .arg(self.dir.join("admin.token"))
            .args(args)
            .output()
            .expect("squadron")
    }

    fn json(&self, url: &str, args: &[&str]) -> Option<serde_json::Value> {
        let out = self.squadron(url, args);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten()
    }

    /// The leader every node that answers names, once they agree.
    fn leader(&self, urls: &[&str], timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let seen: Vec<Option<u64>> = urls
                .iter()
                .map(|u| {
                    self.json(u, &["cluster", "status"])
                        .and_then(|s| s["leader"].as_u64())
                })
                .collect();
            if let Some(Some(l)) = seen.first() {
                if seen.iter().all(|s| *s == Some(*l)) {
                    return *l;
                }
            }
            assert!(Instant::now() < deadline, "no agreed leader: {seen:?}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn healthy(&self, container: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let out = Command::new("docker")
                .args(["inspect", "--format", "{{.State.Health.Status}}", container])
                .output()
                .expect("docker inspect");
            if String::from_utf8_lossy(&out.stdout).trim() == "healthy" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{container} never turned healthy"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Submits the manifest through `url`, waits until the task completed and answers its id.
    fn task_completes(&self, url: &str, manifest: &Path) -> String {
        let out = self.squadron(url, &["task", "submit", &manifest.display().to_string()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let submitted: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let id = submitted["task"]
            .as_u64()
            .or_else(|| submitted["task_submitted"]["task"].as_u64())
            .unwrap_or_else(|| panic!("no task id in {submitted}"))
            .to_string();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let state = self
                .json(url, &["task", "get", &id])
                .and_then(|t| t["state"].as_str().map(str::to_string));
            match state.as_deref() {
                Some("COMPLETED") => return id,
                Some("FAILED" | "FAILED_PRESERVED" | "CANCELLED") => {
                    panic!("task {id} ended {state:?}")
                }
                _ => {}
            }
            assert!(Instant::now() < deadline, "task {id} still {state:?}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        let _ = self
            .command(&["down", "-v", "--remove-orphans"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[test]
fn a_compose_cluster_elects_runs_a_task_and_survives_losing_its_leader() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cluster");
    run(
        Command::new(repo_file("deploy/container/build-local-image"))
            .args(["--binary", BIN, "--tag", IMAGE]),
    );
    run(
        Command::new(repo_file("deploy/container/build-local-image")).args([
            "--worker",
            "--binary",
            BIN,
            "--tag",
            WORKER_IMAGE,
        ]),
    );
    run(Command::new(repo_file("deploy/compose/prepare"))
        .arg(&dir)
        .env("SQUADRON_BIN", BIN));
    let policy = dir.join("worker-1/policy.toml");
    let shipped = std::fs::read_to_string(&policy).expect("the worker's policy");
    assert!(
        shipped.contains("repository_sources = [\"https\", \"ssh\", \"git\"]"),
        "prepare's policy is not the secure default: {shipped}"
    );
    // The test's repository is a local path, which the shipped policy refuses: allowed here,
    // and mounted where the worker's container sees it at the same path.
    let repo = git_repo(tmp.path());
    std::fs::write(
        &policy,
        shipped.replace(
            "[\"https\", \"ssh\", \"git\"]",
            "[\"https\", \"ssh\", \"git\", \"local\"]",
        ),
    )
    .expect("policy");
    let overrides = tmp.path().join("test-overrides.yml");
    std::fs::write(
        &overrides,
        format!(
            "version: \"3.7\"\nservices:\n  worker:\n    volumes: [\"{0}:{0}:ro\"]\n",
            repo.display()
        ),
    )
    .expect("overrides");
    let compose = Compose { dir, overrides };
    let _ = compose.command(&["down", "-v"]).output();
    run(&mut compose.command(&["up", "-d"]));
    let leader = compose.leader(&NODE_URLS, Duration::from_secs(90));
    for n in 1..=3 {
        compose.healthy(&format!("{PROJECT}_node{n}_1"), Duration::from_secs(60));
    }

    let manifest = |network_mode: &str| {
        let path = tmp.path().join(format!("task-{network_mode}.yaml"));
        std::fs::write(
            &path,
            format!(
            "version: \"1\"\nkind: Task\nmetadata:\n  name: compose\nrepository:\n  url: {}\n  \
             branch: main\nagent:\n  provider: script\n  prompt: greet\n  script: |\n    \
             echo hello from $(id -u) > greeting.txt; cat greeting.txt\nvm:\n  runtime: process\n  \
             network_mode: {network_mode}\n",
                repo.display()
            ),
        )
        .expect("manifest");
        path
    };
    let follower = NODE_URLS[(leader as usize) % 3];
    let task = compose.task_completes(follower, &manifest("isolated"));
    // The log comes from the worker's output server through the node: the relay's path.
    let logs = compose.squadron(follower, &["task", "logs", &task]);
    let text = String::from_utf8_lossy(&logs.stdout);
    assert!(
        logs.status.success() && text.contains("hello from "),
        "task logs: {text}{}",
        String::from_utf8_lossy(&logs.stderr)
    );
    assert!(
        !text.contains("hello from 0\n"),
        "the sandbox ran as root: {text}"
    );
    // From inside its container the worker still enforces every limit it sets (each one it
    // cannot is a warning, which the worker's default log level keeps).
    let worker_log = run(&mut compose.command(&["logs", "--no-color", "worker"]));
    let worker_log = String::from_utf8_lossy(&worker_log.stdout);
    assert!(
        worker_log.contains("squadron worker running")
            && !worker_log.contains("limit not enforced"),
        "worker log: {worker_log}"
    );

    run(&mut compose.command(&["stop", &format!("node{leader}")]));
    let survivors: Vec<&str> = (1..=3u64)
        .filter(|n| *n != leader)
        .map(|n| NODE_URLS[n as usize - 1])
        .collect();
    let next = compose.leader(&survivors, Duration::from_secs(60));
    assert_ne!(next, leader, "the stopped leader is still named");
    // The default network mode: a veth and NAT through the worker, from inside its container.
    compose.task_completes(survivors[0], &manifest("outbound"));
}
