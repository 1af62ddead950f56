//! Real git repositories and manifests for the staging, collector and launcher tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use squadron_core::ids::TaskId;
use squadron_core::manifest::{parse_manifest_yaml, TaskSpec};

use crate::task::task_dir::TaskDir;

/// Runs the git CLI in `dir` with a config that does not depend on the machine's.
pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let out = git_output(dir, args);
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub(crate) fn git_output(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "protocol.file.allow=always",
        ])
        .args(args)
        .output()
        .unwrap()
}

pub(crate) fn write(path: &Path, bytes: impl AsRef<[u8]>) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// A binary blob: NUL bytes and every byte value, so git treats it as binary.
pub(crate) fn binary_blob(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .chain([0u8, 0, 0xff])
        .collect()
}

/// A source repository with two branches:
///
/// - `main` (HEAD): `README.md`, `src/lib.rs`, `data.bin` (binary), `docs/guide.md`,
///   `packages/auth/mod.txt`, `.gitignore` (`*.tmp`, `ignored/`); two commits.
/// - `feature`: from `main`'s first commit, changes `README.md`, removes `docs/guide.md`,
///   adds `feature.txt`.
#[derive(Debug)]
pub(crate) struct SourceRepo {
    _tmp: tempfile::TempDir,
    pub(crate) path: PathBuf,
    pub(crate) main_first: String,
    pub(crate) main_head: String,
    pub(crate) feature_head: String,
}

impl SourceRepo {
    pub(crate) fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("source");
        std::fs::create_dir_all(&path).unwrap();
        git(&path, &["init", "-q"]);
        git(&path, &["config", "user.name", "Squadron Test"]);
        git(&path, &["config", "user.email", "test@squadron.invalid"]);
        write(&path.join("README.md"), "# Project\n\nfirst line\n");
        write(
            &path.join("src/lib.rs"),
            "pub fn answer() -> u32 {\n    42\n}\n",
        );
        write(&path.join("data.bin"), binary_blob(1, 4096));
        write(&path.join("docs/guide.md"), "guide\n");
        write(&path.join("packages/auth/mod.txt"), "auth module\n");
        write(&path.join(".gitignore"), "*.tmp\nignored/\n");
        git(&path, &["add", "-A"]);
        git(&path, &["commit", "-q", "-m", "first"]);
        let main_first = git(&path, &["rev-parse", "HEAD"]).trim().to_string();

        git(&path, &["checkout", "-q", "-b", "feature"]);
        write(&path.join("README.md"), "# Project\n\nfeature line\n");
        std::fs::remove_file(path.join("docs/guide.md")).unwrap();
        write(&path.join("feature.txt"), "only on feature\n");
        git(&path, &["add", "-A"]);
        git(&path, &["commit", "-q", "-m", "feature work"]);
        let feature_head = git(&path, &["rev-parse", "HEAD"]).trim().to_string();

        git(&path, &["checkout", "-q", "main"]);
        write(
            &path.join("src/lib.rs"),
            "pub fn answer() -> u32 {\n    43\n}\n",
        );
        git(&path, &["commit", "-q", "-am", "second"]);
        let main_head = git(&path, &["rev-parse", "HEAD"]).trim().to_string();
        Self {
            _tmp: tmp,
            path,
            main_first,
            main_head,
            feature_head,
        }
    }

    pub(crate) fn url(&self) -> String {
        self.path.to_str().unwrap().to_string()
    }

    pub(crate) fn file_url(&self) -> String {
        format!("file://{}", self.url())
    }
}

/// A task spec cloning `url`, with fast clone retries.
pub(crate) fn spec_for(url: &str) -> TaskSpec {
    let text = format!(
        r#"
version: "1"
kind: Task
metadata:
  name: Fix the answer
repository:
  url: '{url}'
agent:
  prompt: "Make answer() return 44.\nKeep the tests green."
  provider: script
  script: "cat"
lifecycle:
  retries:
    clone: {{ max: 2, backoff: [5s] }}
"#
    );
    parse_manifest_yaml(&text).unwrap()
}

/// A task directory under a fresh data directory.
pub(crate) fn task_dir(id: u64) -> (tempfile::TempDir, TaskDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = TaskDir::new(tmp.path(), TaskId::new(id).unwrap());
    (tmp, dir)
}

/// Every line of `events.jsonl`, parsed.
pub(crate) fn events(dir: &TaskDir) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.events())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
