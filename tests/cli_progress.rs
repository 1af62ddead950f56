//! Progress of long work (issue 19 item 6): `task submit --wait` on a terminal — a pseudo-
//! terminal `script(1)` makes — redraws one line with the task's state and the time elapsed,
//! and ends on the final state; off a terminal, and with `--output json` on one, it draws
//! nothing, and the JSON answer is all stdout holds.

mod support;

use std::process::Command;

use support::*;

fn manifest(repo: &std::path::Path) -> String {
    format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: progress\nrepository:\n  url: {}\n\
         agent:\n  prompt: take a while\n  provider: script\n  script: |\n    sleep 3\n\
         vm:\n  runtime: process\n",
        repo.display()
    )
}

/// Runs `squadron <args>` as `cli(url)` would, inside a pseudo-terminal; answers what the
/// terminal showed.
fn on_terminal(url: &str, args: &[&str]) -> String {
    let inner = cli(url);
    let mut line = vec![inner.get_program().to_string_lossy().into_owned()];
    line.extend(args.iter().map(|a| a.to_string()));
    let quoted: Vec<String> = line
        .iter()
        .map(|w| format!("'{}'", w.replace('\'', "'\\''")))
        .collect();
    let mut script = Command::new("script");
    script.args(["-qfec", &quoted.join(" "), "/dev/null"]);
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            script.env(k, v);
        }
    }
    let out = script.output().expect("script(1)");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_waited_for_task_shows_its_state_and_elapsed_time_on_a_terminal_only() {
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = git_repo(dir.path());
    let _worker = WorkerProc::start(
        cluster.dir.path(),
        &unique_worker_id("w-progress"),
        vec![url.clone()],
        "process",
    );
    let file = dir.path().join("task.yaml");
    std::fs::write(&file, manifest(&repo)).expect("manifest");
    let path = file.display().to_string();
    let submit = ["--endpoint", &url, "task", "submit", &path, "--wait"];

    let shown = on_terminal(&url, &submit);
    assert!(shown.contains("\u{1b}["), "redrawn in place: {shown:?}");
    let states: Vec<&str> = shown
        .split(['\r', '\n'])
        .filter_map(|l| l.split_once("task ").map(|(_, rest)| rest))
        .filter(|rest| rest.contains(" · "))
        .collect();
    assert!(
        states.iter().any(|s| s.contains(": RUNNING · ")),
        "the state while it runs: {shown:?}"
    );
    let last = states.last().copied().unwrap_or_default();
    assert!(
        last.contains(": COMPLETED · ") && last.trim_end().ends_with('s'),
        "ends on the final state and the time: {last:?} in {shown:?}"
    );

    let json = [&submit[..], &["--output", "json"]].concat();
    let quiet = on_terminal(&url, &json);
    assert!(
        !quiet.contains(" · "),
        "no progress with --output json: {quiet:?}"
    );

    let piped = cli(&url).args(&json).output().expect("squadron");
    assert!(piped.status.success(), "{piped:?}");
    let task: serde_json::Value =
        serde_json::from_slice(&piped.stdout).expect("stdout is the JSON answer alone");
    assert_eq!(task["state"], "COMPLETED", "{task:#}");
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains(" · "),
        "nothing drawn off a terminal: {stderr:?}"
    );
}
