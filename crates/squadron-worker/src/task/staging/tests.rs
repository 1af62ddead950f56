//! Staging against real git repositories: layouts, branches, commits, subpaths, retries,
//! cancellation, idempotency and the URL kept out of every message.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use squadron_core::manifest::RetrySpec;

use super::*;
use crate::test_support::{events, git, git_output, spec_for, task_dir, write, SourceRepo};

fn fast() -> StagingOptions {
    StagingOptions {
        backoff_override_ms: Some(1),
        ..StagingOptions::default()
    }
}

fn task(id: u64) -> TaskId {
    TaskId::new(id).unwrap()
}

fn assert_clean(inbox: &Path) {
    assert_eq!(
        git(inbox, &["status", "--porcelain", "--untracked-files=all"]),
        ""
    );
}

#[tokio::test]
async fn clones_a_local_path_and_lays_out_the_task() {
    let source = SourceRepo::new();
    let (_tmp, dir) = task_dir(7);
    let spec = spec_for(&source.url());
    let report = stage(&dir, task(7), 1, &spec, &fast()).await.unwrap();

    assert_eq!(report.task, task(7));
    assert_eq!(report.attempt, 1);
    assert_eq!(
        report.base_commit.as_deref(),
        Some(source.main_head.as_str())
    );
    assert_eq!(report.branch.as_deref(), Some("main"));
    assert_eq!(report.workdir, "/mnt/inbox");
    assert_eq!(report.subpath, "");
    assert_eq!(report.task_md, TASK_MD_NAME);
    assert_eq!(report.clone_attempts, 1);
    assert_eq!(report.workdir_host(&dir), dir.inbox());

    for path in [dir.stdout_log(), dir.stderr_log()] {
        assert_eq!(std::fs::read(&path).unwrap(), b"", "{}", path.display());
    }
    assert!(dir.artifacts().is_dir() && dir.run().is_dir());
    let manifest: TaskSpec =
        yaml_serde::from_str(&std::fs::read_to_string(dir.manifest()).unwrap()).unwrap();
    assert_eq!(manifest, spec);

    let inbox = dir.inbox();
    assert_eq!(
        std::fs::read_to_string(inbox.join("src/lib.rs")).unwrap(),
        "pub fn answer() -> u32 {\n    43\n}\n"
    );
    assert_eq!(git(&inbox, &["rev-parse", "HEAD"]).trim(), source.main_head);
    assert_eq!(
        git(&inbox, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "main"
    );
    assert_clean(&inbox);

    let task_md = std::fs::read_to_string(dir.task_md()).unwrap();
    assert!(task_md.starts_with("# Fix the answer\n"), "{task_md}");
    assert!(task_md.contains("Make answer() return 44.\nKeep the tests green."));
    assert!(task_md.contains("Work in `/mnt/inbox`"), "{task_md}");
    assert!(task_md.contains(&source.main_head));
    let exclude = std::fs::read_to_string(inbox.join(".git/info/exclude")).unwrap();
    assert_eq!(exclude.lines().filter(|l| *l == "/TASK.md").count(), 1);

    // Objects are copies: an agent rewriting them cannot reach the source repository.
    let pack_or_loose = walk_files(&inbox.join(".git/objects"));
    assert!(!pack_or_loose.is_empty());
    for file in pack_or_loose {
        assert_eq!(
            std::fs::metadata(&file).unwrap().nlink(),
            1,
            "{}",
            file.display()
        );
    }

    let events = events(&dir);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["event"], "staged");
    assert_eq!(events[0]["base_commit"], source.main_head.as_str());
    assert_eq!(StagingReport::load(&dir).unwrap(), Some(report));
    assert_eq!(cloning_leftovers(&dir), 0);
}

fn cloning_leftovers(dir: &TaskDir) -> usize {
    std::fs::read_dir(dir.root())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_str()
                .unwrap()
                .starts_with(CLONING_DIR_PREFIX)
        })
        .count()
}

fn walk_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            } else {
                out.push(entry.path());
            }
        }
    }
    out
}

#[tokio::test]
async fn clones_a_file_url_at_a_branch() {
    let source = SourceRepo::new();
    let (_tmp, dir) = task_dir(8);
    let mut spec = spec_for(&source.file_url());
    spec.repository.branch = Some("feature".into());
    let report = stage(&dir, task(8), 1, &spec, &fast()).await.unwrap();

    assert_eq!(
        report.base_commit.as_deref(),
        Some(source.feature_head.as_str())
    );
    assert_eq!(report.branch.as_deref(), Some("feature"));
    let inbox = dir.inbox();
    assert_eq!(
        std::fs::read_to_string(inbox.join("README.md")).unwrap(),
        "# Project\n\nfeature line\n"
    );
    assert!(inbox.join("feature.txt").is_file());
    assert!(!inbox.join("docs/guide.md").exists());
    // The first commit of main, which feature starts from.
    assert_eq!(
        std::fs::read_to_string(inbox.join("src/lib.rs")).unwrap(),
        "pub fn answer() -> u32 {\n    42\n}\n"
    );
    assert_eq!(
        git(&inbox, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "feature"
    );
    assert_eq!(
        git(&inbox, &["rev-parse", "--abbrev-ref", "feature@{upstream}"]).trim(),
        "origin/feature"
    );
    assert_clean(&inbox);
}

#[tokio::test]
async fn checks_out_full_and_abbreviated_commits_detached() {
    let source = SourceRepo::new();

    let (_tmp, dir) = task_dir(9);
    let mut spec = spec_for(&source.url());
    spec.repository.commit = Some(source.main_first.clone());
    let report = stage(&dir, task(9), 1, &spec, &fast()).await.unwrap();
    assert_eq!(
        report.base_commit.as_deref(),
        Some(source.main_first.as_str())
    );
    assert_eq!(report.branch, None);
    let inbox = dir.inbox();
    assert_eq!(
        git(&inbox, &["rev-parse", "HEAD"]).trim(),
        source.main_first
    );
    assert!(!git_output(&inbox, &["symbolic-ref", "-q", "HEAD"])
        .status
        .success());
    assert!(std::fs::read_to_string(inbox.join("src/lib.rs"))
        .unwrap()
        .contains("42"));
    assert!(inbox.join("docs/guide.md").is_file());
    assert_clean(&inbox);

    let (_tmp2, dir) = task_dir(10);
    let mut spec = spec_for(&source.file_url());
    spec.repository.branch = Some("feature".into());
    spec.repository.commit = Some(source.feature_head[..8].to_string());
    let report = stage(&dir, task(10), 1, &spec, &fast()).await.unwrap();
    assert_eq!(
        report.base_commit.as_deref(),
        Some(source.feature_head.as_str())
    );
    assert_eq!(report.branch, None);
    assert!(dir.inbox().join("feature.txt").is_file());
    assert_clean(&dir.inbox());
}

#[tokio::test]
async fn unknown_commit_and_branch_fail_without_retries() {
    let source = SourceRepo::new();
    let (_tmp, dir) = task_dir(11);
    let mut spec = spec_for(&source.url());
    spec.repository.commit = Some("deadbeef00".into());
    let err = stage(&dir, task(11), 1, &spec, &fast())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("repository.commit") && err.contains("deadbeef00"),
        "{err}"
    );
    assert!(!err.contains(&source.url()), "{err}");
    assert!(StagingReport::load(&dir).unwrap().is_none());

    let (_tmp2, dir) = task_dir(12);
    let mut spec = spec_for(&source.url());
    spec.repository.branch = Some("no-such-branch".into());
    let err = stage(&dir, task(12), 1, &spec, &fast())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("repository.branch") && err.contains("does not exist"),
        "{err}"
    );
    assert!(events(&dir).iter().all(|e| e["event"] != "clone_retry"));
}

#[tokio::test]
async fn subpath_sets_the_workdir_and_must_exist() {
    let source = SourceRepo::new();
    let (_tmp, dir) = task_dir(13);
    let mut spec = spec_for(&source.url());
    spec.repository.subpath = Some("./packages//auth/".into());
    let report = stage(&dir, task(13), 1, &spec, &fast()).await.unwrap();
    assert_eq!(report.workdir, "/mnt/inbox/packages/auth");
    assert_eq!(report.subpath, "packages/auth");
    assert_eq!(report.workdir_host(&dir), dir.inbox().join("packages/auth"));
    let task_md = std::fs::read_to_string(dir.task_md()).unwrap();
    assert!(
        task_md.contains("Work in `/mnt/inbox/packages/auth`"),
        "{task_md}"
    );

    for (subpath, why) in [
        ("packages/nope", "does not exist"),
        ("README.md", "not a directory"),
    ] {
        let (_tmp, dir) = task_dir(14);
        let mut spec = spec_for(&source.url());
        spec.repository.subpath = Some(subpath.into());
        let err = stage(&dir, task(14), 1, &spec, &fast())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("repository.subpath") && err.contains(subpath) && err.contains(why),
            "{err}"
        );
    }
}

#[tokio::test]
async fn subpath_through_a_symlink_is_refused() {
    let source = SourceRepo::new();
    std::os::unix::fs::symlink("/etc", source.path.join("escape")).unwrap();
    git(&source.path, &["add", "escape"]);
    git(&source.path, &["commit", "-q", "-m", "link"]);
    let (_tmp, dir) = task_dir(15);
    let mut spec = spec_for(&source.url());
    spec.repository.subpath = Some("escape".into());
    let err = stage(&dir, task(15), 1, &spec, &fast())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("symbolic link"), "{err}");
}

#[tokio::test]
async fn a_bad_url_is_retried_then_fails_without_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let not_a_repo = tmp.path().join("not-a-repo");
    std::fs::create_dir_all(not_a_repo.join("sub")).unwrap();
    let cases = [
        (tmp.path().join("no-such-repo"), "local path does not exist"),
        (not_a_repo, ""),
    ];
    for (n, (path, why)) in cases.into_iter().enumerate() {
        let url = path.to_str().unwrap().to_string();
        let id = 16 + 100 * n as u64;
        let (_tmp, dir) = task_dir(id);
        let spec = spec_for(&url);
        assert_eq!(spec.lifecycle.retries.clone.max, 2);
        let err = stage(&dir, task(id), 1, &spec, &fast())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("repository.url"), "{err}");
        assert!(err.contains("after 3 attempt(s)"), "{err}");
        assert!(err.contains(why), "{err}");
        assert!(!err.contains(&url), "{err}");

        let retries: Vec<_> = events(&dir)
            .into_iter()
            .filter(|e| e["event"] == "clone_retry")
            .collect();
        assert_eq!(retries.len(), 3, "{retries:?}");
        for (i, event) in retries.iter().enumerate() {
            assert_eq!(event["attempt"], i as u64 + 1);
            assert!(event["ts_ms"].as_u64().unwrap() > 0);
            let error = event["error"].as_str().unwrap();
            assert!(!error.is_empty() && !error.contains(&url), "{error}");
        }
        assert_eq!(retries[0]["retry_in_ms"], 1);
        assert!(retries[2]["retry_in_ms"].is_null());
        assert!(!dir.inbox().exists());
        assert_eq!(cloning_leftovers(&dir), 0);
        assert!(StagingReport::load(&dir).unwrap().is_none());
    }
}

#[tokio::test]
async fn retries_wait_the_policy_backoff() {
    let tmp = tempfile::tempdir().unwrap();
    let url = tmp.path().join("absent").to_str().unwrap().to_string();
    let (_tmp, dir) = task_dir(17);
    let mut spec = spec_for(&url);
    spec.lifecycle.retries.clone = RetrySpec::new(2, &[200, 300]);
    let started = Instant::now();
    stage(&dir, task(17), 1, &spec, &StagingOptions::default())
        .await
        .unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(500));
    let delays: Vec<_> = events(&dir)
        .iter()
        .map(|e| e["retry_in_ms"].clone())
        .collect();
    assert_eq!(
        delays,
        [
            serde_json::json!(200),
            serde_json::json!(300),
            serde_json::Value::Null
        ]
    );
}

#[tokio::test]
async fn an_oversized_clone_is_aborted_once() {
    let source = SourceRepo::new();
    let (_tmp, dir) = task_dir(18);
    let spec = spec_for(&source.file_url());
    let opts = StagingOptions {
        clone_bytes_max: 16,
        ..fast()
    };
    let err = stage(&dir, task(18), 1, &spec, &opts)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("more than 16 bytes"), "{err}");
    assert!(events(&dir).iter().all(|e| e["event"] != "clone_retry"));
    assert!(!dir.inbox().exists());
}

#[test]
fn a_cancelled_clone_leaves_nothing() {
    let source = SourceRepo::new();
    let (_tmp, dir) = task_dir(25);
    std::fs::create_dir_all(dir.root()).unwrap();
    let cancelled = AtomicBool::new(true);
    // Over the git transport the progress callback stops it; a local copy has no
    // progress reports and is discarded once done.
    for url in [source.file_url(), source.url()] {
        let outcome = clone_once(&url, &dir.inbox(), false, &cancelled, u64::MAX);
        match outcome {
            Err(CloneFailure::Transient(message)) => assert!(!message.contains(&source.url())),
            _ => panic!("{url}: a cancelled clone must fail"),
        }
        assert!(!dir.inbox().exists());
        assert_eq!(cloning_leftovers(&dir), 0);
    }
    let live = AtomicBool::new(false);
    assert!(clone_once(&source.url(), &dir.inbox(), false, &live, u64::MAX).is_ok());
    assert!(dir.inbox().join("README.md").is_file());
    assert_eq!(cloning_leftovers(&dir), 0);
}

#[tokio::test]
async fn staging_again_is_a_no_op_for_the_same_attempt() {
    let source = SourceRepo::new();
    let (_tmp, dir) = task_dir(19);
    let spec = spec_for(&source.url());
    let first = stage(&dir, task(19), 1, &spec, &fast()).await.unwrap();
    // The agent's edits of this attempt survive a recovering worker staging again.
    write(&dir.inbox().join("README.md"), "edited by the agent\n");
    let again = stage(&dir, task(19), 1, &spec, &fast()).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(
        std::fs::read_to_string(dir.inbox().join("README.md")).unwrap(),
        "edited by the agent\n"
    );
    assert_eq!(events(&dir).len(), 1);

    // A new attempt starts from the repository again.
    write(&dir.stdout_log(), "attempt 1 output\n");
    let second = stage(&dir, task(19), 2, &spec, &fast()).await.unwrap();
    assert_eq!(second.attempt, 2);
    assert_eq!(
        std::fs::read_to_string(dir.inbox().join("README.md")).unwrap(),
        "# Project\n\nfirst line\n"
    );
    assert_eq!(std::fs::read(dir.stdout_log()).unwrap(), b"");
    assert_clean(&dir.inbox());
}

#[tokio::test]
async fn a_crash_before_the_marker_restages_from_scratch() {
    let source = SourceRepo::new();
    let (_tmp, dir) = task_dir(20);
    let spec = spec_for(&source.url());
    stage(&dir, task(20), 1, &spec, &fast()).await.unwrap();
    std::fs::remove_file(staged_marker(&dir)).unwrap();
    write(&dir.inbox().join("half-written"), "junk");
    write(&dir.root().join(".inbox.cloning.1.0/.git/HEAD"), "junk");
    let report = stage(&dir, task(20), 1, &spec, &fast()).await.unwrap();
    assert!(!dir.inbox().join("half-written").exists());
    assert_eq!(cloning_leftovers(&dir), 0);
    assert_eq!(
        report.base_commit.as_deref(),
        Some(source.main_head.as_str())
    );
    let exclude = std::fs::read_to_string(dir.inbox().join(".git/info/exclude")).unwrap();
    assert_eq!(exclude.lines().filter(|l| *l == "/TASK.md").count(), 1);
    assert_clean(&dir.inbox());
}

#[tokio::test]
async fn a_tracked_task_md_is_left_alone() {
    let source = SourceRepo::new();
    write(&source.path.join("TASK.md"), "the project's own file\n");
    git(&source.path, &["add", "TASK.md"]);
    git(&source.path, &["commit", "-q", "-m", "task file"]);
    let (_tmp, dir) = task_dir(21);
    let report = stage(&dir, task(21), 1, &spec_for(&source.url()), &fast())
        .await
        .unwrap();
    assert_eq!(report.task_md, TASK_MD_FALLBACK_NAME);
    assert_eq!(
        std::fs::read_to_string(dir.task_md()).unwrap(),
        "the project's own file\n"
    );
    let ours = std::fs::read_to_string(dir.inbox().join(TASK_MD_FALLBACK_NAME)).unwrap();
    assert!(ours.contains("Make answer() return 44."));
    assert_clean(&dir.inbox());
}

#[tokio::test]
async fn an_empty_repository_stages_with_no_base() {
    let tmp = tempfile::tempdir().unwrap();
    git(tmp.path(), &["init", "-q", "empty"]);
    let (_tmp, dir) = task_dir(22);
    let url = tmp.path().join("empty").to_str().unwrap().to_string();
    let report = stage(&dir, task(22), 1, &spec_for(&url), &fast())
        .await
        .unwrap();
    assert_eq!(report.base_commit, None);
    assert!(dir.task_md().is_file());
}

#[tokio::test]
async fn the_task_must_own_the_directory_and_the_spec_must_be_valid() {
    let source = SourceRepo::new();
    let (_tmp, dir) = task_dir(23);
    let spec = spec_for(&source.url());
    let err = stage(&dir, task(24), 1, &spec, &fast()).await.unwrap_err();
    assert!(err.to_string().contains("task_id"), "{err}");
    let mut bad = spec.clone();
    bad.agent.prompt.clear();
    let err = stage(&dir, task(23), 1, &bad, &fast()).await.unwrap_err();
    assert!(err.to_string().contains("agent.prompt"), "{err}");
}

#[test]
fn a_long_prompt_is_cut_in_task_md() {
    let mut spec = spec_for("/srv/repo");
    spec.agent.prompt = "é".repeat(TASK_MD_BYTES_MAX);
    let text = task_md_text(&spec, "/mnt/inbox", None);
    assert!(text.len() <= TASK_MD_BYTES_MAX, "{}", text.len());
    assert!(text.contains("given whole on standard input"));
    assert!(text.contains("## Instructions"));
}

#[test]
fn urls_and_credentials_never_reach_messages() {
    let cases = [
        (
            "failed to resolve path '/srv/git/repo': No such file",
            "/srv/git/repo",
        ),
        (
            "could not read file:///srv/git/repo/ or /srv/git/repo",
            "file:///srv/git/repo",
        ),
        (
            "failed to connect to https://github.com/org/repo",
            "https://github.com/org/repo",
        ),
        (
            "unexpected http status for ssh://git@host/x.git",
            "ssh://git@host/x.git",
        ),
        (
            "auth failed for git@github.com:org/repo.git",
            "git@github.com:org/repo.git",
        ),
    ];
    for (message, url) in cases {
        let redacted = redact_url(message, url);
        assert!(redacted.contains(URL_PLACEHOLDER), "{redacted}");
        let without_user = url.rsplit('@').next().unwrap();
        assert!(!redacted.contains(without_user), "{url}: {redacted}");
    }
    let leaked = redact_url("redirect to https://user:hunter2@mirror.example/repo", "/x");
    assert!(
        !leaked.contains("hunter2") && leaked.contains("https://***@mirror"),
        "{leaked}"
    );
    let long = redact_url(&"x".repeat(CLONE_ERROR_BYTES_MAX * 2), "/x");
    assert_eq!(long.len(), CLONE_ERROR_BYTES_MAX);
}
