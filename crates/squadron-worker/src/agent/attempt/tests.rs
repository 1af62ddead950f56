//! Agent attempts against real bubblewrap, real cgroups and real git worktrees: what a
//! profile's process can and cannot write, two profiles at once, termination, reaping,
//! adoption by a new runtime object, and `reset_worktree` with real reap evidence.
//! Needs root, cgroup v2 (hybrid or pure), the `bubblewrap` and `git` packages.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use squadron_core::ids::{ProjectId, TenantId};
use squadron_isolation::CgroupRoot;

use super::*;
use crate::agent::runtime::nested_root;
use crate::runtime::process::ProcessRuntimeConfig;
use crate::runtime::sandbox_user::SANDBOX_GID_DEFAULT;
use crate::test_support::{git, SourceRepo};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn unique_worker() -> String {
    format!(
        "pa-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn key(name: &str) -> ProfileKey {
    ProfileKey::new(name).unwrap()
}

/// A runtime with a cgroup parent of its own and a sandbox of a fresh repository with
/// profiles `alpha` and `beta`; on drop every leaf left is reaped and the cgroups removed.
struct Fixture {
    worker: String,
    runtime: Option<AgentRuntime>,
    sandbox: ProjectSandbox,
    repo: SourceRepo,
    _data: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let worker = unique_worker();
        let runtime = AgentRuntime::new(ProcessRuntimeConfig::new(&worker))
            .expect("agent runtime (root, cgroup v2 and the bubblewrap package are needed)");
        let repo = SourceRepo::new();
        let data = tempfile::tempdir().unwrap();
        let sandbox = ProjectSandbox::open_or_create(
            data.path(),
            &TenantId::new("acme").unwrap(),
            &ProjectId::new("web").unwrap(),
            &repo.url(),
            None,
            None,
        )
        .unwrap();
        for k in ["alpha", "beta"] {
            sandbox.ensure_profile(&key(k)).unwrap();
        }
        Fixture {
            worker,
            runtime: Some(runtime),
            sandbox,
            repo,
            _data: data,
        }
    }

    fn runtime(&self) -> &AgentRuntime {
        self.runtime.as_ref().unwrap()
    }

    fn paths(&self, name: &str) -> ProfilePaths {
        self.sandbox.profile_paths(&key(name))
    }

    fn start(&self, name: &str, generation: u64, script: &str) -> AgentAttempt {
        AgentAttempt::start(
            self.runtime(),
            &self.sandbox,
            &key(name),
            Generation::new(generation),
            &launch(script),
        )
        .unwrap()
    }

    fn project_cgroup(&self) -> PathBuf {
        self.runtime()
            .project_cgroup_path(self.sandbox.tenant(), self.sandbox.project())
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let config = ProcessRuntimeConfig::new(&self.worker);
        let Ok(root) = CgroupRoot::open(&self.worker, &config.cgroup) else {
            return;
        };
        for tenant in root.leaf_names().unwrap_or_default() {
            let Ok(tenant) = nested_root(&root, &tenant) else {
                continue;
            };
            for project in tenant.leaf_names().unwrap_or_default() {
                let Ok(project) = nested_root(&tenant, &project) else {
                    continue;
                };
                for name in project.leaf_names().unwrap_or_default() {
                    if let Ok(leaf) = project.leaf(&name) {
                        let _ = Reaper::new(Duration::from_secs(10)).reap(&leaf);
                    }
                }
                let _ = project.remove();
            }
            let _ = tenant.remove();
        }
        let _ = root.remove();
        let _ = squadron_isolation::SandboxNetwork::sweep(&config.network);
    }
}

fn launch(script: &str) -> AgentLaunch {
    AgentLaunch {
        argv: vec!["/bin/sh".into(), "/mnt/run/launch.sh".into()],
        env: [("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned())].into(),
        run_files: [
            ("launch.sh".to_owned(), script.as_bytes().to_vec()),
            ("prompt.txt".to_owned(), b"do the thing\n".to_vec()),
        ]
        .into(),
        stdin: Some("prompt.txt".to_owned()),
        network: NetworkMode::Outbound,
        limits: SandboxLimits::default(),
        broker_dir: None,
        credentials: None,
        task_outbox: None,
    }
}

/// Polls every 20 ms for up to 60 s (a loaded 2-core machine is slow).
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let started = Instant::now();
    while !cond() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(attempt: &AgentAttempt) -> i32 {
    let mut code = None;
    eventually("the attempt to exit", || {
        match attempt.status().unwrap() {
            RunStatus::Exited { code: c } => code = Some(c),
            RunStatus::Running => {}
            other => panic!("unexpected status {other:?}"),
        }
        code.is_some()
    });
    code.unwrap()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A script that announces itself in /state/up and runs until /state/go exists.
const WAIT_FOR_GO: &str = "echo up > /state/up\n\
                           while [ ! -e /state/go ]; do sleep 0.05; done\n\
                           exit 0\n";

#[test]
fn a_profile_writes_only_its_worktree_and_state_and_reads_git_read_only() {
    let fx = Fixture::new();
    let alpha = fx.paths("alpha");
    let beta = fx.paths("beta");
    let git_dir = fx.sandbox.git_dir();
    let root = fx.sandbox.root().display().to_string();
    let script = format!(
        r#"
out=/state/results
mkdir -p $out
try() {{ if (eval "$1") >/dev/null 2>&1; then echo "wrote $2"; else echo "denied $2"; fi; }}
{{
try 'echo x > /workspace/new.txt' workspace
try 'echo x > /state/new.txt' state
try 'echo x > {beta_wt}/x' peer-worktree
try 'echo x > {beta_state}/x' peer-state
try 'touch {git}/x' git-dir
try 'touch {git}/worktrees/alpha/x' git-admin
try 'touch {git}/refs/heads/squadron/x' git-refs
try 'echo x > /mnt/run/x' run
try 'echo x > {root}/x' sandbox-root
try 'echo x > /x' root
}} > $out/writes
for p in {beta_wt} {beta_state} {root}/worktrees {root}/state {root}/run /workspace/.git {git}/HEAD; do
  if [ -e "$p" ]; then echo "visible $p"; else echo "hidden $p"; fi
done > $out/visible
git status --porcelain=v1 -b > $out/git-status 2> $out/git-status.err
echo $? > $out/git-status.rc
git log -1 --format=%H > $out/git-log 2>&1
git -c user.name=a -c user.email=a@b.invalid commit --allow-empty -q -m sneaky > $out/commit 2>&1
echo $? > $out/commit.rc
cat > $out/stdin
ls /mnt > $out/mnt
pwd > $out/pwd
env | sort > $out/env
grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status > $out/status
echo $$ > $out/pid
echo to-stdout
echo to-stderr >&2
"#,
        beta_wt = beta.worktree.display(),
        beta_state = beta.state.display(),
        git = git_dir.display(),
    );
    // The broker's socket answers one line; a provider reaches it through the read-only
    // mount (python3 stands in for the agent-side tool: sh cannot speak to a Unix socket).
    let broker = tempfile::tempdir().unwrap();
    fs::write(broker.path().join("readme"), "broker\n").unwrap();
    let socket = broker.path().join("broker.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    // As the supervisor shares the broker's socket (0660) with the sandbox user's group.
    fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o660)).unwrap();
    std::os::unix::fs::lchown(&socket, None, Some(SANDBOX_GID_DEFAULT)).unwrap();
    std::thread::spawn(move || {
        if let Ok((stream, _)) = listener.accept() {
            let mut line = String::new();
            let mut reader = BufReader::new(&stream);
            if reader.read_line(&mut line).is_ok() {
                let _ = (&stream).write_all(format!("pong {line}").as_bytes());
            }
        }
    });
    let script = format!(
        "{script}\n{}",
        r#"
try 'touch /mnt/broker/x' broker >> /state/results/writes
cat /mnt/broker/readme > /state/results/broker-readme
python3 -c "
import socket
s = socket.socket(socket.AF_UNIX)
s.connect('/mnt/broker/broker.sock')
s.sendall(b'ping\n')
print(s.recv(100).decode().strip())
" > /state/results/broker 2>&1
exit 7
"#
    );
    let mut with_broker = launch(&script);
    with_broker.broker_dir = Some(broker.path().to_path_buf());
    let attempt = AgentAttempt::start(
        fx.runtime(),
        &fx.sandbox,
        &key("alpha"),
        Generation::new(1),
        &with_broker,
    )
    .unwrap();
    assert_eq!(
        attempt.cgroup_path(),
        fx.project_cgroup().join("profile-alpha-g1")
    );
    assert_eq!(wait_exit(&attempt), 7);
    let out = alpha.state.join("results");
    let result = |name: &str| read(&out.join(name));

    let writes = result("writes");
    for expected in [
        "wrote workspace",
        "wrote state",
        "denied peer-worktree",
        "denied peer-state",
        "denied git-dir",
        "denied git-admin",
        "denied git-refs",
        "denied run",
        "denied root",
        "denied broker",
    ] {
        assert!(
            writes.contains(&format!("{expected}\n")),
            "{expected}:\n{writes}"
        );
    }
    assert_eq!(read(&alpha.worktree.join("new.txt")), "x\n");
    assert_eq!(read(&alpha.state.join("new.txt")), "x\n");
    // In this test the sandbox lies under /tmp, so the boundary's private /tmp holds empty
    // parents of the `.git` mount at the same path: writing there is harmless, and only the
    // host side is checked for the sandbox root.
    for not_written in [
        beta.worktree.join("x"),
        beta.state.join("x"),
        git_dir.join("x"),
        git_dir.join("worktrees/alpha/x"),
        alpha.generation_run_dir(Generation::new(1)).join("x"),
        fx.sandbox.root().join("x"),
    ] {
        assert!(!not_written.exists(), "{}", not_written.display());
    }

    let visible = result("visible");
    for hidden in [
        beta.worktree.display().to_string(),
        beta.state.display().to_string(),
        format!("{root}/worktrees"),
        format!("{root}/state"),
        format!("{root}/run"),
    ] {
        assert!(visible.contains(&format!("hidden {hidden}\n")), "{visible}");
    }
    assert!(visible.contains("visible /workspace/.git\n"), "{visible}");
    assert!(
        visible.contains(&format!("visible {}/HEAD\n", git_dir.display())),
        "{visible}"
    );

    // Git reads work through the read-only common directory; writes fail.
    assert_eq!(
        result("git-status.rc").trim(),
        "0",
        "{}",
        result("git-status.err")
    );
    let status = result("git-status");
    assert!(status.starts_with("## squadron/alpha"), "{status}");
    assert!(status.contains("?? new.txt"), "{status}");
    assert_eq!(result("git-log").trim(), fx.repo.main_head);
    assert_ne!(result("commit.rc").trim(), "0", "{}", result("commit"));
    assert!(
        result("commit").contains("Read-only file system"),
        "{}",
        result("commit")
    );
    assert_eq!(
        git(&git_dir, &["rev-parse", "refs/heads/squadron/alpha"]).trim(),
        fx.repo.main_head,
        "the branch moved"
    );

    assert_eq!(result("stdin"), "do the thing\n");
    assert_eq!(result("mnt"), "broker\nrun\n");
    assert_eq!(result("broker-readme"), "broker\n");
    assert_eq!(result("broker").trim(), "pong ping");
    assert!(!broker.path().join("x").exists());
    assert_eq!(result("pwd").trim(), WORKSPACE_MOUNT);
    assert_eq!(
        result("env"),
        "GIT_CONFIG_COUNT=1\nGIT_CONFIG_KEY_0=safe.directory\nGIT_CONFIG_VALUE_0=*\n\
         PATH=/usr/local/bin:/usr/bin:/bin\nPWD=/workspace\nSQUADRON_GENERATION=1\n\
         SQUADRON_PROFILE_KEY=alpha\n"
    );
    let status = result("status");
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
    assert!(status.contains("CapBnd:\t0000000000000000"), "{status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    let pid: u32 = result("pid").trim().parse().unwrap();
    assert!(pid <= 3, "not in a PID namespace of its own: pid {pid}");

    assert_eq!(read(&attempt.stdout_log()), "to-stdout\n");
    assert!(read(&attempt.stderr_log()).contains("to-stderr"));
    assert_eq!(attempt.stdout_log(), alpha.state.join("logs/g1.stdout.log"));
    let evidence = attempt.reap().unwrap();
    assert!(!evidence.populated, "{evidence:?}");
}

#[test]
fn two_profiles_run_at_once_in_separate_leaves_and_one_generation_at_a_time() {
    let fx = Fixture::new();
    let alpha = fx.start("alpha", 1, WAIT_FOR_GO);
    let beta = fx.start("beta", 1, WAIT_FOR_GO);
    for name in ["alpha", "beta"] {
        let up = fx.paths(name).state.join("up");
        eventually("both scripts up", || up.exists());
    }
    assert_eq!(alpha.status().unwrap(), RunStatus::Running);
    assert_eq!(beta.status().unwrap(), RunStatus::Running);
    assert_ne!(alpha.cgroup_path(), beta.cgroup_path());
    assert_eq!(
        beta.cgroup_path(),
        fx.project_cgroup().join("profile-beta-g1")
    );
    let alpha_procs = alpha.leaf().procs().unwrap();
    let beta_procs = beta.leaf().procs().unwrap();
    assert!(!alpha_procs.is_empty() && !beta_procs.is_empty());
    assert!(alpha_procs.iter().all(|p| !beta_procs.contains(p)));
    let (tenant, project) = (fx.sandbox.tenant(), fx.sandbox.project());
    assert_eq!(
        fx.runtime()
            .running_generations(tenant, project, &key("alpha"))
            .unwrap(),
        vec![Generation::new(1)]
    );

    // The worker refuses to be a second writer of a profile, or to run a generation twice.
    let err = AgentAttempt::start(
        fx.runtime(),
        &fx.sandbox,
        &key("alpha"),
        Generation::new(2),
        &launch(WAIT_FOR_GO),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("generation 1 of profile alpha is still running"),
        "{err}"
    );
    let err = AgentAttempt::start(
        fx.runtime(),
        &fx.sandbox,
        &key("beta"),
        Generation::new(1),
        &launch(WAIT_FOR_GO),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("started already"), "{err}");
    let mut peek = launch(WAIT_FOR_GO);
    peek.broker_dir = Some(fx.paths("beta").state);
    let err = AgentAttempt::start(
        fx.runtime(),
        &fx.sandbox,
        &key("alpha"),
        Generation::new(2),
        &peek,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("invalid broker_dir"), "{err}");
    assert_eq!(
        fx.sandbox.started_generations(&key("alpha")).unwrap(),
        vec![Generation::new(1)],
        "a refused start records nothing"
    );

    fs::write(fx.paths("alpha").state.join("go"), "").unwrap();
    assert_eq!(wait_exit(&alpha), 0);
    assert_eq!(beta.status().unwrap(), RunStatus::Running, "beta goes on");
    fs::write(fx.paths("beta").state.join("go"), "").unwrap();
    assert_eq!(wait_exit(&beta), 0);

    let first = alpha.reap().unwrap();
    assert!(!first.populated, "{first:?}");
    assert!(fx.project_cgroup().exists(), "beta's leaf is still there");
    let second = beta.reap().unwrap();
    assert!(!second.populated, "{second:?}");
    assert_eq!(second.cgroup, beta.cgroup_path().display().to_string());
    assert!(!beta.cgroup_path().exists());
    assert!(!fx.project_cgroup().exists(), "empty project cgroup pruned");
}

#[test]
fn terminate_with_grace_then_reap_proves_populated_0_and_removes_the_leaf() {
    let fx = Fixture::new();
    let attempt = fx.start(
        "alpha",
        1,
        "trap 'echo term > /state/term; exit 143' TERM\n\
         sleep 600 &\n\
         echo up > /state/up\n\
         while :; do sleep 0.1; done\n",
    );
    let up = fx.paths("alpha").state.join("up");
    eventually("the script to be up", || up.exists());
    assert_eq!(
        attempt.terminate(Duration::from_secs(30)).unwrap(),
        TerminationOutcome::ExitedWithinGrace
    );
    assert_eq!(attempt.status().unwrap(), RunStatus::Exited { code: 143 });
    assert_eq!(read(&fx.paths("alpha").state.join("term")), "term\n");

    let evidence = attempt.reap().unwrap();
    assert!(!evidence.populated, "{evidence:?}");
    assert_eq!(evidence.cgroup, attempt.cgroup_path().display().to_string());
    assert!(
        evidence.steps.iter().any(|s| s.contains("populated 0")),
        "{:?}",
        evidence.steps
    );
    assert!(!attempt.cgroup_path().exists());
    assert!(!attempt.leaf().populated().unwrap());
    // The exit code outlives the leaf.
    assert_eq!(attempt.status().unwrap(), RunStatus::Exited { code: 143 });
}

#[test]
fn a_new_runtime_adopts_a_running_attempt_and_reset_needs_its_generations_proof() {
    let mut fx = Fixture::new();
    let alpha = fx.paths("alpha");
    let first = fx.start(
        "alpha",
        1,
        "echo edited > /workspace/README.md\necho junk > /workspace/junk.txt\n\
         echo up > /state/up\nwhile [ ! -e /state/go ]; do sleep 0.05; done\nexit 5\n",
    );
    let cgroup = first.cgroup_path().to_path_buf();
    eventually("the script to be up", || alpha.state.join("up").exists());
    // The worker's objects go away (a restart); the attempt runs on.
    drop(first);
    fx.runtime = None;

    let runtime = AgentRuntime::new(ProcessRuntimeConfig::new(&fx.worker)).unwrap();
    fx.runtime = Some(runtime);
    let adopted = AgentAttempt::adopt(fx.runtime(), &fx.sandbox, &key("alpha"), Generation::new(1))
        .unwrap()
        .expect("found by its leaf and start record");
    assert_eq!(adopted.cgroup_path(), cgroup);
    assert_eq!(adopted.status().unwrap(), RunStatus::Running);
    assert!(
        AgentAttempt::adopt(fx.runtime(), &fx.sandbox, &key("alpha"), Generation::new(2))
            .unwrap()
            .is_none()
    );
    assert!(
        AgentAttempt::adopt(fx.runtime(), &fx.sandbox, &key("beta"), Generation::new(1))
            .unwrap()
            .is_none()
    );

    // No reset while it may still write, with or without the wrong paperwork.
    let err = fx
        .sandbox
        .reset_worktree(&key("alpha"), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing") && err.contains("generation 1"),
        "{err}"
    );
    // Evidence claiming quiescence of a leaf that is populated now is refused too.
    let forged = ReapEvidence {
        cgroup: cgroup.display().to_string(),
        populated: false,
        observed_at_ms: 1,
        steps: Vec::new(),
    };
    let err = fx
        .sandbox
        .reset_worktree(&key("alpha"), Some(&forged))
        .unwrap_err()
        .to_string();
    assert!(err.contains("is populated now"), "{err}");
    assert_eq!(read(&alpha.worktree.join("README.md")), "edited\n");

    fs::write(alpha.state.join("go"), "").unwrap();
    assert_eq!(wait_exit(&adopted), 5);
    let proof1 = adopted.reap().unwrap();
    assert!(!proof1.populated, "{proof1:?}");
    assert_eq!(
        fx.sandbox
            .reap_evidence(&key("alpha"), Generation::new(1))
            .unwrap(),
        Some(proof1.clone()),
        "the proof is kept on disk"
    );

    // Generation 2 runs and ends; generation 1's proof no longer suffices.
    let second = fx.start("alpha", 2, "echo again >> /workspace/README.md\n");
    assert_eq!(wait_exit(&second), 0);
    let err = fx
        .sandbox
        .reset_worktree(&key("alpha"), Some(&proof1))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("invalid reap evidence") && err.contains("generation 2"),
        "{err}"
    );
    assert_eq!(read(&alpha.worktree.join("README.md")), "edited\nagain\n");
    let proof2 = second.reap().unwrap();
    assert!(!proof2.populated, "{proof2:?}");

    let commit = fx
        .sandbox
        .reset_worktree(&key("alpha"), Some(&proof2))
        .unwrap();
    assert_eq!(commit, fx.repo.main_head);
    assert_eq!(
        read(&alpha.worktree.join("README.md")),
        "# Project\n\nfirst line\n"
    );
    assert!(!alpha.worktree.join("junk.txt").exists());
    assert_eq!(git(&alpha.worktree, &["status", "--porcelain"]), "");
    // State is the profile's, not the worktree's: a reset keeps it.
    assert!(alpha.state.join("up").exists());
}
