//! Real cgroups and real bubblewrap: leaves, the shim, termination and the reaper.
//! Needs root, cgroup v2 (hybrid or pure) and the `bubblewrap` package.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use squadron_isolation::{
    BubblewrapCommand, CgroupLeaf, CgroupLimits, CgroupRoot, CgroupRootConfig, LeafUsage,
    LimitHits, ProcessEntry, Reaper, SandboxLaunch, SandboxProcess, Termination,
    TerminationOutcome,
};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A worker parent of its own per test; on drop every leaf left is killed and removed, then
/// the parent, so a failing test leaves nothing behind.
struct Fixture {
    root: CgroupRoot,
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        assert!(
            Path::new("/usr/bin/bwrap").exists(),
            "these tests need bubblewrap: apt-get install -y bubblewrap"
        );
        let worker = format!(
            "iso-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let root = CgroupRoot::open(&worker, &CgroupRootConfig::default())
            .expect("cgroup root (run as root on a host with cgroup v2)");
        Fixture {
            root,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn leaf(&self, name: &str) -> CgroupLeaf {
        let leaf = self.root.leaf(name).expect("leaf name");
        leaf.create().expect("create leaf");
        leaf
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts `script` under `sh` in a boundary in `leaf`, with `out/` writable at `/out`.
    fn launch(&self, leaf: &CgroupLeaf, script: &str) -> (SandboxProcess, SandboxLaunch) {
        self.launch_with(leaf, BubblewrapCommand::new(sh(script)))
    }

    fn launch_with(
        &self,
        leaf: &CgroupLeaf,
        command: BubblewrapCommand,
    ) -> (SandboxProcess, SandboxLaunch) {
        let out = self.path("out");
        fs::create_dir_all(&out).expect("out dir");
        let launch = SandboxLaunch {
            leaf: leaf.clone(),
            boundary: command.bind_rw(&out, "/out").argv().expect("argv"),
            exit_code_file: self.path(&format!("exit-{}", leaf.name())),
            stdin: None,
            output_root: self.dir.path().to_path_buf(),
            stdout: self.path("stdout.log"),
            stderr: self.path("stderr.log"),
        };
        let process = SandboxProcess::spawn(&launch).expect("spawn sandbox");
        (process, launch)
    }

    fn stderr(&self) -> String {
        fs::read_to_string(self.path("stderr.log")).unwrap_or_default()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for name in self.root.leaf_names().unwrap_or_default() {
            if let Ok(leaf) = self.root.leaf(&name) {
                let _ = Reaper::new(Duration::from_secs(10)).reap(&leaf);
                let _ = leaf.remove();
            }
        }
        let _ = self.root.remove();
    }
}

/// Shell commands that move the shell running them into every hierarchy of `leaf`, as the
/// shim does; joined with `&&`.
fn join_commands(leaf: &CgroupLeaf) -> Vec<String> {
    leaf.attach_files()
        .iter()
        .map(|f| format!("echo $$ > '{}'", f.display()))
        .collect()
}

fn sh(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.into()]
}

/// Polls `cond` every 20 ms for up to 30 s (a loaded 2-core machine is slow).
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let started = Instant::now();
    while !cond() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// The file's text once it holds a whole line: `echo x > f` makes the file before it writes,
/// and on a busy machine a read can fall between the two.
fn wait_file(path: &Path) -> String {
    let mut text = String::new();
    eventually(&format!("a line in {}", path.display()), || {
        text = fs::read_to_string(path).unwrap_or_default();
        text.ends_with('\n')
    });
    text
}

#[test]
fn a_leaf_takes_limits_holds_processes_freezes_kills_and_goes() {
    let fx = Fixture::new();
    let leaf = fx.leaf("lifecycle");
    assert!(leaf.exists());
    let applied = leaf
        .set_limits(&CgroupLimits {
            memory_bytes: Some(64 << 20),
            pids_max: Some(32),
            cpus: None,
        })
        .expect("limits");
    let memory_file = leaf.memory_limit_file().expect("a memory controller");
    assert_eq!(
        fs::read_to_string(&memory_file).expect("read").trim(),
        "67108864"
    );
    // The memory limit covers swap too: v2 gives the leaf no swap, v1 caps memory + swap at
    // the memory limit (where the kernel accounts swap, as this machine's does).
    match leaf.swap_limit_file() {
        Some(swap_file) => {
            let swap = fs::read_to_string(&swap_file).expect("read swap limit");
            let expected = if swap_file.ends_with("memory.swap.max") {
                "0"
            } else {
                "67108864"
            };
            assert_eq!(swap.trim(), expected, "{}", swap_file.display());
            assert_eq!(applied.written.len(), 3, "{applied:?}");
        }
        None => assert_eq!(applied.written.len(), 2, "{applied:?}"),
    }
    // Raised on the existing leaf: v1 takes it only with memsw raised first.
    let raised = leaf
        .set_limits(&CgroupLimits {
            memory_bytes: Some(96 << 20),
            pids_max: None,
            cpus: None,
        })
        .expect("a raised limit");
    assert!(!raised.written.is_empty(), "{raised:?}");
    assert_eq!(
        fs::read_to_string(&memory_file).expect("read").trim(),
        "100663296"
    );
    let pids_file = leaf.pids_limit_file().expect("a pids controller");
    assert_eq!(fs::read_to_string(&pids_file).expect("read").trim(), "32");
    assert!(!leaf.populated().expect("events"));

    // A plain process joins every hierarchy of the leaf, as the shim does.
    let joins = join_commands(&leaf);
    let mut child = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("{} && exec sleep 600", joins.join(" && ")))
        .spawn()
        .expect("spawn");
    eventually("populated 1", || leaf.populated().unwrap_or(false));
    eventually("pid in cgroup.procs", || {
        leaf.procs().unwrap_or_default().contains(&child.id())
    });
    // The shell joins the hierarchies one after another: the last may still be ahead of it
    // when the first already lists it.
    for file in leaf.attach_files() {
        eventually(&format!("pid in {}", file.display()), || {
            fs::read_to_string(&file)
                .is_ok_and(|procs| procs.lines().any(|l| l == child.id().to_string()))
        });
    }
    // The process runs in our namespace: it is not a boundary member.
    assert!(leaf.sandboxed_procs().expect("procs").is_empty());

    leaf.freeze().expect("freeze");
    eventually("frozen 1", || leaf.frozen().unwrap_or(false));
    assert_eq!(leaf.kill().expect("kill"), "cgroup.kill");
    eventually("populated 0", || !leaf.populated().unwrap_or(true));
    let status = child.wait().expect("wait");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );

    leaf.remove().expect("remove");
    assert!(!leaf.exists());
    assert!(!leaf.path().exists());
    for v1 in [
        leaf.v1_memory_path(),
        leaf.v1_pids_path(),
        leaf.v1_cpu_path(),
    ]
    .into_iter()
    .flatten()
    {
        assert!(!v1.exists(), "{} left behind", v1.display());
    }
    // Removing twice is fine; an absent leaf is not populated.
    leaf.remove().expect("remove again");
    assert!(!leaf.populated().expect("absent leaf"));
}

/// A task stopped at its memory or pids limit must fail naming it: the leaf's counters say
/// which limit stopped what, and only the one that did.
#[test]
fn a_leaf_counts_what_its_memory_and_pids_limits_stopped() {
    let fx = Fixture::new();
    let leaf = fx.leaf("limit-hits");
    leaf.set_limits(&CgroupLimits {
        memory_bytes: Some(32 << 20),
        pids_max: Some(16),
        cpus: None,
    })
    .expect("limits");
    let before = LimitHits::of(&leaf).expect("counters").expect("a leaf");
    assert_eq!(before.describe(), None, "{before:?}");
    assert_eq!(before.memory_limit_bytes, Some(32 << 20));
    assert_eq!(before.pids_limit, Some(16));

    let joins = join_commands(&leaf);
    let run = |script: &str| {
        std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("{} && {script}", joins.join(" && ")))
            .stderr(std::process::Stdio::null())
            .status()
            .expect("spawn")
    };
    // 100 MB held by one process (tail keeps a line without a newline whole): killed.
    run("head -c 100000000 /dev/zero | tail -n 1 > /dev/null");
    let memory = LimitHits::of(&leaf).expect("counters").expect("a leaf");
    assert!(memory.oom_kills >= 1, "{memory:?}");
    let text = memory
        .describe()
        .unwrap_or_else(|| panic!("named: {memory:?}"));
    assert!(
        text.contains("memory limit of 33554432 bytes") && !text.contains("pids"),
        "{text}"
    );

    // 40 sleepers against a limit of 16: forks refused.
    run("for i in $(seq 40); do sleep 30 & done; true");
    let both = LimitHits::of(&leaf).expect("counters").expect("a leaf");
    assert!(both.forks_refused >= 1, "{both:?}");
    let text = both.describe().expect("named");
    assert!(text.contains("pids limit of 16 was reached"), "{text}");
    leaf.kill().expect("kill");
    eventually("populated 0", || !leaf.populated().unwrap_or(true));
    leaf.remove().expect("remove");
    assert_eq!(LimitHits::of(&leaf).expect("gone"), None);
}

#[test]
fn the_boundary_drops_every_capability_and_sets_no_new_privs() {
    let fx = Fixture::new();
    let leaf = fx.leaf("caps");
    let (mut process, launch) = fx.launch(
        &leaf,
        "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status > /out/status; id -u > /out/uid",
    );
    process.wait().expect("wait");
    assert_eq!(
        SandboxProcess::read_exit_code(&launch.exit_code_file).expect("exit file"),
        Some(0),
        "stderr: {}",
        fx.stderr()
    );
    let status = fs::read_to_string(fx.path("out/status")).expect("status");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            status.contains(&format!("{cap}:\t0000000000000000")),
            "{cap} not empty:\n{status}"
        );
    }
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert_eq!(
        fs::read_to_string(fx.path("out/uid")).expect("uid").trim(),
        "0"
    );
}

#[test]
fn host_credential_files_are_shown_empty_even_to_root_inside() {
    let host_shadow = fs::metadata("/etc/shadow").map(|m| m.len()).unwrap_or(0);
    assert!(
        host_shadow > 0,
        "the host's /etc/shadow should not be empty"
    );
    let fx = Fixture::new();
    let leaf = fx.leaf("shadow");
    let (mut process, launch) = fx.launch(
        &leaf,
        "id -u > /out/uid; wc -c < /etc/shadow > /out/shadow; wc -c < /etc/passwd > /out/passwd",
    );
    process.wait().expect("wait");
    assert_eq!(
        SandboxProcess::read_exit_code(&launch.exit_code_file).expect("exit file"),
        Some(0),
        "stderr: {}",
        fx.stderr()
    );
    assert_eq!(
        fs::read_to_string(fx.path("out/uid")).expect("uid").trim(),
        "0"
    );
    assert_eq!(
        fs::read_to_string(fx.path("out/shadow"))
            .expect("shadow")
            .trim(),
        "0",
        "/etc/shadow must read as empty inside"
    );
    let passwd: u64 = fs::read_to_string(fx.path("out/passwd"))
        .expect("passwd")
        .trim()
        .parse()
        .expect("a size");
    assert!(passwd > 0, "the rest of /etc stays visible");
}

#[test]
fn an_unprivileged_sandbox_user_cannot_read_root_only_files() {
    let fx = Fixture::new();
    let leaf = fx.leaf("user");
    let out = fx.path("out");
    fs::create_dir_all(&out).expect("out");
    std::os::unix::fs::chown(&out, Some(65534), Some(65534)).expect("chown out");
    let (mut process, launch) = fx.launch_with(
        &leaf,
        BubblewrapCommand::new(sh(
            "id -u > /out/uid; grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status > /out/status; \
             if cat /etc/shadow > /dev/null 2>&1; then echo readable; else echo denied; fi > /out/shadow; \
             echo x > /tmp/x && echo tmp-ok > /out/tmp",
        ))
        .sandbox_user(Some((65534, 65534))),
    );
    process.wait().expect("wait");
    assert_eq!(
        SandboxProcess::read_exit_code(&launch.exit_code_file).expect("exit file"),
        Some(0),
        "stderr: {}",
        fx.stderr()
    );
    assert_eq!(
        fs::read_to_string(out.join("uid")).expect("uid").trim(),
        "65534"
    );
    assert_eq!(
        fs::read_to_string(out.join("shadow"))
            .expect("shadow")
            .trim(),
        "denied"
    );
    assert_eq!(
        fs::read_to_string(out.join("tmp")).expect("tmp").trim(),
        "tmp-ok"
    );
    let status = fs::read_to_string(out.join("status")).expect("status");
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
    assert!(status.contains("CapBnd:\t0000000000000000"), "{status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
}

#[test]
fn environment_values_reach_the_sandbox_but_no_command_line() {
    let fx = Fixture::new();
    let leaf = fx.leaf("environment");
    let value = format!("sk-env-{}", std::process::id() * 31);
    let command = BubblewrapCommand::new(sh("echo \"$API_KEY:$LANG\" > /out/seen; sleep 2")).env(
        BTreeMap::from([
            ("API_KEY".to_string(), value.clone()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
        ]),
    );
    let (mut process, launch) = fx.launch_with(&leaf, command);
    assert_eq!(
        wait_file(&fx.path("out/seen")),
        format!("{value}:C.UTF-8\n")
    );
    for entry in fs::read_dir("/proc").expect("/proc").flatten() {
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        assert!(
            !cmdline.windows(value.len()).any(|w| w == value.as_bytes()),
            "/proc/{}/cmdline holds the value",
            entry.file_name().to_string_lossy()
        );
    }
    let script = SandboxProcess::shim_script(&launch).expect("script");
    assert!(
        !script.contains(&value) && script.contains("--args"),
        "{script}"
    );
    // The file that carried them is gone once the shim has it open.
    let carried = format!("{}.env", launch.exit_code_file.display());
    assert!(!Path::new(&carried).exists(), "{carried} is left");
    assert_eq!(process.wait().expect("wait").code(), Some(0));
}

#[test]
fn the_shim_records_the_exit_code_and_refuses_a_second_run() {
    let fx = Fixture::new();
    let leaf = fx.leaf("exit-code");
    let (mut process, launch) = fx.launch(&leaf, "echo to-stdout; echo to-stderr >&2; exit 7");
    assert_eq!(process.wait().expect("wait").code(), Some(7));
    assert_eq!(
        SandboxProcess::read_exit_code(&launch.exit_code_file).expect("exit file"),
        Some(7)
    );
    assert!(!Path::new(&format!("{}.tmp", launch.exit_code_file.display())).exists());
    assert_eq!(wait_file(&fx.path("stdout.log")), "to-stdout\n");
    assert!(fx.stderr().contains("to-stderr"), "{}", fx.stderr());
    eventually("populated 0", || !leaf.populated().unwrap_or(true));

    let again = SandboxProcess::spawn(&launch).expect_err("an attempt runs once");
    assert!(again.to_string().contains("already ran"), "{again}");
}

#[test]
fn a_missing_leaf_fails_the_spawn_by_name() {
    let fx = Fixture::new();
    let absent = fx.root.leaf("never-created").expect("name");
    let launch = SandboxLaunch {
        leaf: absent,
        boundary: BubblewrapCommand::new(sh("true")).argv().expect("argv"),
        exit_code_file: fx.path("exit"),
        stdin: None,
        output_root: fx.dir.path().to_path_buf(),
        stdout: fx.path("stdout.log"),
        stderr: fx.path("stderr.log"),
    };
    let err = SandboxProcess::spawn(&launch).expect_err("no leaf");
    assert!(err.to_string().contains("never-created"), "{err}");
}

#[test]
fn sigterm_reaches_the_provider_and_its_exit_code_is_kept() {
    let fx = Fixture::new();
    let leaf = fx.leaf("term-trap");
    let (process, launch) = fx.launch(
        &leaf,
        "trap 'echo got-term > /out/term; exit 143' TERM; echo up > /out/up; while :; do sleep 0.1; done",
    );
    process.detach();
    wait_file(&fx.path("out/up"));
    let outcome = Termination::new(Duration::from_secs(20))
        .run(&leaf)
        .expect("terminate");
    assert_eq!(outcome, TerminationOutcome::ExitedWithinGrace);
    assert_eq!(wait_file(&fx.path("out/term")).trim(), "got-term");
    assert_eq!(
        SandboxProcess::read_exit_code(&launch.exit_code_file).expect("exit"),
        Some(143)
    );
    assert!(!leaf.populated().expect("events"));
}

#[test]
fn a_provider_ignoring_sigterm_is_killed_after_the_grace() {
    let fx = Fixture::new();
    let leaf = fx.leaf("term-ignored");
    let (process, launch) = fx.launch(
        &leaf,
        "trap '' TERM; echo up > /out/up; while :; do sleep 0.1; done",
    );
    process.detach();
    wait_file(&fx.path("out/up"));
    let started = Instant::now();
    let outcome = Termination::new(Duration::from_millis(800))
        .run(&leaf)
        .expect("terminate");
    assert_eq!(outcome, TerminationOutcome::Killed);
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "grace not honoured"
    );
    assert_eq!(
        SandboxProcess::read_exit_code(&launch.exit_code_file).expect("exit"),
        Some(137)
    );
    assert!(!leaf.populated().expect("events"));
    // Terminating an empty leaf is a no-op.
    assert_eq!(
        Termination::new(Duration::from_secs(1))
            .run(&leaf)
            .expect("again"),
        TerminationOutcome::NotRunning
    );
}

/// A leaf's usage is the kernel's count of what its processes did: CPU time that grows while
/// one spins (and stays once it ended), memory while one holds some; none once it is gone.
#[test]
fn a_leafs_usage_counts_its_processes_cpu_and_memory() {
    let fx = Fixture::new();
    let leaf = fx.leaf("usage");
    let idle = LeafUsage::of(&leaf)
        .expect("usage")
        .expect("the leaf exists");
    assert_eq!(idle.cpu_usec, 0, "{idle:?}");
    // It spins until told to stop, so a busy machine only makes the wait longer: the count
    // must reach half a second of CPU while it spins, and keep it once it stopped.
    let (process, _launch) = fx.launch(
        &leaf,
        "while [ ! -e /out/stop ]; do :; done; \
         echo spun > /out/spun; x=$(head -c 20000000 /dev/zero | tr '\\0' x); \
         echo held > /out/held; sleep 600",
    );
    process.detach();
    eventually("half a second of spinning counted", || {
        LeafUsage::of(&leaf)
            .ok()
            .flatten()
            .is_some_and(|u| u.cpu_usec >= 500_000)
    });
    fs::write(fx.path("out/stop"), "").expect("tell it to stop");
    wait_file(&fx.path("out/held"));
    let busy = LeafUsage::of(&leaf)
        .expect("usage")
        .expect("the leaf exists");
    assert!(
        busy.cpu_usec >= 500_000,
        "the spinning stays counted: {busy:?}"
    );
    assert!(
        busy.memory_bytes >= 20_000_000,
        "20 MB held by the shell: {busy:?}"
    );
    Reaper::new(Duration::from_secs(10))
        .reap(&leaf)
        .expect("reap");
    assert_eq!(LeafUsage::of(&leaf).expect("usage"), None);
}

#[test]
fn the_reaper_proves_populated_0_and_no_process_survives() {
    let fx = Fixture::new();
    let leaf = fx.leaf("reap");
    let (process, _launch) = fx.launch(
        &leaf,
        "for i in 1 2 3 4; do sleep 600 & done; echo up > /out/up; wait",
    );
    process.detach();
    wait_file(&fx.path("out/up"));
    // shim, outer bwrap, bwrap as pid 1, the shell, four sleeps.
    eventually("8 processes", || leaf.procs().map_or(0, |p| p.len()) >= 8);
    let seen: Vec<ProcessEntry> = leaf
        .procs()
        .expect("procs")
        .into_iter()
        .filter_map(ProcessEntry::read)
        .collect();
    assert!(seen.len() >= 8, "{seen:?}");
    assert!(leaf.sandboxed_procs().expect("members").len() >= 6);

    let evidence = Reaper::default().reap(&leaf).expect("reap");
    assert!(!evidence.populated, "{evidence:?}");
    assert_eq!(evidence.cgroup, leaf.path().display().to_string());
    assert!(evidence.observed_at_ms > 0);
    let steps = evidence.steps.join("\n");
    for expected in [
        "cgroup.freeze 1",
        "killed via cgroup.kill",
        "populated 0",
        "removed",
    ] {
        assert!(steps.contains(expected), "{expected} missing in:\n{steps}");
    }
    assert!(steps.contains("0 of "), "{steps}");
    assert!(!leaf.exists(), "leaf still there");
    // The pids we saw (with their start times) are all gone: corroboration of populated 0.
    eventually("every seen process gone", || {
        seen.iter().all(|p| !p.is_alive())
    });

    let json = serde_json::to_value(&evidence).expect("json");
    assert_eq!(json["populated"], serde_json::Value::Bool(false));
    assert!(json["steps"].is_array());

    // Reaping an absent leaf is a proof too: a cgroup is removable only once empty.
    let again = Reaper::default().reap(&leaf).expect("reap absent");
    assert!(!again.populated);
    assert!(again.steps[0].contains("absent"), "{again:?}");
}

#[test]
fn the_environment_is_exactly_the_allowlist() {
    let fx = Fixture::new();
    let leaf = fx.leaf("env");
    let env: BTreeMap<String, String> = [
        ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
        ("ALLOWED".to_owned(), "yes it's here".to_owned()),
    ]
    .into();
    let (mut process, _) = fx.launch_with(
        &leaf,
        BubblewrapCommand::new(vec!["/usr/bin/env".into()]).env(env),
    );
    process.wait().expect("wait");
    let mut lines: Vec<String> = wait_file(&fx.path("stdout.log"))
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    // bubblewrap itself sets PWD to the working directory; nothing else comes in.
    assert_eq!(
        lines,
        vec!["ALLOWED=yes it's here", "PATH=/usr/bin:/bin", "PWD=/"]
    );
}

/// A cpu limit holds on either kind of host: v2 `cpu.max`, or on a hybrid host (cpu bound to
/// v1, as on this project's machines) the v1 CFS quota. Two busy loops in a leaf of one CPU are
/// throttled: the hierarchy's own `nr_throttled` counts the periods they were held back. (On a
/// host of one CPU they could never be: it needs two, as CI has.)
#[test]
fn a_leaf_holds_its_processes_to_its_cpu_limit() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        cpus >= 2,
        "this test needs 2 CPUs to show a 1-CPU limit, found {cpus}"
    );
    let fx = Fixture::new();
    let leaf = fx.leaf("cpu-limit");
    let applied = leaf
        .set_limits(&CgroupLimits {
            memory_bytes: None,
            pids_max: None,
            cpus: Some(1),
        })
        .expect("limits");
    assert!(applied.unavailable.is_empty(), "{applied:?}");
    let stat = match leaf.v1_cpu_path() {
        Some(v1) => {
            assert_eq!(
                fs::read_to_string(v1.join("cpu.cfs_quota_us"))
                    .expect("quota")
                    .trim(),
                "100000"
            );
            v1.join("cpu.stat")
        }
        None => {
            assert_eq!(
                fs::read_to_string(leaf.path().join("cpu.max"))
                    .expect("cpu.max")
                    .trim(),
                "100000 100000"
            );
            leaf.path().join("cpu.stat")
        }
    };
    let throttled = || {
        fs::read_to_string(&stat)
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("nr_throttled "))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    assert_eq!(throttled(), 0, "{}", stat.display());

    let joins = join_commands(&leaf);
    let mut child = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "{} && {{ (while :; do :; done) & (while :; do :; done) & wait; }}",
            joins.join(" && ")
        ))
        .spawn()
        .expect("spawn");
    eventually("throttled", || throttled() > 0);
    assert_eq!(leaf.kill().expect("kill"), "cgroup.kill");
    eventually("populated 0", || !leaf.populated().unwrap_or(true));
    let _ = child.wait();
    leaf.remove().expect("remove");
    if let Some(v1) = leaf.v1_cpu_path() {
        assert!(!v1.exists(), "{} left behind", v1.display());
    }
}
