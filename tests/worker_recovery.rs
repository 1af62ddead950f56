//! A worker killed with SIGKILL while its task runs, then restarted: it re-adopts the running
//! sandbox (cgroup leaf or container) by its path or labels, starts nothing twice, and
//! finishes the task. A worker silent long enough to be declared lost registers again when its
//! heartbeat is refused; one silent only through a leader change keeps its grace.

mod support;

use std::time::Duration;

use support::*;

const TASK_TIMEOUT: Duration = Duration::from_secs(120);

/// What a runtime needs beyond the defaults: worker flags, and the manifest's `vm:` lines
/// (a VM with its `outbound` NIC; software emulation here).
fn runtime_needs(runtime: &str) -> (Vec<String>, &'static str) {
    match runtime {
        "kvm" => (
            vec!["--vm-domain-type".into(), "qemu".into()],
            "  network_mode: outbound\n  memory: 512Mi\n",
        ),
        _ => (Vec::new(), ""),
    }
}

/// The tap of an `outbound` guest whose address (`a.b.c.d/30`) is `cidr`: `sqh` and its
/// slot of 100.64.0.0/14 in hex (see `squadron_isolation::sandbox_network`).
fn tap_of(cidr: &str) -> std::path::PathBuf {
    let address: std::net::Ipv4Addr = cidr
        .trim()
        .split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("not an address: {cidr:?}"));
    let slot = (u32::from(address) - u32::from(std::net::Ipv4Addr::new(100, 64, 0, 0))) / 4;
    std::path::Path::new("/sys/class/net").join(format!("sqh{slot:04x}"))
}

fn recover(runtime: &str) {
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    let repo = git_repo(cluster.dir.path());
    let (flags, vm) = runtime_needs(runtime);
    let mut worker = WorkerProc::start_with(
        cluster.dir.path(),
        &unique_worker_id(&format!("w-{runtime}")),
        cluster.urls(),
        runtime,
        flags,
    );
    // The provider waits for the test's word (`outbox/go`) once the worker came back, so it
    // cannot finish before; a guest first notes its address, whose tap must outlive the
    // restart (the new life's sweep keeps what its domains' records name).
    let script = [
        "[ -e /sys/class/net/eth0 ] && ip -4 -o addr show dev eth0 | awk '{print $4}' > /mnt/outbox/address",
        "echo started >> /mnt/outbox/starts",
        "echo running",
        "i=0; until [ -e /mnt/outbox/go ] || [ $i -ge 1200 ]; do sleep 0.25; i=$((i+1)); done",
        "echo finished",
        "echo change >> README.md",
    ]
    .map(|l| format!("    {l}\n"))
    .concat();
    let yaml = format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: recovery\nrepository:\n  url: {}\n\
         agent:\n  prompt: survive a worker crash\n  provider: script\n  script: |\n{script}\
         vm:\n  runtime: {runtime}\n{vm}lifecycle:\n  timeout: 5m\n",
        repo.display()
    );
    let r = submit_yaml(&url, &yaml);
    assert!(r.ok(), "{r:?}");
    let id = r.body["task_submitted"]["task"].as_u64().expect("task id");
    wait_task_state(&url, id, &["RUNNING"], TASK_TIMEOUT);
    let starts = worker.task_dir(id).join("outbox/starts");
    wait_until(TASK_TIMEOUT, || starts.exists()).expect("the provider started");
    worker.kill();
    // The control plane still shows the task running on the dead worker.
    std::thread::sleep(Duration::from_millis(500));
    let t = http_get(&format!("{url}/api/v1/tasks/{id}")).expect("task");
    assert_eq!(t["state"], "RUNNING", "{t:#}");
    worker.spawn();
    // Its runtimes' start-up (the sweep among it) is done once it drives the task again.
    let resumed = |log: &str| {
        log.lines()
            .any(|l| l.contains("driving task") && l.contains(r#""state":"RUNNING""#))
    };
    let log = || std::fs::read_to_string(&worker.log).unwrap_or_default();
    wait_until(TASK_TIMEOUT, || resumed(&log()))
        .unwrap_or_else(|()| panic!("the task was never driven again:\n{}", tail(&worker.log)));
    let outbox = worker.task_dir(id).join("outbox");
    if runtime == "kvm" {
        let address = std::fs::read_to_string(outbox.join("address")).expect("guest address");
        assert!(
            tap_of(&address).exists(),
            "the guest's tap did not outlive the worker's restart"
        );
    }
    std::fs::write(outbox.join("go"), "").expect("go");
    let t = wait_task_state(
        &url,
        id,
        &["COMPLETED", "FAILED", "FAILED_PRESERVED"],
        TASK_TIMEOUT,
    );
    assert_eq!(t["state"], "COMPLETED", "{t:#}\n{}", tail(&worker.log));
    assert_eq!(
        t["attempt"], 1,
        "the same attempt finished: nothing was re-queued"
    );
    // The worker moves the task's files out of its disk-quota volume once it ended.
    wait_until(Duration::from_secs(20), || starts.exists()).expect("the files moved back");
    let text = std::fs::read_to_string(&starts).expect("starts");
    assert_eq!(
        text.lines().count(),
        1,
        "the provider was started exactly once: {text:?}"
    );
    let (_, out) = http_text(&format!("{url}/api/v1/tasks/{id}/logs?stream=stdout")).expect("logs");
    assert!(out.contains("running") && out.contains("finished"), "{out}");
    let (_, patch) =
        http_text(&format!("{url}/api/v1/tasks/{id}/artifacts/{id}.patch")).expect("patch");
    assert!(patch.contains("+change"), "{patch}");
    if runtime == "kvm" {
        let address = std::fs::read_to_string(outbox.join("address")).expect("guest address");
        assert!(
            wait_until(Duration::from_secs(30), || !tap_of(&address).exists()).is_ok(),
            "the guest's tap outlived its task"
        );
    }
}

#[test]
fn a_restarted_worker_re_adopts_its_running_process_sandbox() {
    recover("process");
}

#[test]
fn a_restarted_worker_re_adopts_its_running_container() {
    recover("docker");
}

#[test]
fn a_restarted_worker_re_adopts_its_running_domain() {
    recover("kvm");
}

/// SIGSTOP past the worker's TTL (three 1 s heartbeats): the leader declares it lost; after
/// SIGCONT its next heartbeat is refused, and it registers again and is alive once more.
#[test]
fn a_worker_declared_lost_registers_again_when_its_heartbeat_is_refused() {
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    let id = unique_worker_id("w-lost");
    let worker = WorkerProc::start(cluster.dir.path(), &id, cluster.urls(), "process");
    let worker_url = format!("{url}/api/v1/workers/{id}");
    let registered =
        |w: &serde_json::Value| w["registered_at_ms"].as_u64().expect("registered_at_ms");
    let first = registered(&http_get(&worker_url).expect("worker"));
    // Servers and workers log JSON lines unless told otherwise (`--log-format`).
    assert_json_log(&worker.log, "worker registered");
    // A task's transitions are logged as the seed has it: task_id, from, to.
    let task = submit_yaml(&url, &inert_manifest("logged", "process"));
    assert!(task.ok(), "{task:?}");
    let task_id = task.body["task_submitted"]["task"]
        .as_u64()
        .expect("task id");
    wait_task_state(
        &url,
        task_id,
        &["COMPLETED", "FAILED", "FAILED_PRESERVED"],
        Duration::from_secs(60),
    );
    let id_text = task_id.to_string();
    let transitions = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&worker.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| {
                v["fields"]["message"] == "task transition"
                    && v["fields"]["task_id"] == id_text.as_str()
            })
            .collect()
    };
    // The manifest's repository does not exist: staging fails. The worker logs a transition
    // once the control plane confirmed it, which may be after the state is visible (CI read
    // the log first once, on a loaded machine).
    let failed_staging =
        |v: &serde_json::Value| v["fields"]["from"] == "STAGING" && v["fields"]["to"] == "FAILED";
    let logged = wait_until(Duration::from_secs(20), || {
        transitions().iter().any(failed_staging)
    });
    assert!(
        logged.is_ok(),
        "no STAGING → FAILED line for task {task_id}: {:#?}",
        transitions()
    );
    assert_json_log(&cluster.nodes[&1].log, "control node started");
    let signal = |name: &str| signal(&worker, name);
    signal("STOP");
    let lost = wait_until(Duration::from_secs(30), || {
        http_get(&worker_url).is_ok_and(|w| w["status"] == "lost")
    });
    signal("CONT");
    assert!(
        lost.is_ok(),
        "not declared lost: {:?}",
        http_get(&worker_url)
    );
    let back = wait_until(Duration::from_secs(30), || {
        http_get(&worker_url).is_ok_and(|w| w["status"] == "alive" && registered(&w) > first)
    });
    assert!(
        back.is_ok(),
        "did not register again: {:?}\n{}",
        http_get(&worker_url),
        tail(&worker.log)
    );
}

fn signal(worker: &WorkerProc, name: &str) {
    let pid = worker.child.as_ref().expect("running").id().to_string();
    let ok = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -{name} {pid}");
}

/// A worker's heartbeats go to the leader, so it cannot be heard while an election runs and it
/// finds the new leader. Here it is stopped (SIGSTOP) 4 s before the leader is killed and
/// resumed 1.5 s after the new leader is seen (7.5 s at least): silent past its 6 s TTL from
/// its last heartbeat, but not from the new term's start. The new leader gives it that grace
/// (`LeaderSweep`): it is never lost and never registers again. Without the grace the new
/// leader's first sweep, within a second of its election, declares it lost.
#[test]
fn a_worker_silent_through_a_leader_change_is_not_lost_within_its_grace() {
    let mut cluster = Cluster::start(3);
    let id = unique_worker_id("w-grace");
    let worker = WorkerProc::start_with(
        cluster.dir.path(),
        &id,
        cluster.urls(),
        "process",
        vec!["--heartbeat-interval-ms".into(), "2000".into()],
    );
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    let survivor = cluster.url(if leader == 1 { 2 } else { 1 });
    let worker_url = format!("{survivor}/api/v1/workers/{id}");
    let registered =
        |w: &serde_json::Value| w["registered_at_ms"].as_u64().expect("registered_at_ms");
    let first = http_get(&worker_url).expect("worker");
    assert_eq!(first["ttl_ms"], 6000, "{first:#}");
    signal(&worker, "STOP");
    let stopped = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(30));
    assert_ne!(new_leader, leader);
    let resume_at = (stopped + Duration::from_millis(7_500))
        .max(std::time::Instant::now() + Duration::from_millis(1_500));
    std::thread::sleep(resume_at.saturating_duration_since(std::time::Instant::now()));
    let before_resume = http_get(&worker_url).expect("worker");
    signal(&worker, "CONT");
    // Past the new term's grace: a worker not heard by then would be lost.
    std::thread::sleep(Duration::from_secs(8));
    let after = http_get(&worker_url).expect("worker");
    for (when, w) in [("before SIGCONT", &before_resume), ("after", &after)] {
        assert_eq!(
            (&w["status"], registered(w)),
            (&serde_json::json!("alive"), registered(&first)),
            "{when}: the worker was lost across the leader change: {w:#}\n{}",
            tail(&worker.log)
        );
    }
    assert!(
        after["last_heartbeat_ms"].as_u64() > first["last_heartbeat_ms"].as_u64(),
        "no heartbeat reached the new leader: {after:#}"
    );
}

/// The control-plane leader is killed while a Docker task runs: the agent inside the sandbox
/// loses its connection, reconnects through its relay (which dials the new leader) and keeps
/// checking in, and the task completes once, on its first attempt.
#[test]
fn a_docker_sandboxs_agent_follows_a_new_leader() {
    agent_follows_a_new_leader("docker");
}

/// The same through a VM's channel: the agent's new connection is a new yamux stream, which
/// the worker dials to the new leader.
#[test]
fn a_vms_agent_follows_a_new_leader() {
    agent_follows_a_new_leader("kvm");
}

fn agent_follows_a_new_leader(runtime: &str) {
    let mut cluster = Cluster::start(3);
    let repo = git_repo(cluster.dir.path());
    let (mut flags, vm) = runtime_needs(runtime);
    // This one picks the domain type itself (`auto`): the probe boots the image under `kvm`
    // once per machine and image, and falls back to `qemu` where that does not boot.
    flags.retain(|f| f != "--vm-domain-type" && f != "qemu");
    flags.extend(["--agent-heartbeat-interval-ms".into(), "300".into()]);
    let worker = WorkerProc::start_with(
        cluster.dir.path(),
        &unique_worker_id(&format!("w-agent-leader-{runtime}")),
        cluster.urls(),
        runtime,
        flags,
    );
    let yaml = format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: leader-change\nrepository:\n  url: {}\n\
         agent:\n  prompt: outlive the leader\n  provider: script\n  script: |\n    echo started\n    \
         sleep 10\n    echo finished\nvm:\n  runtime: {runtime}\n{vm}lifecycle:\n  timeout: 5m\n",
        repo.display()
    );
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    let survivor = cluster.url(if leader == 1 { 2 } else { 1 });
    let r = submit_yaml(&survivor, &yaml);
    assert!(r.ok(), "{r:?}");
    let id = r.body["task_submitted"]["task"].as_u64().expect("task id");
    wait_task_state(&survivor, id, &["RUNNING"], TASK_TIMEOUT);
    let session = |url: &str| http_get(&format!("{url}/api/v1/tasks/{id}/agent"));
    let before = session(&survivor).expect("the agent registered before RUNNING");
    assert_eq!(before["attempt"], 1, "{before:#}");
    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(30));
    assert_ne!(new_leader, leader);
    let check_ins = |s: &serde_json::Value| s["check_ins"].as_u64().unwrap_or(0);
    let seen = before["check_ins"].as_u64().unwrap_or(0);
    let followed = wait_until(Duration::from_secs(30), || {
        session(&survivor).is_ok_and(|s| check_ins(&s) >= seen + 3)
    });
    assert!(
        followed.is_ok(),
        "the agent did not check in with the new leader: {:?}\n{}",
        session(&survivor),
        tail(&worker.log)
    );
    let now = session(&survivor).expect("session");
    assert!(now["usage"]["memory_bytes"].as_u64() > Some(0), "{now:#}");
    let t = wait_task_state(
        &survivor,
        id,
        &["COMPLETED", "FAILED", "FAILED_PRESERVED"],
        TASK_TIMEOUT,
    );
    assert_eq!(t["state"], "COMPLETED", "{t:#}\n{}", tail(&worker.log));
    assert_eq!(t["attempt"], 1, "{t:#}");
    if runtime == "kvm" {
        let log = std::fs::read_to_string(&worker.log).unwrap_or_default();
        assert!(
            log.contains("\"domain_type\":\"qemu\"") || log.contains("\"domain_type\":\"kvm\""),
            "the worker names the domain type it chose"
        );
    }
    // The session ends with the attempt.
    let gone = session(&survivor).expect_err("no session after the end");
    assert!(
        gone.contains("404") || gone.contains("no registered agent"),
        "{gone}"
    );
}
