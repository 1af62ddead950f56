//! The process runtime against real bubblewrap and real cgroups: containment proofs, limits,
//! cancellation, reaping, and recovery of a run after the worker is killed with SIGKILL.
//! Needs root, cgroup v2 (hybrid or pure), and the `bubblewrap` package.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use squadron_core::ids::TaskId;
use squadron_core::manifest::{NetworkMode, RuntimeKind};
use squadron_isolation::{ProcessEntry, Reaper};

use super::*;
use crate::runtime::sandbox_user::SANDBOX_UID_DEFAULT;
use crate::runtime::SandboxLimits;

static NEXT: AtomicU32 = AtomicU32::new(0);

const ALLOWED_VAR: &str = "SQUADRON_ALLOWED";
const ADOPTION_CHILD_ENV: &str = "SQUADRON_ADOPTION_CHILD";
const ADOPTION_TASK: u64 = 77;

pub(super) fn unique_worker(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// One runtime with a cgroup parent of its own and a data dir; on drop every leaf left is
/// reaped and the parent removed, so a failed test leaves nothing running.
pub(super) struct Fixture {
    pub(super) runtime: ProcessRuntime,
    data: tempfile::TempDir,
}

impl Fixture {
    pub(super) fn new() -> Fixture {
        Fixture::with_config(ProcessRuntimeConfig::new(unique_worker("pr-test")))
    }

    pub(super) fn with_config(config: ProcessRuntimeConfig) -> Fixture {
        let runtime = ProcessRuntime::new(config)
            .expect("process runtime (root, cgroup v2 and the bubblewrap package are needed)");
        Fixture {
            runtime,
            data: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn global(&self) -> PathBuf {
        self.data.path().join("global")
    }

    pub(super) fn spec(&self, task: u64, script: &str) -> LaunchSpec {
        launch_spec(self.data.path(), task, script)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        reap_worker(self.runtime.cgroup_root());
    }
}

/// Reaps a worker's leaves by name, even if the test fails before it has a runtime.
struct ReapOnDrop(String);

impl Drop for ReapOnDrop {
    fn drop(&mut self) {
        if let Ok(root) = CgroupRoot::open(&self.0, &CgroupRootConfig::default()) {
            reap_worker(&root);
        }
    }
}

fn reap_worker(root: &CgroupRoot) {
    for name in root.leaf_names().unwrap_or_default() {
        if let Ok(leaf) = root.leaf(&name) {
            let _ = Reaper::new(Duration::from_secs(10)).reap(&leaf);
        }
    }
    let _ = root.remove();
    // Reaped without `destroy`: the sandboxes' networks are left for the sweep.
    if let Some(worker) = root.v2_parent().file_name().and_then(|n| n.to_str()) {
        let _ = SandboxNetwork::sweep(&NetworkConfig::new(worker));
    }
}

/// Stages a task the way staging does (run/, inbox/, outbox/progress/, artifacts/) with
/// `script` as run/launch.sh.
fn launch_spec(data: &Path, task: u64, script: &str) -> LaunchSpec {
    let task = TaskId::new(task).expect("task id");
    let dir = TaskDir::new(data, task);
    for d in [dir.run(), dir.inbox(), dir.progress(), dir.artifacts()] {
        fs::create_dir_all(&d).expect("task dirs");
    }
    fs::write(dir.run().join("launch.sh"), script).expect("launch.sh");
    let global = data.join("global");
    fs::create_dir_all(&global).expect("global dir");
    fs::write(global.join("shared.txt"), "global\n").expect("global file");
    let env: BTreeMap<String, String> = [
        ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
        (ALLOWED_VAR.to_owned(), "allowed value".to_owned()),
    ]
    .into();
    LaunchSpec {
        task,
        attempt: 1,
        dir,
        argv: vec!["/bin/sh".into(), "/mnt/run/launch.sh".into()],
        workdir: INBOX_MOUNT.to_owned(),
        env,
        limits: SandboxLimits::default(),
        network: NetworkMode::Outbound,
        full_control: false,
        global_dir: Some(global),
        credentials: None,
        egress: None,
        keep_after_exit: false,
    }
}

/// Polls every 20 ms for up to 60 s (a loaded 2-core machine is slow).
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !cond().await {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_exit(runtime: &ProcessRuntime, handle: &SandboxHandle) -> i32 {
    let started = Instant::now();
    loop {
        match runtime.status(handle).await.expect("status") {
            RunStatus::Exited { code } => return code,
            RunStatus::Running => {}
            other => panic!("unexpected status {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "timed out waiting for the run to exit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(super) fn outbox_file(spec: &LaunchSpec, name: &str) -> String {
    let path = spec.dir.outbox().join(name);
    fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; stderr.log: {}",
            path.display(),
            fs::read_to_string(spec.dir.stderr_log()).unwrap_or_default()
        )
    })
}

pub(super) async fn run_to_exit(fx: &Fixture, spec: &LaunchSpec) -> (SandboxHandle, i32) {
    let handle = fx.runtime.provision(spec).await.expect("provision");
    assert_eq!(
        fx.runtime.status(&handle).await.expect("status"),
        RunStatus::Created
    );
    fx.runtime.start(&handle, spec).await.expect("start");
    let code = wait_exit(&fx.runtime, &handle).await;
    (handle, code)
}

#[tokio::test]
async fn writes_outside_inbox_and_outbox_fail_and_the_boundary_is_closed() {
    let fx = Fixture::new();
    let host_marker = PathBuf::from(format!("/tmp/{}-host-only", unique_worker("sq")));
    fs::write(&host_marker, "host\n").expect("host /tmp file");
    let sandbox_tmp_name = format!("{}-sandbox-only", unique_worker("sq"));
    let spec_probe = fx.spec(1, "");
    let task_root = spec_probe.dir.root().display().to_string();
    // Variables of the worker's own environment must not reach the sandbox.
    let worker_vars: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| k != "PATH" && k != ALLOWED_VAR && k != "PWD")
        .collect();
    assert!(
        !worker_vars.is_empty(),
        "the test process has an environment to leak"
    );

    let script = format!(
        r#"
out=/mnt/outbox
for p in /etc/x /usr/x /x /mnt/run/x /mnt/global/x {task_root}/x {task_root}/inbox/host-path; do
  if (echo x > "$p") 2>/dev/null; then echo "wrote $p"; else echo "denied $p"; fi
done > $out/writes
echo in > /mnt/inbox/written-inside && echo inbox-ok >> $out/writes
echo out > /mnt/outbox/written-inside && echo outbox-ok >> $out/writes
cat /mnt/global/shared.txt > $out/global-read
ls /mnt > $out/mnt-listing
if [ -e {host_marker} ]; then echo visible; else echo absent; fi > $out/host-tmp
echo sandbox > /tmp/{sandbox_tmp_name}
echo $$ > $out/mypid
ls /proc | grep -E '^[0-9]+$' > $out/pids
env > $out/env
grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status > $out/status
pwd > $out/pwd
cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' > $out/net
exit 3
"#,
        host_marker = host_marker.display()
    );
    let spec = fx.spec(1, &script);
    let (_handle, code) = run_to_exit(&fx, &spec).await;
    fs::remove_file(&host_marker).expect("rm host marker");
    assert_eq!(code, 3);

    let writes = outbox_file(&spec, "writes");
    for denied in ["/etc/x", "/usr/x", "/x", "/mnt/run/x", "/mnt/global/x"] {
        assert!(
            writes.contains(&format!("denied {denied}\n")),
            "{denied}:\n{writes}"
        );
    }
    assert!(
        writes.contains(&format!("denied {task_root}/x\n")),
        "{writes}"
    );
    assert!(
        writes.contains("inbox-ok") && writes.contains("outbox-ok"),
        "{writes}"
    );
    assert!(!spec.dir.root().join("x").exists());
    assert!(!spec.dir.run().join("x").exists());
    assert!(!fx.global().join("x").exists());
    assert!(!Path::new("/etc/x").exists());
    assert_eq!(
        fs::read_to_string(spec.dir.inbox().join("written-inside")).expect("inbox"),
        "in\n"
    );
    assert_eq!(outbox_file(&spec, "global-read"), "global\n");
    assert_eq!(
        outbox_file(&spec, "mnt-listing"),
        "global\ninbox\noutbox\nrun\n"
    );
    assert_eq!(outbox_file(&spec, "pwd").trim(), INBOX_MOUNT);

    // Private /tmp both ways.
    assert_eq!(outbox_file(&spec, "host-tmp").trim(), "absent");
    assert!(!Path::new("/tmp").join(&sandbox_tmp_name).exists());

    // A PID namespace of its own: the script is pid 2 (bwrap is 1) and sees only a handful.
    let mypid: u32 = outbox_file(&spec, "mypid").trim().parse().expect("pid");
    assert!(mypid <= 3, "script pid {mypid}");
    let pids: Vec<u32> = outbox_file(&spec, "pids")
        .lines()
        .map(|l| l.parse().expect("pid"))
        .collect();
    assert!(pids.len() <= 6, "{pids:?}");
    assert!(!pids.contains(&std::process::id()));

    // The environment is exactly the allowlist (bubblewrap adds PWD, the runtime Git's
    // safe.directory for the sandbox user).
    let mut env: Vec<String> = outbox_file(&spec, "env")
        .lines()
        .map(str::to_owned)
        .collect();
    env.sort();
    assert_eq!(
        env,
        vec![
            "GIT_CONFIG_COUNT=1".to_owned(),
            "GIT_CONFIG_KEY_0=safe.directory".to_owned(),
            "GIT_CONFIG_VALUE_0=*".to_owned(),
            "PATH=/usr/bin:/bin".to_owned(),
            "PWD=/mnt/inbox".to_owned(),
            format!("{ALLOWED_VAR}=allowed value"),
        ]
    );
    for var in &worker_vars {
        assert!(
            !env.iter().any(|e| e.starts_with(&format!("{var}="))),
            "{var} leaked"
        );
    }

    let status = outbox_file(&spec, "status");
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
    assert!(status.contains("CapBnd:\t0000000000000000"), "{status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");

    // Outbound network: the host's interfaces are there.
    assert!(outbox_file(&spec, "net").lines().count() > 1);
}

#[tokio::test]
async fn isolated_network_has_only_loopback() {
    let fx = Fixture::new();
    let mut spec = fx.spec(
        2,
        "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' > /mnt/outbox/net",
    );
    spec.network = NetworkMode::Isolated;
    let (_handle, code) = run_to_exit(&fx, &spec).await;
    assert_eq!(code, 0);
    assert_eq!(outbox_file(&spec, "net"), "lo\n");
}

#[tokio::test]
async fn output_goes_to_the_progress_files() {
    let fx = Fixture::new();
    let spec = fx.spec(3, "echo out-line; echo err-line >&2");
    let (_handle, code) = run_to_exit(&fx, &spec).await;
    assert_eq!(code, 0);
    assert_eq!(
        fs::read_to_string(spec.dir.stdout_log()).expect("stdout"),
        "out-line\n"
    );
    assert_eq!(
        fs::read_to_string(spec.dir.stderr_log()).expect("stderr"),
        "err-line\n"
    );
    assert_eq!(
        fs::read_to_string(ProcessRuntime::exit_code_file(&spec.dir, 1)).expect("exit file"),
        "0\n"
    );
}

#[tokio::test]
async fn memory_and_pids_limits_are_written_and_enforced() {
    let fx = Fixture::new();
    let mut spec = fx.spec(
        4,
        r#"
# More processes than pids.max allows: the subshell dies on the first failed fork.
( i=0; while [ $i -lt 40 ]; do sleep 600 & i=$((i+1)); done ) 2>/dev/null
# Count without forking: a glob and builtins only.
set -- /proc/[0-9]*
echo $# > /mnt/outbox/procs
kill -KILL -1 2>/dev/null
# More memory than memory.max allows: a tmpfs file is charged to the leaf.
if head -c 400000000 /dev/zero > /tmp/big 2>/dev/null; then echo wrote-all; else echo stopped; fi > /mnt/outbox/memory
"#,
    );
    spec.limits = SandboxLimits {
        cpus: None,
        memory_bytes: Some(64 << 20),
        pids_max: Some(16),
        disk_bytes: None,
    };
    let handle = fx.runtime.provision(&spec).await.expect("provision");
    let leaf = fx.runtime.leaf(&handle).expect("leaf");
    let memory_file = leaf.memory_limit_file().expect("memory controller");
    assert_eq!(
        fs::read_to_string(&memory_file)
            .expect("memory limit")
            .trim(),
        "67108864"
    );
    let pids_file = leaf.pids_limit_file().expect("pids controller");
    assert_eq!(
        fs::read_to_string(&pids_file).expect("pids limit").trim(),
        "16"
    );

    fx.runtime.start(&handle, &spec).await.expect("start");
    let code = wait_exit(&fx.runtime, &handle).await;
    let procs: usize = outbox_file(&spec, "procs").trim().parse().expect("count");
    // bwrap (pid 1) and the script, some sleeps, and the shim and outer bwrap outside.
    assert!(
        (3..=14).contains(&procs),
        "{procs} processes under pids.max 16"
    );
    // Either the writer was stopped or the OOM killer ended the run: never 400 MB in 64 MiB.
    let memory = fs::read_to_string(spec.dir.outbox().join("memory")).unwrap_or_default();
    assert!(
        memory.trim() == "stopped" || code == 137,
        "memory {memory:?}, exit {code}"
    );
}

#[tokio::test]
async fn terminate_lets_a_provider_handle_sigterm() {
    let fx = Fixture::new();
    let spec = fx.spec(
        5,
        "trap 'echo term > /mnt/outbox/term; exit 143' TERM\necho up > /mnt/outbox/up\nwhile :; do sleep 0.1; done\n",
    );
    let handle = fx.runtime.provision(&spec).await.expect("provision");
    fx.runtime.start(&handle, &spec).await.expect("start");
    let up = spec.dir.outbox().join("up");
    eventually("the script to be up", || async { up.exists() }).await;
    assert_eq!(
        fx.runtime.status(&handle).await.expect("status"),
        RunStatus::Running
    );
    fx.runtime
        .terminate(&handle, Duration::from_secs(30))
        .await
        .expect("terminate");
    assert_eq!(
        fx.runtime.status(&handle).await.expect("status"),
        RunStatus::Exited { code: 143 }
    );
    assert_eq!(outbox_file(&spec, "term"), "term\n");
}

#[tokio::test]
async fn terminate_kills_a_provider_ignoring_sigterm_after_the_grace() {
    let fx = Fixture::new();
    let spec = fx.spec(
        6,
        "trap '' TERM\necho up > /mnt/outbox/up\nwhile :; do sleep 0.1; done\n",
    );
    let handle = fx.runtime.provision(&spec).await.expect("provision");
    fx.runtime.start(&handle, &spec).await.expect("start");
    let up = spec.dir.outbox().join("up");
    eventually("the script to be up", || async { up.exists() }).await;
    let started = Instant::now();
    fx.runtime
        .terminate(&handle, Duration::from_millis(1500))
        .await
        .expect("terminate");
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "grace cut short"
    );
    assert_eq!(
        fx.runtime.status(&handle).await.expect("status"),
        RunStatus::Exited { code: 137 }
    );
}

#[tokio::test]
async fn destroy_proves_populated_0_and_leaves_no_process() {
    let fx = Fixture::new();
    let spec = fx.spec(
        7,
        "for i in 1 2 3; do sleep 600 & done\necho up > /mnt/outbox/up\nwait\n",
    );
    let handle = fx.runtime.provision(&spec).await.expect("provision");
    fx.runtime.start(&handle, &spec).await.expect("start");
    let up = spec.dir.outbox().join("up");
    eventually("the script to be up", || async { up.exists() }).await;
    let leaf = fx.runtime.leaf(&handle).expect("leaf");
    let seen: Vec<ProcessEntry> = leaf
        .procs()
        .expect("procs")
        .into_iter()
        .filter_map(ProcessEntry::read)
        .collect();
    assert!(seen.len() >= 7, "shim, bwrap ×2, sh, 3 sleeps: {seen:?}");
    let glass = fx.runtime.break_glass(&handle).await;
    assert!(glass.starts_with("nsenter --target "), "{glass}");
    assert!(glass.contains(&handle.id), "{glass}");
    // The runtime lists the leaf among the sandboxes it holds until it is destroyed (the soak's
    // leak count).
    let held = fx.runtime.sandboxes().await.expect("sandboxes");
    assert!(held.contains(&leaf.name().to_string()), "{held:?}");

    let report = fx.runtime.destroy(&handle).await.expect("destroy");
    assert!(!report.populated, "{report:?}");
    assert_eq!(report.sandbox, handle.id);
    assert!(report.detail.contains("populated 0"), "{}", report.detail);
    assert!(report.observed_at_ms > 0);
    assert!(!leaf.exists());
    assert!(!leaf.populated().expect("absent leaf reads as empty"));
    let held = fx.runtime.sandboxes().await.expect("sandboxes");
    assert!(!held.contains(&leaf.name().to_string()), "{held:?}");
    eventually("every seen process gone", || async {
        seen.iter().all(|p| !p.is_alive())
    })
    .await;
    assert_eq!(
        fx.runtime.status(&handle).await.expect("status"),
        RunStatus::Vanished
    );
    assert!(fx
        .runtime
        .break_glass(&handle)
        .await
        .starts_with("nothing runs in"));
}

#[tokio::test]
async fn a_sandbox_user_owns_the_task_dirs_and_nothing_else() {
    let mut config = ProcessRuntimeConfig::new(unique_worker("pr-user"));
    config.sandbox_user = Some(crate::runtime::sandbox_user::SandboxUser {
        uid: 65534,
        gid: 65534,
    });
    let fx = Fixture::with_config(config);
    let mut spec = fx.spec(
        8,
        "id -u > /mnt/outbox/uid\necho x > /mnt/inbox/new\n\
         if cat /etc/shadow >/dev/null 2>&1; then echo readable; else echo denied; fi > /mnt/outbox/shadow\n",
    );
    // Staging may write run/ files readable by root only; the runtime hands them over.
    let launch = spec.dir.run().join("launch.sh");
    fs::set_permissions(&launch, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    spec.global_dir = None;
    let (_handle, code) = run_to_exit(&fx, &spec).await;
    assert_eq!(
        code,
        0,
        "stderr: {}",
        fs::read_to_string(spec.dir.stderr_log()).unwrap_or_default()
    );
    assert_eq!(outbox_file(&spec, "uid").trim(), "65534");
    assert_eq!(outbox_file(&spec, "shadow").trim(), "denied");
    assert!(spec.dir.inbox().join("new").exists());
}

/// The default: code runs as the sandbox user, not root; a root-only file in a mounted
/// directory stays unreadable; Git commits in the shared inbox, and the worker's libgit2
/// (as the collector opens it) still accepts the repository afterwards.
#[tokio::test]
async fn by_default_code_runs_unprivileged_and_git_still_works_in_the_inbox() {
    let fx = Fixture::new();
    let spec = fx.spec(
        9,
        "id -u > /mnt/outbox/uid\n\
         if cat /mnt/global/root-only >/dev/null 2>&1; then echo readable; else echo denied; fi \
         > /mnt/outbox/root-only\n\
         echo change > /mnt/inbox/file.txt && git add file.txt && \
         git -c user.name=t -c user.email=t@t.invalid commit -q -m sandboxed \
         > /mnt/outbox/commit 2>&1; echo $? > /mnt/outbox/commit.rc\n",
    );
    let secret = fx.global().join("root-only");
    fs::write(&secret, "root only\n").expect("secret");
    fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let inbox = spec.dir.inbox();
    crate::test_support::git(&inbox, &["init", "-q"]);
    fs::write(inbox.join("file.txt"), "base\n").expect("file");
    crate::test_support::git(&inbox, &["add", "file.txt"]);
    crate::test_support::git(
        &inbox,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t.invalid",
            "commit",
            "-q",
            "-m",
            "base",
        ],
    );
    let (_handle, code) = run_to_exit(&fx, &spec).await;
    assert_eq!(
        code,
        0,
        "stderr: {}",
        fs::read_to_string(spec.dir.stderr_log()).unwrap_or_default()
    );
    assert_eq!(
        outbox_file(&spec, "uid").trim(),
        SANDBOX_UID_DEFAULT.to_string()
    );
    assert_eq!(outbox_file(&spec, "root-only").trim(), "denied");
    assert_eq!(
        outbox_file(&spec, "commit.rc").trim(),
        "0",
        "{}",
        outbox_file(&spec, "commit")
    );
    let repo = git2::Repository::open(inbox.join(".git")).expect("libgit2 opens the inbox");
    let head = repo.head().and_then(|h| h.peel_to_commit()).expect("head");
    assert_eq!(head.message(), Some("sandboxed\n"));
}

#[tokio::test]
async fn handles_of_other_workers_or_runtimes_are_refused() {
    let fx = Fixture::new();
    let foreign = SandboxHandle {
        runtime: RuntimeKind::Process,
        id: "/sys/fs/cgroup/elsewhere/task-1-a1".to_owned(),
    };
    assert!(fx.runtime.status(&foreign).await.is_err());
    let docker = SandboxHandle {
        runtime: RuntimeKind::Docker,
        id: fx
            .runtime
            .cgroup_root()
            .v2_parent()
            .join("task-1-a1")
            .display()
            .to_string(),
    };
    let err = fx
        .runtime
        .destroy(&docker)
        .await
        .expect_err("docker handle");
    assert!(err.to_string().contains("not a process leaf"), "{err}");
}

#[test]
fn probe_names_what_is_missing() {
    let mut config = ProcessRuntimeConfig::new(unique_worker("pr-probe"));
    config.bwrap = PathBuf::from("/nonexistent/bwrap");
    config.setpriv = Some(PathBuf::from("/nonexistent/setpriv"));
    let dir = tempfile::tempdir().expect("tempdir");
    config.cgroup.v2_base = Some(dir.path().join("squadron"));
    let err = ProcessRuntime::probe(&config).expect_err("nothing is usable");
    let text = err.to_string();
    assert!(
        text.contains("bubblewrap not usable at /nonexistent/bwrap"),
        "{text}"
    );
    assert!(
        text.contains("setpriv not found at /nonexistent/setpriv"),
        "{text}"
    );
    assert!(text.contains("not a cgroup directory"), "{text}");
}

/// The recovery proof: a real worker process starts a run and is killed with SIGKILL; a
/// new runtime adopts the leaf by its path, sees it running, does not start it again, and
/// reads the exit code from the file the shim wrote when the run finished.
///
/// The "worker" is this test binary run again with `SQUADRON_ADOPTION_CHILD` set: in that
/// role the test provisions and starts the run, prints READY and waits to be killed.
#[tokio::test]
async fn a_run_survives_a_killed_worker_and_is_adopted_not_restarted() {
    const SCRIPT: &str = "echo started >> /mnt/outbox/marker\n\
                          while [ ! -e /mnt/inbox/go ]; do sleep 0.05; done\n\
                          exit 42\n";
    if let Ok(role) = std::env::var(ADOPTION_CHILD_ENV) {
        let (data, worker) = role.split_once('|').expect("data|worker");
        let runtime = ProcessRuntime::new(ProcessRuntimeConfig::new(worker)).expect("runtime");
        let spec = launch_spec(Path::new(data), ADOPTION_TASK, SCRIPT);
        let handle = runtime.provision(&spec).await.expect("provision");
        runtime.start(&handle, &spec).await.expect("start");
        assert_eq!(
            runtime.status(&handle).await.expect("status"),
            RunStatus::Running
        );
        println!("READY {}", handle.id);
        loop {
            tokio::time::sleep(Duration::from_secs(600)).await;
        }
    }

    let worker = unique_worker("pr-adopt");
    let _cleanup = ReapOnDrop(worker.clone());
    let data = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "runtime::process::tests::a_run_survives_a_killed_worker_and_is_adopted_not_restarted",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            ADOPTION_CHILD_ENV,
            format!("{}|{worker}", data.path().display()),
        )
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the worker");
    let stdout = child.stdout.take().expect("stdout");
    let reader = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| l.find("READY ").map(|at| l[at..].to_owned()))
    });
    let ready = tokio::time::timeout(Duration::from_secs(120), reader).await;
    // The worker dies now, with SIGKILL, while the run goes on.
    child.kill().expect("kill -9 the worker");
    child.wait().expect("reap the worker");
    let ready = ready
        .expect("the worker reports within 120 s")
        .expect("reader")
        .expect("the worker reported READY");

    let fx = Fixture::with_config(ProcessRuntimeConfig::new(worker));
    let spec = launch_spec(data.path(), ADOPTION_TASK, SCRIPT);
    let handle = fx
        .runtime
        .adopt(spec.task, spec.attempt, &spec.dir)
        .await
        .expect("adopt")
        .expect("the leaf is found by its path");
    assert_eq!(ready, format!("READY {}", handle.id));
    assert_eq!(
        fx.runtime.status(&handle).await.expect("status"),
        RunStatus::Running
    );
    // Nothing absent is adopted.
    assert_eq!(
        fx.runtime
            .adopt(spec.task, spec.attempt + 1, &spec.dir)
            .await
            .expect("adopt"),
        None
    );

    // The reconciler may call start again: nothing is started twice.
    fx.runtime.start(&handle, &spec).await.expect("start again");
    let err = fx
        .runtime
        .provision(&spec)
        .await
        .expect_err("provision again");
    assert!(err.to_string().contains("started already"), "{err}");

    fs::write(spec.dir.inbox().join("go"), "").expect("let it finish");
    assert_eq!(wait_exit(&fx.runtime, &handle).await, 42);
    assert_eq!(outbox_file(&spec, "marker"), "started\n");

    let report = fx.runtime.destroy(&handle).await.expect("destroy");
    assert!(!report.populated, "{report:?}");
}
