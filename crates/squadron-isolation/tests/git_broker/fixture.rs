//! Real repositories made with the git CLI in a tempdir, a broker serving a real socket,
//! and a snapshot of everything a refused request must leave untouched.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use squadron_isolation::{
    BrokerServer, CommitOutcome, CommitRequest, GitBroker, GitBrokerClient, Refusal,
};

use crate::in_memory_fence::InMemoryFence;

pub const PROFILE: u64 = 1;
pub const LEASE: u64 = 10;
pub const GENERATION: u64 = 1;

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub fence: Arc<InMemoryFence>,
    pub broker: GitBroker,
    pub server: Option<BrokerServer>,
    pub repo: PathBuf,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
}

impl Fixture {
    /// A repository with one commit (`a.txt`, `b.txt`, `sub/c.txt`) on `main`, registered
    /// for [`PROFILE`], whose lease ([`LEASE`], [`GENERATION`]) is current.
    pub async fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = dir.path().join("repo");
        fs::create_dir(&repo).expect("repo dir");
        git(&repo, &["init", "-q", "-b", "main"]);
        fs::write(repo.join("a.txt"), "a1\n").expect("write a file");
        fs::write(repo.join("b.txt"), "b1\n").expect("write a file");
        fs::create_dir(repo.join("sub")).expect("sub dir");
        fs::write(repo.join("sub/c.txt"), "c1\n").expect("write a file");
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-q", "-m", "initial"]);

        let fence = Arc::new(InMemoryFence::default());
        fence.grant(PROFILE, LEASE, GENERATION);
        let state_dir = dir.path().join("state");
        let broker = GitBroker::open(&state_dir, fence.clone()).expect("open the broker");
        broker
            .register_profile(PROFILE, &repo, &repo.join(".git"))
            .expect("register the profile");
        let socket = dir.path().join("broker.sock");
        let server = broker.serve(&socket).expect("serve the socket");
        Fixture {
            dir,
            fence,
            broker,
            server: Some(server),
            repo,
            socket,
            state_dir,
        }
    }

    /// A linked worktree `wt-{profile}` on a branch `profile-{profile}` of its own, registered
    /// for `profile`, whose lease (`100 + profile`, generation 1) is current.
    pub fn add_worktree(&self, profile: u64) -> PathBuf {
        let path = self.dir.path().join(format!("wt-{profile}"));
        let branch = format!("profile-{profile}");
        git(
            &self.repo,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                &branch,
                path.to_str().expect("a UTF-8 path"),
            ],
        );
        self.fence.grant(profile, 100 + profile, 1);
        self.broker
            .register_profile(
                profile,
                &path,
                &self
                    .repo
                    .join(".git/worktrees")
                    .join(format!("wt-{profile}")),
            )
            .expect("register the worktree");
        path
    }

    /// A request from the current lease for `paths`, expecting the current HEAD.
    pub fn request(&self, paths: &[&str], key: &str) -> CommitRequest {
        CommitRequest {
            profile: PROFILE,
            lease: LEASE,
            generation: GENERATION,
            expected_head: Some(head(&self.repo)),
            paths: paths.iter().map(|p| p.to_string()).collect(),
            message: format!("change {}", paths.join(", ")),
            idempotency_key: key.to_string(),
        }
    }

    pub async fn send(&self, request: &CommitRequest) -> CommitOutcome {
        GitBrokerClient::commit(&self.socket, request)
            .await
            .expect("an answer from the broker")
    }

    /// Sends and expects a new commit; returns its id.
    pub async fn commit(&self, request: &CommitRequest) -> String {
        match self.send(request).await {
            CommitOutcome::Committed {
                commit,
                replayed: false,
            } => commit,
            other => panic!("expected a new commit, got {other:?}"),
        }
    }

    /// Sends and expects a refusal.
    pub async fn refused(&self, request: &CommitRequest) -> Refusal {
        match self.send(request).await {
            CommitOutcome::Refused(refusal) => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    pub fn snapshot(&self) -> RepoSnapshot {
        RepoSnapshot::take(&self.repo, &self.state_dir)
    }

    /// Stops the socket (and forgets the broker), as a broker process exit would.
    pub async fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }

    /// A fresh broker over the same state dir and socket path, as after a restart.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.broker =
            GitBroker::open(&self.state_dir, self.fence.clone()).expect("reopen the broker");
        self.broker
            .register_profile(PROFILE, &self.repo, &self.repo.join(".git"))
            .expect("register the profile");
        self.server = Some(self.broker.serve(&self.socket).expect("serve the socket"));
    }
}

/// Everything a refused request must not change: every ref, HEAD, the index file, the set
/// of object files, and the ledger.
#[derive(Debug, PartialEq, Eq)]
pub struct RepoSnapshot {
    refs: String,
    head: String,
    index: Vec<u8>,
    objects: Vec<PathBuf>,
    ledger: Vec<u8>,
}

impl RepoSnapshot {
    pub fn take(worktree: &Path, state_dir: &Path) -> RepoSnapshot {
        let index_path = PathBuf::from(git(
            worktree,
            &["rev-parse", "--path-format=absolute", "--git-path", "index"],
        ));
        let common = PathBuf::from(git(
            worktree,
            &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        ));
        let mut objects = Vec::new();
        list_files(&common.join("objects"), &mut objects);
        objects.sort();
        RepoSnapshot {
            refs: git(
                worktree,
                &["for-each-ref", "--format=%(refname) %(objectname)"],
            ),
            head: git(worktree, &["symbolic-ref", "-q", "HEAD"])
                + &git_allow_fail(worktree, &["rev-parse", "-q", "--verify", "HEAD"]),
            index: fs::read(index_path).unwrap_or_default(),
            objects,
            ledger: fs::read(state_dir.join("commit-ledger.jsonl")).unwrap_or_default(),
        }
    }
}

impl RepoSnapshot {
    /// The repository part alone (refs, HEAD, index, objects), without the ledger.
    pub fn git(&self) -> (&str, &str, &[u8], &[PathBuf]) {
        (&self.refs, &self.head, &self.index, &self.objects)
    }
}

fn list_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("read a dir entry").path();
        if path.is_dir() {
            list_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn git_command(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new("git");
    command
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "test")
        .env("GIT_AUTHOR_EMAIL", "test@example.invalid")
        .env("GIT_COMMITTER_NAME", "test")
        .env("GIT_COMMITTER_EMAIL", "test@example.invalid");
    command
}

/// Runs the git CLI in `dir`; panics with its stderr on failure; returns trimmed stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let output = git_command(dir, args)
        .output()
        .expect("run git (apt-get install -y git)");
    assert!(
        output.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .trim_end()
        .to_string()
}

/// Like [`git`], but a failure gives an empty string (HEAD of an unborn branch).
pub fn git_allow_fail(dir: &Path, args: &[&str]) -> String {
    let output = git_command(dir, args).output().expect("run git");
    String::from_utf8_lossy(&output.stdout)
        .trim_end()
        .to_string()
}

pub fn head(worktree: &Path) -> String {
    git(worktree, &["rev-parse", "HEAD"])
}
