//! An ended task's files stay on its worker for its retention class's age
//! (`startup_profile.observation.retention_class`, the worker's `--output-retention`): a real
//! node and worker, a `short` task whose files go after a few seconds — its logs and artifacts
//! then answer 404 saying why, its directory holds nothing but the records — and a
//! `standard` one beside it that keeps them. An unknown class is refused at submission.

mod support;

use std::time::Duration;

use support::*;

const TASK_TIMEOUT: Duration = Duration::from_secs(60);
/// The `short` class's age on the test's worker.
const SHORT_AGE_S: u64 = 3;

fn manifest(repo: &std::path::Path, name: &str, class: Option<&str>) -> String {
    let profile = class.map_or(String::new(), |class| {
        format!(
            "startup_profile:\n  id: s\n  trigger: on_instance_ready\n  \
             session: {{ launcher: x, workdir: /workspace, cols: 80, rows: 24 }}\n  \
             observation: {{ retention_class: {class}, redaction_profile: credentials }}\n"
        )
    });
    format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: {name}\nrepository:\n  url: {}\n\
         agent:\n  prompt: p\n  provider: script\n  script: |\n    echo kept for a while\n    \
         echo report > report.txt\n\
         lifecycle:\n  artifact_patterns: [\"*.txt\"]\n\
         vm:\n  runtime: process\n{profile}",
        repo.display()
    )
}

fn run(url: &str, yaml: &str) -> u64 {
    let r = submit_yaml(url, yaml);
    assert!(r.ok(), "submission refused: {r:?}");
    let id = r.body["task_submitted"]["task"].as_u64().expect("task id");
    let task = wait_task_state(url, id, &["COMPLETED", "FAILED"], TASK_TIMEOUT);
    assert_eq!(task["state"], "COMPLETED", "{task:#}");
    id
}

fn logs(url: &str, id: u64) -> (u16, String) {
    http_text(&format!("{url}/api/v1/tasks/{id}/logs?stream=stdout")).expect("logs")
}

#[test]
fn a_short_task_s_files_go_after_its_age_and_a_standard_one_s_stay() {
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = git_repo(dir.path());
    let worker = WorkerProc::start_with(
        cluster.dir.path(),
        &unique_worker_id("w-retention"),
        vec![url.clone()],
        "process",
        vec![
            "--output-retention".into(),
            format!("short={SHORT_AGE_S}s,standard=1h"),
        ],
    );

    let refused = submit_yaml(&url, &manifest(&repo, "forever", Some("forever")));
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(
        refused.body["field"], "startup_profile.observation.retention_class",
        "{refused:?}"
    );

    let short = run(&url, &manifest(&repo, "short", Some("short")));
    let standard = run(&url, &manifest(&repo, "standard", None));
    for id in [short, standard] {
        let (status, text) = logs(&url, id);
        assert_eq!((status, text.as_str()), (200, "kept for a while\n"));
    }

    let mut seen = (0, String::new());
    let gone = wait_until(Duration::from_secs(SHORT_AGE_S + 20), || {
        seen = logs(&url, short);
        seen.0 == 404
    });
    assert!(gone.is_ok(), "the short task's logs stayed: {seen:?}");
    assert!(
        seen.1
            .contains("retention class \\\"short\\\" (3000 ms after the task ended)"),
        "{seen:?}"
    );
    let (status, body) = http_text(&format!(
        "{url}/api/v1/tasks/{short}/artifacts/files/report.txt"
    ))
    .expect("artifact");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("were removed from this worker"), "{body}");
    let mut left: Vec<String> = std::fs::read_dir(worker.task_dir(short))
        .expect("the task's directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["outputs-removed.json", "retention.json", "state.json"],
        "nothing of the task's clone, logs or artifacts stays"
    );

    // The standard task, ended at the same moment, keeps everything.
    let (status, text) = logs(&url, standard);
    assert_eq!((status, text.as_str()), (200, "kept for a while\n"));
    let (status, body) = http_text(&format!(
        "{url}/api/v1/tasks/{standard}/artifacts/files/report.txt"
    ))
    .expect("artifact");
    assert_eq!((status, body.as_str()), (200, "report\n"));
}

/// A worker refuses a class it does not know, or an age out of bounds, naming the flag.
#[test]
fn a_worker_refuses_an_unknown_class_or_a_bad_age() {
    for (value, says) in [
        ("forever=1d", "unknown retention class \"forever\""),
        ("short=10ms", "10 ms is outside"),
        ("short", "say CLASS=DURATION"),
    ] {
        let out = cli("https://127.0.0.1:1")
            .args(["worker", "--output-retention", value, "--data-dir"])
            .arg(tempfile::tempdir().expect("tempdir").path())
            .output()
            .expect("squadron worker");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{value}: started");
        assert!(err.contains(says), "{value}: {err}");
    }
}
