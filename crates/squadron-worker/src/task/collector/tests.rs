//! The collector against real git repositories: the patch applies to a fresh clone, metadata,
//! patterns, symlinks and hostile `.git` directories, and every cap.

use std::collections::BTreeMap;

use super::untracked::quote_path;
use super::*;
use crate::task::staging::{stage, StagingOptions};
use crate::test_support::{binary_blob, git, git_output, spec_for, task_dir, write, SourceRepo};

fn facts(attempt: u32) -> RunFacts {
    RunFacts {
        attempt,
        runtime: RuntimeKind::Process,
        exit_code: Some(0),
        started_at_ms: 1_000,
        finished_at_ms: 4_500,
        stdout_bytes: 10,
        stderr_bytes: 2,
        lines: 3,
        events: 4,
    }
}

async fn staged(
    source: &SourceRepo,
    id: u64,
    patterns: &[&str],
) -> (tempfile::TempDir, TaskDir, TaskSpec) {
    let (tmp, dir) = task_dir(id);
    let mut spec = spec_for(&source.url());
    spec.lifecycle.artifact_patterns = patterns.iter().map(|p| p.to_string()).collect();
    stage(&dir, dir.task(), 1, &spec, &StagingOptions::default())
        .await
        .unwrap();
    (tmp, dir, spec)
}

/// Clones the source into a fresh directory at `commit` and applies `patch` with git.
fn apply_to_fresh_clone(source: &SourceRepo, commit: &str, patch: &Path) -> tempfile::TempDir {
    let fresh = tempfile::tempdir().unwrap();
    git(fresh.path(), &["clone", "-q", &source.url(), "c"]);
    let clone = fresh.path().join("c");
    git(&clone, &["checkout", "-q", "--detach", commit]);
    let out = git_output(&clone, &["apply", "--check", patch.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    git(&clone, &["apply", patch.to_str().unwrap()]);
    fresh
}

fn sizes_on_disk(artifacts: &Path) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut stack = vec![artifacts.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let meta = std::fs::symlink_metadata(entry.path()).unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                let rel = entry
                    .path()
                    .strip_prefix(artifacts)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string();
                out.insert(rel, meta.len());
            }
        }
    }
    out
}

#[tokio::test]
async fn the_patch_reproduces_every_change_on_a_fresh_clone() {
    let source = SourceRepo::new();
    let (_tmp, dir, spec) = staged(&source, 7, &[]).await;
    let inbox = dir.inbox();
    // What an agent does: edit text and binary files, delete, add with and without
    // `git add`, commit part of it, and leave ignored files around.
    write(
        &inbox.join("README.md"),
        "# Project\n\nchanged by the agent\n",
    );
    let new_blob = binary_blob(9, 6000);
    write(&inbox.join("data.bin"), &new_blob);
    std::fs::remove_file(inbox.join("docs/guide.md")).unwrap();
    write(&inbox.join("added.txt"), "staged new file\n");
    git(&inbox, &["add", "added.txt"]);
    git(&inbox, &["config", "user.name", "Agent"]);
    git(&inbox, &["config", "user.email", "agent@squadron.invalid"]);
    write(
        &inbox.join("src/lib.rs"),
        "pub fn answer() -> u32 {\n    44\n}\n",
    );
    git(
        &inbox,
        &["commit", "-q", "-m", "agent commit", "src/lib.rs"],
    );
    write(&inbox.join("no-newline.txt"), "tail without newline");
    git(&inbox, &["add", "no-newline.txt"]);
    write(&inbox.join("notes/todo.txt"), "untracked\n");
    write(&inbox.join("untracked.bin"), binary_blob(3, 100));
    write(&inbox.join("build.tmp"), "ignored\n");
    write(&inbox.join("ignored/deep/x.txt"), "ignored dir\n");

    let report = collect(&dir, dir.task(), &spec, &facts(1), &CollectSource::Inbox)
        .await
        .unwrap();
    let artifacts = dir.artifacts();
    let patch_path = artifacts.join("7.patch");
    let patch = std::fs::read_to_string(&patch_path).unwrap();
    assert!(patch.contains("GIT binary patch"), "{patch}");
    assert!(!patch.contains("TASK.md"));
    assert!(!patch.contains("todo.txt") && !patch.contains("build.tmp"));

    let fresh = apply_to_fresh_clone(&source, &source.main_head, &patch_path);
    let clone = fresh.path().join("c");
    let read = |p: &str| std::fs::read(clone.join(p)).unwrap();
    assert_eq!(read("README.md"), b"# Project\n\nchanged by the agent\n");
    assert_eq!(read("data.bin"), new_blob);
    assert_eq!(read("added.txt"), b"staged new file\n");
    assert_eq!(read("no-newline.txt"), b"tail without newline");
    assert_eq!(read("src/lib.rs"), b"pub fn answer() -> u32 {\n    44\n}\n");
    assert!(!clone.join("docs/guide.md").exists());
    assert!(!clone.join("notes/todo.txt").exists());

    let untracked = std::fs::read_to_string(artifacts.join("7-untracked.txt")).unwrap();
    assert_eq!(untracked, "notes/todo.txt\nuntracked.bin\n");

    let meta = &report.metadata;
    let summary = meta.patch.as_ref().unwrap();
    assert_eq!(summary.files, 6);
    assert!(!summary.truncated);
    assert_eq!(summary.bytes, patch.len() as u64);
    assert_eq!(meta.base_commit.as_deref(), Some(source.main_head.as_str()));
    assert_eq!(meta.untracked.as_ref().unwrap().paths, 2);
    assert_eq!(
        report.names(),
        ["7.patch", "7-untracked.txt", "metadata.json"]
    );
    let on_disk = sizes_on_disk(&artifacts);
    let reported: BTreeMap<String, u64> = report
        .artifacts
        .iter()
        .map(|a| (a.name.clone(), a.bytes))
        .collect();
    assert_eq!(on_disk, reported);
}

#[tokio::test]
async fn metadata_records_the_run() {
    let source = SourceRepo::new();
    let (_tmp, dir, spec) = staged(&source, 8, &["*.txt"]).await;
    write(&dir.inbox().join("out.txt"), "result\n");
    let mut run = facts(1);
    run.exit_code = Some(3);
    run.runtime = RuntimeKind::Docker;
    let report = collect(&dir, dir.task(), &spec, &run, &CollectSource::Inbox)
        .await
        .unwrap();
    let text = std::fs::read_to_string(dir.artifacts().join(METADATA_NAME)).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["task_id"], 8);
    assert_eq!(json["attempt"], 1);
    assert_eq!(json["name"], "Fix the answer");
    assert_eq!(json["runtime"], "docker");
    assert_eq!(json["exit_code"], 3);
    assert_eq!(json["success"], false);
    assert_eq!(json["started_at_ms"], 1_000);
    assert_eq!(json["finished_at_ms"], 4_500);
    assert_eq!(json["duration_ms"], 3_500);
    assert!(json["collected_at_ms"].as_u64().unwrap() > 1_000_000);
    assert_eq!(
        json["stats"],
        serde_json::json!({"stdout_bytes": 10, "stderr_bytes": 2, "lines": 3, "events": 4})
    );
    assert_eq!(json["base_commit"], source.main_head.as_str());
    assert_eq!(json["workdir"], "/mnt/inbox");
    assert_eq!(json["patch"]["name"], "8.patch");
    assert_eq!(json["untracked"]["name"], "8-untracked.txt");
    assert_eq!(json["limits"]["patch_bytes_max"], PATCH_BYTES_MAX);
    let names: Vec<&str> = json["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["8.patch", "8-untracked.txt", "files/out.txt"]);
    assert_eq!(json["artifacts"][2]["bytes"], 7);
    assert_eq!(json["skipped_total"], 0);
    let decoded: CollectMetadata = serde_json::from_str(&text).unwrap();
    assert_eq!(decoded, report.metadata);

    run.exit_code = Some(0);
    let report = collect(&dir, dir.task(), &spec, &run, &CollectSource::Inbox)
        .await
        .unwrap();
    assert!(report.metadata.success);
    run.exit_code = None;
    let report = collect(&dir, dir.task(), &spec, &run, &CollectSource::Inbox)
        .await
        .unwrap();
    assert!(!report.metadata.success && report.metadata.exit_code.is_none());
}

#[tokio::test]
async fn patterns_select_files_under_files_dir() {
    let source = SourceRepo::new();
    let patterns = ["*.txt", "reports/*.json", "coverage/**/*", "**/*.log"];
    let (_tmp, dir, spec) = staged(&source, 9, &patterns).await;
    let inbox = dir.inbox();
    for (path, body) in [
        ("top.txt", "top"),
        ("notes/nested.txt", "not top-level"),
        ("reports/a.json", "{}"),
        ("reports/deep/b.json", "{}"),
        ("reports/a.jsonl", ""),
        ("coverage/index.html", "<html>"),
        ("coverage/lcov/x/y.info", "TN:"),
        ("root.log", "r"),
        ("logs/run.log", "l"),
        ("ignored/x.log", "ignored by git, still an artifact"),
        ("metadata.json", "{\"forged\": true}"),
        ("9.patch", "forged patch"),
    ] {
        write(&inbox.join(path), body);
    }
    // Never copied: the task's own instructions and git's internals.
    write(&inbox.join(".git/hooks/x.log"), "inside .git");

    let report = collect(&dir, dir.task(), &spec, &facts(1), &CollectSource::Inbox)
        .await
        .unwrap();
    let files: Vec<String> = report
        .names()
        .into_iter()
        .filter(|n| n.starts_with("files/"))
        .collect();
    assert_eq!(
        files,
        [
            "files/coverage/index.html",
            "files/coverage/lcov/x/y.info",
            "files/ignored/x.log",
            "files/logs/run.log",
            "files/reports/a.json",
            "files/root.log",
            "files/top.txt",
        ]
    );
    let artifacts = dir.artifacts();
    assert_eq!(
        std::fs::read_to_string(artifacts.join("files/coverage/lcov/x/y.info")).unwrap(),
        "TN:"
    );
    // The worktree's look-alikes do not replace the collector's own files.
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(artifacts.join("metadata.json")).unwrap())
            .unwrap();
    assert_eq!(meta["task_id"], 9);
    assert_ne!(
        std::fs::read_to_string(artifacts.join("9.patch")).unwrap(),
        "forged patch"
    );
    assert!(!artifacts.join("files/TASK.md").exists());
}

#[tokio::test]
async fn patterns_are_relative_to_the_subpath() {
    let source = SourceRepo::new();
    let (tmp, dir) = task_dir(10);
    let mut spec = spec_for(&source.url());
    spec.repository.subpath = Some("packages/auth".into());
    spec.lifecycle.artifact_patterns = vec!["**/*.txt".into()];
    stage(&dir, dir.task(), 1, &spec, &StagingOptions::default())
        .await
        .unwrap();
    write(&dir.inbox().join("packages/auth/out/r.txt"), "r");
    write(&dir.inbox().join("outside-subpath.txt"), "no");
    let report = collect(&dir, dir.task(), &spec, &facts(1), &CollectSource::Inbox)
        .await
        .unwrap();
    let files: Vec<String> = report
        .names()
        .into_iter()
        .filter(|n| n.starts_with("files/"))
        .collect();
    assert_eq!(files, ["files/mod.txt", "files/out/r.txt"]);
    assert_eq!(report.metadata.workdir, "/mnt/inbox/packages/auth");
    drop(tmp);
}

#[tokio::test]
async fn symlinks_are_never_followed() {
    let source = SourceRepo::new();
    let outside = tempfile::tempdir().unwrap();
    write(&outside.path().join("secret.json"), "host secret");
    write(&outside.path().join("more/secret.txt"), "host secret");
    let (_tmp, dir, spec) = staged(&source, 11, &["**/*"]).await;
    let inbox = dir.inbox();
    std::fs::create_dir_all(inbox.join("reports")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.json"),
        inbox.join("reports/leak.json"),
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path(), inbox.join("linked-dir")).unwrap();
    std::os::unix::fs::symlink(inbox.join("README.md"), inbox.join("inner-link.md")).unwrap();

    let report = collect(&dir, dir.task(), &spec, &facts(1), &CollectSource::Inbox)
        .await
        .unwrap();
    let names = report.names();
    assert!(names.contains(&"files/README.md".to_string()), "{names:?}");
    for name in &names {
        assert!(
            !name.contains("leak") && !name.contains("linked-dir") && !name.contains("inner-link"),
            "{name}"
        );
    }
    let copied = sizes_on_disk(&dir.artifacts());
    assert!(copied.keys().all(|k| !k.contains("secret")), "{copied:?}");
    let skipped: BTreeMap<&str, &str> = report
        .metadata
        .skipped
        .iter()
        .map(|s| (s.path.as_str(), s.reason.as_str()))
        .collect();
    assert_eq!(
        skipped.get("reports/leak.json"),
        Some(&"symbolic link, not followed")
    );
    assert_eq!(
        skipped.get("inner-link.md"),
        Some(&"symbolic link, not followed")
    );
    assert_eq!(
        skipped.get("linked-dir"),
        Some(&"symbolic link, not followed")
    );
    // The patch shows the links as links, never their targets' content.
    let patch = std::fs::read_to_string(dir.artifacts().join("11.patch")).unwrap();
    assert!(!patch.contains("host secret"));
}

#[tokio::test]
async fn a_hostile_git_directory_cannot_redirect_the_collector() {
    let source = SourceRepo::new();
    let outside = tempfile::tempdir().unwrap();
    write(&outside.path().join("README.md"), "host file\n");
    let (_tmp, dir, spec) = staged(&source, 12, &[]).await;
    let inbox = dir.inbox();
    write(&inbox.join("README.md"), "agent change\n");
    // Point git's work tree at the host, and borrow objects from another repository.
    git(
        &inbox,
        &["config", "core.worktree", outside.path().to_str().unwrap()],
    );
    write(
        &inbox.join(".git/objects/info/alternates"),
        format!("{}/.git/objects\n", source.url()),
    );
    let report = collect(&dir, dir.task(), &spec, &facts(1), &CollectSource::Inbox)
        .await
        .unwrap();
    let patch = std::fs::read_to_string(dir.artifacts().join("12.patch")).unwrap();
    assert!(patch.contains("+agent change"), "{patch}");
    assert!(!patch.contains("host file"));
    assert!(!inbox.join(".git/objects/info/alternates").exists());
    assert!(
        report
            .metadata
            .notes
            .iter()
            .any(|n| n.contains("alternates")),
        "{:?}",
        report.metadata.notes
    );

    // A .git that is a link (or gitfile) elsewhere: no git outputs, but the rest works.
    let git_dir = inbox.join(".git");
    std::fs::rename(&git_dir, outside.path().join("moved.git")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("moved.git"), &git_dir).unwrap();
    let report = collect(&dir, dir.task(), &spec, &facts(1), &CollectSource::Inbox)
        .await
        .unwrap();
    assert_eq!(report.names(), ["metadata.json"]);
    assert!(report.metadata.patch.is_none());
    assert!(
        report
            .metadata
            .notes
            .iter()
            .any(|n| n.contains("not a plain directory")),
        "{:?}",
        report.metadata.notes
    );
}

#[tokio::test]
async fn the_patch_cap_leaves_out_whole_files_and_says_so() {
    let source = SourceRepo::new();
    let (_tmp, dir, spec) = staged(&source, 13, &[]).await;
    let inbox = dir.inbox();
    write(&inbox.join("README.md"), "# Project\n\nsmall change\n");
    write(&inbox.join("big.txt"), "line of text\n".repeat(1_000));
    git(&inbox, &["add", "big.txt"]);
    let limits = CollectLimits {
        patch_bytes_max: 2_000,
        ..CollectLimits::default()
    };
    let report = collect_with_limits(&dir, dir.task(), &spec, &facts(1), &limits)
        .await
        .unwrap();
    let summary = report.metadata.patch.clone().unwrap();
    assert!(summary.truncated);
    assert_eq!(summary.omitted, ["big.txt"]);
    assert_eq!(summary.omitted_total, 1);
    assert_eq!(summary.files, 1);
    assert!(summary.bytes <= 2_000);
    assert!(report
        .metadata
        .notes
        .iter()
        .any(|n| n.contains("left out of the patch")));
    // What is in the patch still applies.
    let fresh = apply_to_fresh_clone(
        &source,
        &source.main_head,
        &dir.artifacts().join("13.patch"),
    );
    assert_eq!(
        std::fs::read_to_string(fresh.path().join("c/README.md")).unwrap(),
        "# Project\n\nsmall change\n"
    );
    assert!(!fresh.path().join("c/big.txt").exists());
}

#[tokio::test]
async fn artifact_caps_skip_and_record() {
    let source = SourceRepo::new();
    let (_tmp, dir, spec) = staged(&source, 14, &["out/*"]).await;
    let inbox = dir.inbox();
    write(&inbox.join("out/a-small"), "x".repeat(60));
    write(&inbox.join("out/b-huge"), "x".repeat(500));
    write(&inbox.join("out/c-small"), "x".repeat(60));
    write(&inbox.join("out/d-small"), "x".repeat(60));
    write(&inbox.join("out/e-small"), "x".repeat(10));
    for i in 0..3 {
        write(&inbox.join(format!("untracked-{i}")), "u");
    }
    let limits = CollectLimits {
        artifact_file_bytes_max: 100,
        artifact_total_bytes_max: 150,
        artifact_files_max: 3,
        untracked_paths_max: 2,
        ..CollectLimits::default()
    };
    let report = collect_with_limits(&dir, dir.task(), &spec, &facts(1), &limits)
        .await
        .unwrap();
    let files: Vec<String> = report
        .names()
        .into_iter()
        .filter(|n| n.starts_with("files/"))
        .collect();
    assert_eq!(
        files,
        [
            "files/out/a-small",
            "files/out/c-small",
            "files/out/e-small"
        ]
    );
    let skipped: BTreeMap<&str, &str> = report
        .metadata
        .skipped
        .iter()
        .map(|s| (s.path.as_str(), s.reason.as_str()))
        .collect();
    assert!(
        skipped["out/b-huge"].contains("artifact_file_bytes_max"),
        "{skipped:?}"
    );
    assert!(
        skipped["out/d-small"].contains("artifact_total_bytes_max"),
        "{skipped:?}"
    );
    assert_eq!(report.metadata.skipped_total, 2);
    assert!(!dir.artifacts().join("files/out/b-huge").exists());

    let untracked = report.metadata.untracked.clone().unwrap();
    assert!(untracked.truncated);
    assert_eq!(untracked.paths, 2);
    let list = std::fs::read_to_string(dir.artifacts().join("14-untracked.txt")).unwrap();
    assert_eq!(list.lines().count(), 2);

    // The file-count cap.
    let limits = CollectLimits {
        artifact_files_max: 1,
        ..CollectLimits::default()
    };
    let report = collect_with_limits(&dir, dir.task(), &spec, &facts(1), &limits)
        .await
        .unwrap();
    assert_eq!(report.metadata.skipped_total, 4);
    assert!(report
        .metadata
        .skipped
        .iter()
        .any(|s| s.reason.contains("artifact_files_max")));
}

#[tokio::test]
async fn whatever_the_sandbox_left_in_artifacts_is_replaced() {
    let source = SourceRepo::new();
    let outside = tempfile::tempdir().unwrap();
    let (_tmp, dir, spec) = staged(&source, 15, &["*.txt"]).await;
    write(&dir.inbox().join("r.txt"), "r");
    // A planted link where the collector writes: it must not be written through.
    std::fs::create_dir_all(dir.artifacts()).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.artifacts().join("files")).unwrap();
    write(&dir.artifacts().join("stale"), "old");
    let report = collect(&dir, dir.task(), &spec, &facts(1), &CollectSource::Inbox)
        .await
        .unwrap();
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    assert!(!std::fs::symlink_metadata(dir.artifacts().join("files"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!dir.artifacts().join("stale").exists());
    assert!(
        report
            .metadata
            .notes
            .iter()
            .any(|n| n.contains("replaced 2 entries")),
        "{:?}",
        report.metadata.notes
    );
    assert!(!dir.root().join(ASSEMBLY_DIR_NAME).exists());

    // The artifacts directory itself replaced by a link.
    remove_path(&dir.artifacts()).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.artifacts()).unwrap();
    collect(&dir, dir.task(), &spec, &facts(1), &CollectSource::Inbox)
        .await
        .unwrap();
    assert!(std::fs::symlink_metadata(dir.artifacts()).unwrap().is_dir());
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn without_a_staging_record_the_patch_is_relative_to_head() {
    let source = SourceRepo::new();
    let (_tmp, dir, spec) = staged(&source, 16, &[]).await;
    std::fs::remove_file(crate::task::staging::staged_marker(&dir)).unwrap();
    write(&dir.inbox().join("README.md"), "edited\n");
    let report = collect(&dir, dir.task(), &spec, &facts(1), &CollectSource::Inbox)
        .await
        .unwrap();
    assert_eq!(
        report.metadata.base_commit.as_deref(),
        Some(source.main_head.as_str())
    );
    assert!(report
        .metadata
        .notes
        .iter()
        .any(|n| n.contains("no staging record")));
    let patch = std::fs::read_to_string(dir.artifacts().join("16.patch")).unwrap();
    assert!(patch.contains("+edited"));
    let err = collect(
        &dir,
        TaskId::new(99).unwrap(),
        &spec,
        &facts(1),
        &CollectSource::Inbox,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("task_id"));
}

#[tokio::test]
async fn a_linked_object_keeps_git_out() {
    let source = SourceRepo::new();
    let (_tmp, dir, spec) = staged(&source, 17, &["*.md"]).await;
    let objects = dir.inbox().join(".git/objects/ab");
    std::fs::create_dir_all(&objects).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", objects.join("cdef0123")).unwrap();
    let report = collect(&dir, dir.task(), &spec, &facts(1), &CollectSource::Inbox)
        .await
        .unwrap();
    assert!(report.metadata.patch.is_none() && report.metadata.untracked.is_none());
    assert!(
        report
            .metadata
            .notes
            .iter()
            .any(|n| n.contains("symbolic link")),
        "{:?}",
        report.metadata.notes
    );
    // Pattern artifacts do not depend on git.
    assert!(report.names().contains(&"files/README.md".to_string()));
}

#[test]
fn notes_are_capped() {
    let notes: Vec<String> = (0..NOTES_MAX + 10).map(|i| format!("n{i}")).collect();
    let capped = capped_notes(notes);
    assert_eq!(capped.len(), NOTES_MAX);
    assert_eq!(capped.last().unwrap(), "11 more notes not kept");
    assert_eq!(capped_notes(vec!["a".into()]), ["a"]);
}

#[test]
fn untracked_paths_are_one_per_line() {
    assert_eq!(quote_path(b"src/a.rs"), "src/a.rs");
    assert_eq!(quote_path("é/ü.txt".as_bytes()), "é/ü.txt");
    assert_eq!(quote_path(b"a\nb"), "\"a\\nb\"");
    assert_eq!(quote_path(b"q\"\\"), "\"q\\\"\\\\\"");
    assert_eq!(quote_path(b"bad\xffname"), "\"bad\\377name\"");
    assert_eq!(quote_path(b"\x01"), "\"\\001\"");
}

/// A FIFO where git reads by path — a `.gitignore` of the work tree, `.git/info/exclude` —
/// would hold the collection's open forever: FIFOs, sockets and device nodes are removed
/// before git reads the tree, and the patch is still made. A `.git/config` that is a FIFO,
/// or that includes another file, keeps git out instead.
#[tokio::test]
async fn fifos_never_hang_the_collection_and_config_includes_keep_git_out() {
    let fifo = |path: &Path| {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap()
    };
    let source = SourceRepo::new();
    let (_tmp, dir, spec) = staged(&source, 14, &[]).await;
    let inbox = dir.inbox();
    write(&inbox.join("README.md"), "agent change\n");
    std::fs::create_dir_all(inbox.join("deep/er")).unwrap();
    fifo(&inbox.join("deep/er/.gitignore"));
    let _ = std::fs::remove_file(inbox.join(".git/info/exclude"));
    fifo(&inbox.join(".git/info/exclude"));
    let collected = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        collect(&dir, dir.task(), &spec, &facts(1), &CollectSource::Inbox),
    )
    .await
    .expect("the collection hung on a FIFO")
    .unwrap();
    let patch = std::fs::read_to_string(dir.artifacts().join("14.patch")).unwrap();
    assert!(patch.contains("+agent change"), "{patch}");
    assert!(!inbox.join("deep/er/.gitignore").exists());
    assert!(
        collected.metadata.notes.iter().any(|n| n.contains("FIFOs")),
        "{:?}",
        collected.metadata.notes
    );

    // An include in .git/config: no git outputs, but the rest works.
    let config = inbox.join(".git/config");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("[ include ]\n\tpath = /etc/gitconfig\n");
    write(&config, &text);
    let report = collect(&dir, dir.task(), &spec, &facts(1), &CollectSource::Inbox)
        .await
        .unwrap();
    assert!(report.metadata.patch.is_none());
    assert!(
        report.metadata.notes.iter().any(|n| n.contains("includes")),
        "{:?}",
        report.metadata.notes
    );
}

/// What else would have git (root) read a file the sandbox chose: a link where git reads
/// by path — a `.gitignore`, anything in `.git` —, an include hidden behind a byte order mark,
/// settings that name files. Each keeps git out with a note naming it; the rest works.
#[tokio::test]
async fn links_and_settings_that_point_git_elsewhere_keep_it_out() {
    let source = SourceRepo::new();
    let outside = tempfile::tempdir().unwrap();
    write(&outside.path().join("secret"), "host file\n");
    let (_tmp, dir, spec) = staged(&source, 15, &[]).await;
    let inbox = dir.inbox();
    write(&inbox.join("README.md"), "agent change\n");
    let ignore = inbox.join("sub/.gitignore");
    std::fs::create_dir_all(ignore.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), &ignore).unwrap();
    git_refused(&dir, &spec, "sub/.gitignore is a symbolic link").await;
    std::fs::remove_file(&ignore).unwrap();

    // A hook linked in by a setup script is no reason (git runs none here).
    std::os::unix::fs::symlink(
        outside.path().join("secret"),
        inbox.join(".git/hooks/pre-commit"),
    )
    .unwrap();
    let git_file = inbox.join(".git/shallow");
    std::os::unix::fs::symlink(outside.path().join("secret"), &git_file).unwrap();
    git_refused(&dir, &spec, ".git/shallow is a symbolic link").await;
    std::fs::remove_file(&git_file).unwrap();

    let config = inbox.join(".git/config");
    let plain = std::fs::read_to_string(&config).unwrap();
    write(
        &config,
        format!("\u{feff}[include]\n\tpath = /etc/gitconfig\n{plain}"),
    );
    git_refused(&dir, &spec, "includes other files").await;
    write(
        &config,
        format!("{plain}[core]\n\texcludesFile = /etc/shadow\n"),
    );
    git_refused(&dir, &spec, "core.excludesfile").await;
    write(&config, &plain);
    write(
        &inbox.join(".git/config.worktree"),
        "[include]\n\tpath = /etc/gitconfig\n",
    );
    git_refused(&dir, &spec, "config.worktree exists").await;
    std::fs::remove_file(inbox.join(".git/config.worktree")).unwrap();
    let report = collect(&dir, dir.task(), &spec, &facts(1), &CollectSource::Inbox)
        .await
        .unwrap();
    assert!(
        report.metadata.patch.is_some(),
        "{:?}",
        report.metadata.notes
    );
}

/// A collection without git outputs, for the reason `why`.
async fn git_refused(dir: &TaskDir, spec: &TaskSpec, why: &str) {
    let report = collect(dir, dir.task(), spec, &facts(1), &CollectSource::Inbox)
        .await
        .unwrap();
    assert!(
        report.metadata.patch.is_none(),
        "{why}: {:?}",
        report.metadata
    );
    assert!(
        report.metadata.notes.iter().any(|n| n.contains(why)),
        "{why}: {:?}",
        report.metadata.notes
    );
}

/// A linked worktree of `source` on branch `squadron/{key}`, as a project sandbox makes one: the
/// directory holding it, the work tree, and its administrative directory.
fn profile_worktree(source: &SourceRepo, key: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let worktree = root.path().join("wt");
    let branch = format!("squadron/{key}");
    git(
        &source.path,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            &branch,
            worktree.to_str().unwrap(),
        ],
    );
    (root, worktree, source.path.join(".git/worktrees/wt"))
}

/// A profile's worktree (`placement: project`): the patch is the work tree as the task left it
/// against the snapshot taken before it started — uncommitted work of earlier generations
/// stays out, new, changed and removed files are in, ignored ones are not — and it applies
/// to the worktree's commit with that earlier work. Git is reached through the worktree's
/// administrative directory, so a `.git` file the provider rewrote points nowhere it wants.
#[tokio::test]
async fn a_profile_worktree_patch_holds_only_what_the_task_changed() {
    let source = SourceRepo::new();
    let (_root, worktree, admin) = profile_worktree(&source, "runner");
    // An earlier generation's uncommitted work.
    write(&worktree.join("README.md"), "# Project\n\nearlier work\n");
    write(&worktree.join("notes.txt"), "earlier notes\n");
    let (_tmp, dir) = task_dir(7);
    std::fs::create_dir_all(dir.artifacts()).unwrap();
    let mut notes = Vec::new();
    let scratch = dir.root().join(worktree::SCRATCH_INDEX_NAME);
    let base = worktree::snapshot_worktree(&admin, &worktree, &scratch, &mut notes).unwrap();
    assert_eq!(base.head.as_deref(), Some(source.main_head.as_str()));
    assert!(!scratch.exists(), "the scratch index is removed");

    // The task's work, and what a hostile provider leaves besides.
    write(
        &worktree.join("src/lib.rs"),
        "pub fn answer() -> u32 {\n    44\n}\n",
    );
    write(&worktree.join("new.txt"), "made by the task\n");
    write(&worktree.join("scratch.tmp"), "ignored\n");
    std::fs::remove_file(worktree.join("docs/guide.md")).unwrap();
    let fifo = worktree.join("pipe");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    write(&worktree.join(".git"), "gitdir: /nonexistent\n");
    // A repository of its own inside the worktree: never opened, never a submodule entry.
    let nested = worktree.join("vendored");
    std::fs::create_dir_all(&nested).unwrap();
    git(&nested, &["init", "-q"]);
    write(&nested.join("lib.txt"), "vendored\n");
    git(&nested, &["add", "lib.txt"]);
    git(
        &nested,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t.invalid",
            "commit",
            "-qm",
            "v",
        ],
    );
    let index_before = std::fs::read(admin.join("index")).unwrap();

    let spec = spec_for(&source.url());
    let w = worktree::ProfileWorktree {
        worktree: worktree.clone(),
        admin: admin.clone(),
        base,
    };
    let report = collect(
        &dir,
        dir.task(),
        &spec,
        &facts(1),
        &CollectSource::ProfileWorktree(w),
    )
    .await
    .unwrap();
    let patch = std::fs::read_to_string(dir.artifacts().join(patch_name(dir.task()))).unwrap();
    assert!(patch.contains("+    44"), "{patch}");
    assert!(patch.contains("+made by the task"), "{patch}");
    assert!(patch.contains("deleted file mode"), "{patch}");
    for absent in [
        "earlier work",
        "earlier notes",
        "ignored",
        "pipe",
        "Subproject",
        "vendored",
    ] {
        assert!(!patch.contains(absent), "{absent} in {patch}");
    }
    assert!(
        !fifo.exists(),
        "the FIFO is removed before git reads the tree"
    );
    assert_eq!(
        std::fs::read(admin.join("index")).unwrap(),
        index_before,
        "the worktree's own index is never written"
    );
    assert_eq!(
        report.metadata.base_commit.as_deref(),
        Some(source.main_head.as_str())
    );
    let untracked =
        std::fs::read_to_string(dir.artifacts().join(untracked_name(dir.task()))).unwrap();
    assert_eq!(
        untracked, "new.txt\n",
        "the new files are the task's: not earlier work, not a nested repository"
    );

    // Applied to the commit plus the earlier work, it gives the task's result.
    let fresh = tempfile::tempdir().unwrap();
    git(fresh.path(), &["clone", "-q", &source.url(), "c"]);
    let clone = fresh.path().join("c");
    write(&clone.join("README.md"), "# Project\n\nearlier work\n");
    write(&clone.join("notes.txt"), "earlier notes\n");
    let patch_path = dir.artifacts().join(patch_name(dir.task()));
    git(&clone, &["apply", patch_path.to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(clone.join("src/lib.rs")).unwrap(),
        "pub fn answer() -> u32 {\n    44\n}\n"
    );
    assert!(!clone.join("docs/guide.md").exists());
}

/// A submodule of the profile's branch whose `.git` the provider pointed at a "repository"
/// elsewhere on the host, its HEAD a FIFO: the snapshots never open it (they would hang on
/// the FIFO), and the submodule's entry stays what the branch holds.
#[test]
fn a_submodule_s_gitfile_pointing_elsewhere_is_never_opened() {
    let source = SourceRepo::new();
    let (root, worktree, admin) = profile_worktree(&source, "sub");
    let cacheinfo = format!("160000,{},sub", source.main_first);
    git(
        &worktree,
        &["update-index", "--add", "--cacheinfo", &cacheinfo],
    );
    git(&worktree, &["commit", "-qm", "a submodule"]);
    // Outside the worktree, so no sweep of the worktree removes the FIFO.
    let elsewhere = root.path().join("elsewhere");
    for dir in ["objects", "refs"] {
        std::fs::create_dir_all(elsewhere.join(dir)).unwrap();
    }
    assert!(std::process::Command::new("mkfifo")
        .arg(elsewhere.join("HEAD"))
        .status()
        .unwrap()
        .success());
    write(
        &worktree.join("sub/.git"),
        format!("gitdir: {}\n", elsewhere.display()),
    );
    write(&worktree.join("README.md"), "# Project\n\nchanged\n");
    let (_tmp, dir) = task_dir(9);
    std::fs::create_dir_all(dir.root()).unwrap();
    let scratch = dir.root().join(worktree::SCRATCH_INDEX_NAME);
    // On a thread of its own: a snapshot that opened the FIFO would block it for good.
    let (tx, rx) = std::sync::mpsc::channel();
    let (a, w, s) = (admin.clone(), worktree.clone(), scratch.clone());
    std::thread::spawn(move || {
        let _ = tx.send(worktree::snapshot_worktree(&a, &w, &s, &mut Vec::new()));
    });
    let snapshot = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the snapshot finished: the submodule's gitfile was not followed")
        .unwrap();
    let repo = git2::Repository::open(&admin).unwrap();
    let tree = repo
        .find_tree(git2::Oid::from_str(&snapshot.tree).unwrap())
        .unwrap();
    let sub = tree.get_path(std::path::Path::new("sub")).unwrap();
    assert_eq!(sub.filemode(), 0o160000, "the submodule's entry is kept");
    assert_eq!(sub.id().to_string(), source.main_first);
    let readme = tree.get_path(std::path::Path::new("README.md")).unwrap();
    let blob = repo.find_blob(readme.id()).unwrap();
    assert_eq!(blob.content(), b"# Project\n\nchanged\n");
}
