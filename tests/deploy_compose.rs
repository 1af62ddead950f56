//! `deploy/compose/`, for real: the image built from the binary under test by
//! `deploy/container/build-local-image` (no registry), the cluster prepared by
//! `deploy/compose/prepare`, three nodes brought up by Debian's docker-compose from
//! `deploy/compose/docker-compose.yml`. They elect a leader and turn healthy (the image's own
//! `cluster ready` check); a worker on the host with the process runtime completes a task
//! submitted through a follower; the leader's container is stopped and the cluster goes on:
//! a new leader, and a second task completes.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{free_port, git_repo, BIN};

/// One project name: a run that died leaves it, and the next run's `down` removes it.
const PROJECT: &str = "squadron-deploy-test";
const IMAGE: &str = "squadron:deploy-test";
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
    worker: Option<Child>,
}

impl Compose {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("docker-compose");
        c.args(["-p", PROJECT, "-f"])
            .arg(repo_file("deploy/compose/docker-compose.yml"))
            .args(args)
            .env("SQUADRON_DIR", &self.dir)
            .env("SQUADRON_IMAGE", IMAGE);
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

    /// Submits the manifest through `url` and waits until the task completed.
    fn task_completes(&self, url: &str, manifest: &Path) {
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
                Some("COMPLETED") => return,
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
        if let Some(mut w) = self.worker.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
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
    run(Command::new(repo_file("deploy/compose/prepare"))
        .arg(&dir)
        .env("SQUADRON_BIN", BIN));
    let mut compose = Compose { dir, worker: None };
    let _ = compose.command(&["down", "-v"]).output();
    run(&mut compose.command(&["up", "-d"]));
    let leader = compose.leader(&NODE_URLS, Duration::from_secs(90));
    for n in 1..=3 {
        compose.healthy(&format!("{PROJECT}_node{n}_1"), Duration::from_secs(60));
    }

    let repo = git_repo(tmp.path());
    let manifest = tmp.path().join("task.yaml");
    std::fs::write(
        &manifest,
        format!(
            "version: \"1\"\nkind: Task\nmetadata:\n  name: compose\nrepository:\n  url: {}\n  \
             branch: main\nagent:\n  provider: script\n  prompt: greet\n  script: |\n    \
             echo hello > greeting.txt\nvm:\n  runtime: process\n  network_mode: isolated\n",
            repo.display()
        ),
    )
    .expect("manifest");
    let log = std::fs::File::create(tmp.path().join("worker.log")).expect("log");
    compose.worker = Some(
        Command::new(BIN)
            .args([
                "worker",
                "--id",
                "worker-1",
                "--control",
                &NODE_URLS.join(","),
            ])
            .arg("--cert-dir")
            .arg(compose.dir.join("worker-1-pki"))
            .arg("--data-dir")
            .arg(tmp.path().join("worker"))
            .args([
                "--runtimes",
                "process",
                "--no-agents",
                "--allow-local-repositories",
            ])
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("worker"),
    );
    let follower = NODE_URLS[(leader as usize) % 3];
    compose.task_completes(follower, &manifest);

    run(&mut compose.command(&["stop", &format!("node{leader}")]));
    let survivors: Vec<&str> = (1..=3u64)
        .filter(|n| *n != leader)
        .map(|n| NODE_URLS[n as usize - 1])
        .collect();
    let next = compose.leader(&survivors, Duration::from_secs(60));
    assert_ne!(next, leader, "the stopped leader is still named");
    compose.task_completes(survivors[0], &manifest);
}
