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

/// Runs `squadron-jepsen run ARGS --bin … --out OUT`; returns its exit status and
/// `results.json`.
// Not every test binary that includes this module calls it.
#[allow(dead_code)]
pub fn run_suite(out: &Path, args: &[&str]) -> (ExitStatus, serde_json::Value, String) {
    let status = Command::new(env!("CARGO_BIN_EXE_squadron-jepsen"))
        .arg("run")
        .args(args)
        .arg("--bin")
        .arg(node_binary())
        .arg("--out")
        .arg(out)
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
