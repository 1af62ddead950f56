//! The README's tour, exactly as written: `squadron dev` started from a scratch working
//! directory holding a copy of `examples/`, with its default (relative) data directory, then
//! every line of the tour's code block run by bash in that directory with `squadron` on the
//! PATH being the binary under test. The block is read from `README.md` at build time, so a
//! README change that this test does not follow breaks it.
//!
//! `squadron dev` listens on its fixed default ports (8120, 8121, 8130): run under the shared
//! lock (`flock /tmp/squadron-e2e.lock cargo test …`). It is killed when the test ends, also
//! when it fails.

mod support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use support::*;

const README: &str = include_str!("../README.md");
/// `squadron dev`'s default REST address (the tour's lines use the CLI's default endpoint).
const DEV_URL: &str = "https://127.0.0.1:8120";
const DEV_PORTS: [u16; 4] = [8120, 8121, 8122, 8130];
/// The local worker `squadron dev` starts.
const DEV_WORKER: &str = "dev-worker";
const DEV_START_TIMEOUT: Duration = Duration::from_secs(60);

/// The tour: the first `sh` code block that submits a task, one command per line (blank
/// lines and comment lines left out; a trailing comment stays, bash drops it).
fn tour_lines(readme: &str) -> Vec<String> {
    let mut blocks: Vec<Vec<String>> = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in readme.lines() {
        let fence = line.trim_start().starts_with("```");
        match current.take() {
            None if fence && line.trim() == "```sh" => current = Some(Vec::new()),
            None => {}
            Some(block) if fence => blocks.push(block),
            Some(mut block) => {
                block.push(line.to_string());
                current = Some(block);
            }
        }
    }
    blocks
        .into_iter()
        .find(|b| {
            b.iter()
                .any(|l| l.trim_start().starts_with("squadron task submit"))
        })
        .expect("README.md has a sh block that submits a task")
        .into_iter()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// `squadron dev`, killed (with whatever its worker left) when dropped.
struct Dev {
    child: Option<Child>,
    log: PathBuf,
    worker_data: PathBuf,
}

impl Dev {
    fn start(dir: &Path) -> Dev {
        for port in DEV_PORTS {
            assert!(
                TcpListener::bind(("127.0.0.1", port)).is_ok(),
                "port {port} is taken: is another `squadron dev` running?"
            );
        }
        let log = dir.join("dev.log");
        let out = std::fs::File::create(&log).expect("dev log");
        let child = Command::new(BIN)
            .arg("dev")
            .current_dir(dir)
            .stdout(Stdio::from(out.try_clone().expect("dev log")))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("spawn squadron dev");
        let dev = Dev {
            child: Some(child),
            log,
            // The default data dir, as `squadron dev` documents it: ./.squadron/worker.
            worker_data: dir.join(".squadron").join("worker"),
        };
        let worker = format!("{DEV_URL}/api/v1/workers/{DEV_WORKER}");
        // `squadron dev` makes its CA and admin token on first start; the harness reads them
        // where the CLI of the tour finds them.
        let (ca, token) = (
            dir.join(".squadron/pki/ca.pem"),
            dir.join(".squadron/admin.token"),
        );
        wait_until(DEV_START_TIMEOUT, || ca.exists() && token.exists())
            .unwrap_or_else(|_| panic!("squadron dev made no CA; log:\n{}", dev.log_tail()));
        std::thread::sleep(Duration::from_millis(200));
        pki().register_foreign(
            "127.0.0.1:8120",
            &std::fs::read_to_string(&ca).expect("dev CA"),
            &std::fs::read_to_string(&token).expect("dev token"),
        );
        wait_until(DEV_START_TIMEOUT, || {
            http_ok(&format!("{DEV_URL}/readyz"))
                && http_get(&worker).is_ok_and(|w| w["status"] == "alive")
        })
        .unwrap_or_else(|_| panic!("squadron dev did not start; log:\n{}", dev.log_tail()));
        dev
    }

    fn log_tail(&self) -> String {
        tail(&self.log)
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        remove_worker_leftovers(DEV_WORKER, &self.worker_data);
    }
}

/// Copies a directory tree (files keep their permissions, so scripts stay executable).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy");
    for entry in std::fs::read_dir(from).expect("read the tree") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

/// Runs one tour line with bash in `dir`, `squadron` being the binary under test.
fn run_line(dir: &Path, bin_dir: &Path, line: &str) -> Output {
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("bash")
        .args(["-c", line])
        .current_dir(dir)
        .env("PATH", path)
        // The tour's lines talk to the default endpoint; an inherited one must not redirect them.
        .env_remove("SQUADRON_ENDPOINT")
        .stdin(Stdio::null())
        .output()
        .expect("run bash")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_tour_block_is_found() {
    let lines = tour_lines(README);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("squadron task submit examples/hello-process.yaml")),
        "{lines:?}"
    );
    assert!(lines.iter().all(|l| !l.starts_with('#')), "{lines:?}");
}

/// The first build's duration is a measurement with its date and machine, not a guess.
#[test]
fn the_readme_states_measured_build_times() {
    let para: String = README
        .split("\n\n")
        .find(|p| p.contains("The first build compiles RocksDB"))
        .expect("README.md says what the first build costs")
        .replace('\n', " ");
    assert!(
        para.contains("Measured on 2026-12-06") && para.contains("2-core"),
        "{para}"
    );
    assert!(para.contains("16 min 27 s"), "{para}");
    assert!(
        !para.contains("estimated") && !para.contains("an hour"),
        "{para}"
    );
}

#[test]
fn the_readme_tour_runs_as_written() {
    let lines = tour_lines(README);
    let scratch = tempfile::tempdir().expect("scratch dir");
    let dir = scratch.path();
    let repo_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    copy_tree(&repo_root.join("examples"), &dir.join("examples"));
    let bin_dir = dir.join("bin");
    std::fs::create_dir_all(&bin_dir).expect("bin dir");
    std::os::unix::fs::symlink(BIN, bin_dir.join("squadron")).expect("squadron on the PATH");

    let dev = Dev::start(dir);
    let mut submitted = 0u64;
    for line in &lines {
        let out = run_line(dir, &bin_dir, line);
        assert!(
            out.status.success(),
            "`{line}` failed ({}):\nstdout:\n{}\nstderr:\n{}\ndev log:\n{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr),
            dev.log_tail()
        );
        if line.starts_with("squadron task submit") {
            // A submission step succeeds when its task completes, not only when it is taken.
            submitted += 1;
            let task = http_get(&format!("{DEV_URL}/api/v1/tasks/{submitted}")).expect("task");
            assert_eq!(
                task["state"],
                "COMPLETED",
                "`{line}` left task {submitted} {}: {task:#}\nstderr:\n{}\ndev log:\n{}",
                task["state"],
                text(&out.stderr),
                dev.log_tail()
            );
        }
    }
    assert!(submitted >= 1, "the tour submits no task: {lines:?}");

    // The first task's change is downloadable as a patch.
    let (status, patch) =
        http_text(&format!("{DEV_URL}/api/v1/tasks/1/artifacts/1.patch")).expect("patch");
    assert_eq!(status, 200, "{patch}");
    assert!(patch.contains("diff --git"), "{patch}");
    drop(dev);
}
