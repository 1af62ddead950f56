//! Runs `squadron-jepsen` against the real node binary and reads its verdict.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

/// The node binary: `SQUADRON_BIN`, else `<target>/debug/squadron` beside this test's
/// `<target>/debug/deps/…` executable (`cargo test --workspace` builds it alongside).
pub fn node_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SQUADRON_BIN") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "SQUADRON_BIN={} is not a file", p.display());
        return p;
    }
    let exe = std::env::current_exe().expect("test executable");
    let debug = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/debug");
    let bin = debug.join("squadron");
    assert!(
        bin.is_file(),
        "node binary not found at {}: build it (`cargo build -p squadron`) or set SQUADRON_BIN",
        bin.display()
    );
    bin
}

/// Runs `squadron-jepsen run ARGS --bin … --out OUT`, which must be refused before anything
/// starts (non-zero exit, no history); returns its stderr.
#[allow(dead_code)]
pub fn run_refused(out: &Path, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_squadron-jepsen"))
        .arg("run")
        .args(args)
        .arg("--bin")
        .arg(node_binary())
        .arg("--out")
        .arg(out)
        .output()
        .expect("run squadron-jepsen");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "stderr: {stderr}");
    assert!(
        !out.join("history.jsonl").exists(),
        "a run started though it was refused; stderr: {stderr}"
    );
    stderr
}

/// Runs `squadron-jepsen run ARGS --bin … --out OUT`; returns its exit status and
/// `results.json`.
// Not every test binary that includes this module calls it.
#[allow(dead_code)]
pub fn run_suite(out: &Path, args: &[&str]) -> (ExitStatus, serde_json::Value, String) {
    run_suite_with_env(out, args, &[])
}

/// `run_suite` with these variables in the harness's (and so the nodes') environment, and no
/// deliberate fault but one named there.
#[allow(dead_code)]
pub fn run_suite_with_env(
    out: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (ExitStatus, serde_json::Value, String) {
    let status = Command::new(env!("CARGO_BIN_EXE_squadron-jepsen"))
        .arg("run")
        .args(args)
        .arg("--bin")
        .arg(node_binary())
        .arg("--out")
        .arg(out)
        .env_remove("SQUADRON_JEPSEN_FAULT")
        .envs(env.iter().copied())
        .status()
        .expect("run squadron-jepsen");
    let path = out.join("results.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} missing ({e}); exit {status}", path.display()));
    let results: serde_json::Value = serde_json::from_str(&text).expect("results.json parses");
    let mut text = text;
    if results["valid"] != serde_json::json!(true) {
        // The run directory goes with the test: what the nodes said goes with the failure.
        text.push_str(&node_log_tails(out));
    }
    (status, results, text)
}

/// Where a run that was not as expected is copied, history and all, for a look afterwards.
const KEPT_RUNS_DIR: &str = "/tmp/squadron-jepsen-kept";

/// A run of the real node must be valid; when it is not, the run is kept (`keep_run`) before
/// the test fails with its results.
#[allow(dead_code)]
pub fn assert_valid(out: &Path, results: &serde_json::Value, text: &str) {
    if results["valid"] != serde_json::json!(true) {
        panic!("the run is not valid:\n{text}{}", keep_run(out));
    }
}

/// Copies the run directory out of the test's temporary one (which goes with the test);
/// says where, or why not.
#[allow(dead_code)]
pub fn keep_run(out: &Path) -> String {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().trim_start_matches('.').to_string())
        .unwrap_or_else(|| "run".into());
    let kept = Path::new(KEPT_RUNS_DIR).join(name);
    let copied = std::fs::create_dir_all(KEPT_RUNS_DIR).and_then(|_| {
        Command::new("cp")
            .arg("-a")
            .arg(out)
            .arg(&kept)
            .status()
            .map(|s| s.success())
    });
    match copied {
        Ok(true) => format!("\n--- the run is kept in {}\n", kept.display()),
        other => format!("\n--- the run could not be kept: {other:?}\n"),
    }
}

/// A short 3-node run of `workload` under `nemesis`: faults about 4 s long, 2 s apart.
#[allow(dead_code)]
pub fn run_short(
    out: &Path,
    workload: &str,
    nemesis: &str,
    secs: u32,
    rate: u32,
) -> (ExitStatus, serde_json::Value, String) {
    let (secs, rate) = (secs.to_string(), rate.to_string());
    run_suite(
        out,
        &[
            "--nodes",
            "3",
            "--workload",
            workload,
            "--nemesis",
            nemesis,
            "--time-limit",
            &secs,
            "--rate",
            &rate,
            "--seed",
            "7",
            "--fault-secs",
            "4",
            "--quiet-secs",
            "2",
        ],
    )
}

/// Lines kept of each node's log in a failed run's message.
const NODE_LOG_TAIL_LINES: usize = 80;

/// The last lines of every `node.log` below `out`.
fn node_log_tails(out: &Path) -> String {
    let mut logs = Vec::new();
    let mut stack = vec![out.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "node.log") {
                logs.push(path);
            }
        }
    }
    logs.sort();
    let mut text = String::new();
    for log in logs {
        let body = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = body.lines().collect();
        let from = lines.len().saturating_sub(NODE_LOG_TAIL_LINES);
        text.push_str(&format!(
            "\n--- {} (last {} lines)\n",
            log.display(),
            lines.len() - from
        ));
        text.push_str(&lines[from..].join("\n"));
    }
    text
}

/// Every fault in `faults` appears in the run's history under `out`.
#[allow(dead_code)]
pub fn assert_injected(out: &Path, faults: &[&str], text: &str) {
    let history = std::fs::read_to_string(out.join("history.jsonl")).expect("history");
    for f in faults {
        assert!(
            history.contains(&format!("\"fault\":\"{f}\"")),
            "{f} was not injected:\n{text}"
        );
    }
}

/// The kinds of the anomalies a run's `results.json` lists.
#[allow(dead_code)]
pub fn anomaly_kinds(results: &serde_json::Value) -> Vec<String> {
    results["anomalies"]
        .as_array()
        .expect("anomalies")
        .iter()
        .filter_map(|a| a["kind"].as_str().map(str::to_string))
        .collect()
}
