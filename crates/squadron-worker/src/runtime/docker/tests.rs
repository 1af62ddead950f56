//! Against the real engine and the image of `scripts/build-agent-image`. These tests fail,
//! never skip, when the engine is not reachable.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bollard::container::RemoveContainerOptions;
use bollard::Docker;
use squadron_core::ids::{TaskId, WorkerId};
use squadron_core::manifest::{NetworkMode, RuntimeKind};

use super::*;
use crate::runtime::{LaunchSpec, RunStatus, Runtime, SandboxLimits};
use crate::task::task_dir::TaskDir;

const EXIT_WAIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(100);

static NEXT_TASK: AtomicU64 = AtomicU64::new(1);

async fn runtime() -> DockerRuntime {
    let worker = WorkerId::new("test-worker").unwrap();
    match DockerRuntime::connect(DockerConfig::new(worker)).await {
        Ok(runtime) => runtime,
        Err(e) => panic!(
            "the Docker runtime tests need a running engine at {DEFAULT_SOCKET} and the image \
             {DEFAULT_IMAGE}: {e}\nscripts/test prepares both; by hand: apt-get install -y \
             docker.io busybox-static && (nohup dockerd >/tmp/dockerd.log 2>&1 &) && \
             scripts/build-agent-image"
        ),
    }
}

/// One task attempt in a temporary data dir; its container is removed when it drops, however
/// the test ends.
struct Case {
    _tmp: tempfile::TempDir,
    dir: TaskDir,
    task: TaskId,
    attempt: u32,
    runtime: DockerRuntime,
}

impl Case {
    /// A task id no other test of this or an earlier run uses (pid and counter), with the
    /// task directory laid out as staging leaves it and `body` as the launch script.
    async fn new(body: &str) -> Case {
        let n = u64::from(std::process::id()) * 1000 + NEXT_TASK.fetch_add(1, Ordering::SeqCst);
        let task = TaskId::new(n).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = TaskDir::new(tmp.path(), task);
        for d in [dir.inbox(), dir.progress(), dir.artifacts(), dir.run()] {
            std::fs::create_dir_all(&d).unwrap();
        }
        let script = format!(
            "exec >{OUTBOX_MOUNT}/progress/stdout.log 2>{OUTBOX_MOUNT}/progress/stderr.log\n{body}\n"
        );
        std::fs::write(dir.run().join("launch.sh"), script).unwrap();
        let case = Case {
            _tmp: tmp,
            dir,
            task,
            attempt: 1,
            runtime: runtime().await,
        };
        // A leftover of a crashed earlier run with the same pid would be re-used by provision.
        remove_container_blocking(&case.name());
        case
    }

    fn name(&self) -> String {
        DockerRuntime::container_name(&self.dir, self.attempt)
    }

    fn spec(&self) -> LaunchSpec {
        LaunchSpec {
            task: self.task,
            attempt: self.attempt,
            dir: self.dir.clone(),
            argv: vec!["/bin/sh".to_string(), format!("{RUN_MOUNT}/launch.sh")],
            workdir: INBOX_MOUNT.to_string(),
            env: BTreeMap::from([("SQUADRON_TEST_VAR".to_string(), "from-spec".to_string())]),
            limits: SandboxLimits::default(),
            network: NetworkMode::Isolated,
            full_control: false,
            global_dir: None,
            credentials: None,
            egress: None,
            keep_after_exit: false,
        }
    }

    async fn run(&self, spec: &LaunchSpec) -> SandboxHandle {
        let handle = self.runtime.provision(spec).await.unwrap();
        assert_eq!(handle.runtime, RuntimeKind::Docker);
        assert_eq!(
            self.runtime.status(&handle).await.unwrap(),
            RunStatus::Created
        );
        self.runtime.start(&handle, spec).await.unwrap();
        handle
    }

    async fn wait_exit(&self, handle: &SandboxHandle) -> i32 {
        let deadline = Instant::now() + EXIT_WAIT;
        loop {
            match self.runtime.status(handle).await.unwrap() {
                RunStatus::Exited { code } => return code,
                RunStatus::Vanished => panic!("container {} vanished", handle.id),
                RunStatus::Created | RunStatus::Running => {}
            }
            assert!(
                Instant::now() < deadline,
                "container {} did not exit",
                handle.id
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until the script has written `/mnt/outbox/<name>`.
    async fn wait_file(&self, name: &str) {
        let path = self.dir.outbox().join(name);
        let deadline = Instant::now() + EXIT_WAIT;
        while !path.exists() {
            assert!(
                Instant::now() < deadline,
                "{} never appeared",
                path.display()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    fn outbox_file(&self, name: &str) -> String {
        let path = self.dir.outbox().join(name);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; stderr.log: {}", path.display(), self.stderr()))
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.stderr_log()).unwrap_or_default()
    }

    /// `key=value` lines the script wrote to `/mnt/outbox/result.txt`.
    fn results(&self) -> BTreeMap<String, String> {
        self.outbox_file("result.txt")
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect()
    }

    async fn inspect(&self, handle: &SandboxHandle) -> ContainerInspectResponse {
        self.runtime.inspect(&handle.id).await.unwrap().unwrap()
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        remove_container_blocking(&self.name());
    }
}

/// Removes a container by name from outside any async context (a Drop guard).
fn remove_container_blocking(name: &str) {
    let owned = name.to_string();
    let joined = std::thread::spawn(move || {
        let name = owned;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let Ok(docker) = Docker::connect_with_socket(DEFAULT_SOCKET, 60, API_DEFAULT_VERSION)
            else {
                return;
            };
            let options = RemoveContainerOptions {
                force: true,
                v: true,
                link: false,
            };
            let _ = docker.remove_container(&name, Some(options)).await;
        });
    })
    .join();
    assert!(joined.is_ok(), "cleanup of container {name} panicked");
}

fn capability_lines(body_result: &str) -> String {
    format!(
        "grep -E '^(CapEff|NoNewPrivs):' /proc/self/status | tr -d ' \\t' | tr ':' '=' >> {body_result}"
    )
}

#[tokio::test]
async fn connect_negotiates_the_engines_api_version() {
    let runtime = runtime().await;
    let engine = runtime.docker.version().await.unwrap();
    let engine_api = engine.api_version.unwrap();
    let (major, minor) = engine_api.split_once('.').unwrap();
    let engine_version = (
        major.parse::<usize>().unwrap(),
        minor.parse::<usize>().unwrap(),
    );
    let default = (
        API_DEFAULT_VERSION.major_version,
        API_DEFAULT_VERSION.minor_version,
    );
    let expected = engine_version.min(default);
    assert_eq!(
        runtime.api_version(),
        format!("{}.{}", expected.0, expected.1)
    );
}

#[tokio::test]
async fn connect_names_a_missing_socket_and_a_missing_image() {
    let worker = WorkerId::new("test-worker").unwrap();
    let mut config = DockerConfig::new(worker.clone());
    config.socket = PathBuf::from("/nonexistent/squadron/docker.sock");
    let err = DockerRuntime::connect(config)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/squadron/docker.sock"), "{err}");
    assert!(err.contains("dockerd"), "{err}");

    let mut config = DockerConfig::new(worker);
    config.image = "squadron-no-such-image:never".to_string();
    let err = DockerRuntime::connect(config)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("squadron-no-such-image:never"), "{err}");
    assert!(err.contains("scripts/build-agent-image"), "{err}");
}

#[tokio::test]
async fn hardened_container_sees_its_mounts_limits_and_no_privileges() {
    let r = format!("{OUTBOX_MOUNT}/result.txt");
    let body = format!(
        r#"
echo "pwd=$(pwd)" >> {r}
(echo hello > {OUTBOX_MOUNT}/out.txt) 2>/dev/null && echo outbox=ok >> {r} || echo outbox=denied >> {r}
(echo hello > {INBOX_MOUNT}/in.txt) 2>/dev/null && echo inbox=ok >> {r} || echo inbox=denied >> {r}
(echo x > {RUN_MOUNT}/x) 2>/dev/null && echo run=ok >> {r} || echo run=denied >> {r}
(echo x > /etc/x) 2>/dev/null && echo etc=ok >> {r} || echo etc=denied >> {r}
(echo x > {GLOBAL_MOUNT}/x) 2>/dev/null && echo global_write=ok >> {r} || echo global_write=denied >> {r}
echo "global_read=$(cat {GLOBAL_MOUNT}/shared.txt)" >> {r}
(echo x > /tmp/x) 2>/dev/null && echo tmp=ok >> {r} || echo tmp=denied >> {r}
{caps}
echo "net=$(ls /sys/class/net | tr '\n' ' ')" >> {r}
echo "env_spec=$SQUADRON_TEST_VAR" >> {r}
echo "env_leak=${{CARGO_MANIFEST_DIR:-none}}" >> {r}
echo "memory=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max)" >> {r}
echo "pids=$(cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max)" >> {r}
echo "a line on stdout"
exit 7
"#,
        caps = capability_lines(&r),
    );
    let case = Case::new(&body).await;
    let global = tempfile::tempdir().unwrap();
    std::fs::write(global.path().join("shared.txt"), "shared").unwrap();
    let mut spec = case.spec();
    spec.global_dir = Some(global.path().to_path_buf());
    spec.limits = SandboxLimits {
        cpus: Some(1),
        memory_bytes: Some(256 * 1024 * 1024),
        pids_max: Some(64),
        disk_bytes: None,
    };

    let handle = case.run(&spec).await;
    assert_eq!(
        case.wait_exit(&handle).await,
        7,
        "stderr: {}",
        case.stderr()
    );

    let results = case.results();
    let expect = [
        ("pwd", INBOX_MOUNT),
        ("outbox", "ok"),
        ("inbox", "ok"),
        ("run", "denied"),
        ("etc", "denied"),
        ("global_write", "denied"),
        ("global_read", "shared"),
        ("tmp", "ok"),
        ("CapEff", "0000000000000000"),
        ("NoNewPrivs", "1"),
        ("net", "lo"),
        ("env_spec", "from-spec"),
        ("env_leak", "none"),
        ("memory", "268435456"),
        ("pids", "64"),
    ];
    for (key, value) in expect {
        assert_eq!(
            results.get(key).map(String::as_str),
            Some(value),
            "{key} in {results:?}; stderr: {}",
            case.stderr()
        );
    }
    assert_eq!(
        std::fs::read_to_string(case.dir.inbox().join("in.txt")).unwrap(),
        "hello\n"
    );
    assert_eq!(
        std::fs::read_to_string(case.dir.stdout_log()).unwrap(),
        "a line on stdout\n"
    );
    assert!(!case.dir.run().join("x").exists());
    assert!(!global.path().join("x").exists());
}

#[tokio::test]
async fn container_carries_labels_limits_and_hardening() {
    let case = Case::new("exit 0").await;
    let global = tempfile::tempdir().unwrap();
    let mut spec = case.spec();
    spec.global_dir = Some(global.path().to_path_buf());
    spec.network = NetworkMode::Outbound;
    spec.limits = SandboxLimits {
        cpus: Some(2),
        memory_bytes: Some(300 * 1024 * 1024),
        pids_max: Some(128),
        disk_bytes: None,
    };
    let handle = case.runtime.provision(&spec).await.unwrap();
    let found = case.inspect(&handle).await;
    assert_eq!(
        found.name.as_deref(),
        Some(format!("/{}", case.name()).as_str())
    );

    let config = found.config.unwrap();
    let labels = config.labels.unwrap();
    assert_eq!(labels[LABEL_TASK], case.task.get().to_string());
    assert_eq!(labels[LABEL_ATTEMPT], "1");
    assert_eq!(labels[LABEL_WORKER], "test-worker");
    assert_eq!(labels[LABEL_MANAGED], "true");
    assert_eq!(config.cmd.unwrap(), spec.argv);
    assert_eq!(config.working_dir.as_deref(), Some(INBOX_MOUNT));
    assert_eq!(config.image.as_deref(), Some(DEFAULT_IMAGE));
    // Only the spec's environment and what the engine itself adds.
    for entry in config.env.unwrap() {
        let key = entry.split_once('=').unwrap().0;
        assert!(
            [
                "SQUADRON_TEST_VAR",
                "PATH",
                "HOSTNAME",
                // Git's safe.directory, for the sandbox user (`runtime::sandbox_user`).
                "GIT_CONFIG_COUNT",
                "GIT_CONFIG_KEY_0",
                "GIT_CONFIG_VALUE_0",
            ]
            .contains(&key),
            "unexpected variable {entry}"
        );
    }

    let host = found.host_config.unwrap();
    assert_eq!(host.memory, Some(300 * 1024 * 1024));
    assert_eq!(host.memory_swap, Some(300 * 1024 * 1024));
    assert_eq!(host.nano_cpus, Some(2_000_000_000));
    assert_eq!(host.pids_limit, Some(128));
    // Outbound joins the worker's managed network, not the engine's default bridge.
    assert_eq!(
        host.network_mode.as_deref(),
        Some(format!("squadron-{}", case.runtime.config.network.owner).as_str())
    );
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
    assert_eq!(host.cap_add, None);
    assert_eq!(
        host.security_opt,
        Some(vec!["no-new-privileges".to_string()])
    );
    assert_eq!(host.readonly_rootfs, Some(true));
    assert_eq!(host.privileged, Some(false));
    assert_eq!(host.init, Some(true));
    assert!(host.tmpfs.unwrap().contains_key("/tmp"));

    let mut mounts: Vec<(String, String, bool)> = host
        .mounts
        .unwrap()
        .into_iter()
        .map(|m| {
            (
                m.target.unwrap(),
                m.source.unwrap(),
                m.read_only.unwrap_or(false),
            )
        })
        .collect();
    mounts.sort();
    let canonical = |p: PathBuf| std::fs::canonicalize(p).unwrap().display().to_string();
    assert_eq!(
        mounts,
        vec![
            (
                GLOBAL_MOUNT.to_string(),
                canonical(global.path().to_path_buf()),
                true
            ),
            (INBOX_MOUNT.to_string(), canonical(case.dir.inbox()), false),
            (
                OUTBOX_MOUNT.to_string(),
                canonical(case.dir.outbox()),
                false
            ),
            (RUN_MOUNT.to_string(), canonical(case.dir.run()), true),
        ]
    );
    assert_eq!(
        case.runtime.status(&handle).await.unwrap(),
        RunStatus::Created
    );
}

#[tokio::test]
async fn full_control_keeps_capabilities_but_not_privileged() {
    let r = format!("{OUTBOX_MOUNT}/result.txt");
    let body = format!(
        r#"
{caps}
(echo x > /etc/x) 2>/dev/null && echo etc=ok >> {r} || echo etc=denied >> {r}
echo "uid=$(id -u)" >> {r}
"#,
        caps = capability_lines(&r),
    );
    let case = Case::new(&body).await;
    let mut spec = case.spec();
    spec.full_control = true;
    let handle = case.run(&spec).await;
    assert_eq!(
        case.wait_exit(&handle).await,
        0,
        "stderr: {}",
        case.stderr()
    );

    let results = case.results();
    let cap_eff = u64::from_str_radix(&results["CapEff"], 16).unwrap();
    assert_ne!(cap_eff, 0, "{results:?}");
    // Docker's default set: no CAP_SYS_ADMIN (bit 21) even in full control.
    assert_eq!(cap_eff & (1 << 21), 0, "{results:?}");
    assert_eq!(results["NoNewPrivs"], "0");
    assert_eq!(results["etc"], "ok");
    assert_eq!(results["uid"], "0");

    let host = case.inspect(&handle).await.host_config.unwrap();
    assert_eq!(host.privileged, Some(false));
    assert_ne!(host.readonly_rootfs, Some(true));
    assert_eq!(host.cap_drop.unwrap_or_default(), Vec::<String>::new());
    assert_eq!(host.mounts.unwrap().len(), 3);
}

#[tokio::test]
async fn network_modes_map_to_none_bridge_and_host() {
    let r = format!("{OUTBOX_MOUNT}/result.txt");
    let body = format!(r#"echo "net=$(ls /sys/class/net | tr '\n' ' ')" >> {r}"#);
    // Other sandboxes' host ends — the process runtime's pairs (`sqh…`, tests' `sqt…`) and
    // other containers' (`veth…`) — come and go while this runs: not part of the comparison.
    // Interfaces other tests create and remove meanwhile (sandbox veths `sqh*`, test
    // "internets" `sqt*`, the chaos suite's `sqj*`, managed bridges `sqd*`) are not compared.
    let ours = |name: &String| !["sq", "veth"].iter().any(|p| name.starts_with(p));
    let mut host_interfaces: Vec<String> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(ours)
        .collect();
    host_interfaces.sort();

    for mode in [
        NetworkMode::Isolated,
        NetworkMode::Outbound,
        NetworkMode::Full,
    ] {
        let mut case = Case::new(&body).await;
        case.runtime.config.allow_full_network = true;
        let mut spec = case.spec();
        spec.network = mode;
        let handle = case.run(&spec).await;
        assert_eq!(
            case.wait_exit(&handle).await,
            0,
            "stderr: {}",
            case.stderr()
        );
        let host = case.inspect(&handle).await.host_config.unwrap();
        assert_eq!(
            host.network_mode.as_deref(),
            Some(case.runtime.network_mode(mode).as_str())
        );
        let mut seen: Vec<String> = case.results()["net"]
            .split_whitespace()
            .map(String::from)
            .filter(ours)
            .collect();
        seen.sort();
        match mode {
            NetworkMode::Isolated => assert_eq!(seen, vec!["lo"]),
            NetworkMode::Outbound => assert_eq!(seen, vec!["eth0", "lo"]),
            NetworkMode::Full => assert_eq!(seen, host_interfaces),
            NetworkMode::Gateway => unreachable!("not among the modes above"),
        }
    }
}

/// Each of `targets` probed `want` (`open` or `closed`) in `results`.
fn assert_probed<'a>(
    results: &BTreeMap<String, String>,
    targets: impl IntoIterator<Item = &'a String>,
    want: &str,
) {
    for target in targets {
        assert_eq!(
            results.get(target).map(String::as_str),
            Some(want),
            "{target}: {results:?}"
        );
    }
}

/// On the managed network an `outbound` container reaches a listener in a test-made
/// "internet" namespace, and neither the host (any address, the bridge's gateway) nor the
/// metadata-style address.
#[tokio::test]
async fn outbound_containers_reach_only_the_internet_never_the_host_or_metadata() {
    let (blocked, allowed, results) = probe_from_a_container(NetworkMode::Outbound, None).await;
    assert_probed(&results, &blocked, "closed");
    assert_probed(&results, [&allowed], "open");
}

/// An `isolated` container reaches nothing: not the host (any address, the managed bridge's
/// gateway), not the metadata address, not the internet an `outbound` one reaches.
#[tokio::test]
async fn isolated_containers_reach_nothing() {
    let (blocked, allowed, results) = probe_from_a_container(NetworkMode::Isolated, None).await;
    assert_probed(&results, blocked.iter().chain([&allowed]), "closed");
}

/// With the worker's allow list (`--egress-allow`) an `outbound` container reaches what the
/// list names and nothing else: the internet's listener when the list names its address, not
/// when it names another network; the host and the metadata address never, listed or not.
#[tokio::test]
async fn outbound_containers_reach_only_what_the_allow_list_names() {
    use crate::runtime::test_internet::host_addresses;
    // Each runtime its own worker tag, so its own managed bridge and filter table.
    let with = |worker: &str, allow: Vec<String>| {
        let mut config = DockerConfig::new(WorkerId::new(worker).unwrap());
        let mut allow: Vec<ipnet::Ipv4Net> = allow.iter().map(|a| a.parse().unwrap()).collect();
        // Listing the host itself lets nothing of it through: the deny list comes first.
        allow.extend(host_addresses().into_iter().map(ipnet::Ipv4Net::from));
        config.network.allow = Some(allow);
        config
    };
    let elsewhere = with("test-allow-elsewhere", vec!["192.0.2.0/24".into()]);
    let (blocked, allowed, results) =
        probe_from_a_container(NetworkMode::Outbound, Some(elsewhere)).await;
    assert_probed(&results, blocked.iter().chain([&allowed]), "closed");
    // Every test internet this process makes has the same address (its pid's).
    let internet_address = allowed.rsplit_once(':').unwrap().0.to_owned();
    let listed = with("test-allow-listed", vec![format!("{internet_address}/32")]);
    let (blocked, allowed, results) =
        probe_from_a_container(NetworkMode::Outbound, Some(listed)).await;
    assert_probed(&results, &blocked, "closed");
    assert_probed(&results, [&allowed], "open");
}

/// Runs connection probes from a container of `mode` (on a runtime of `config`, else the
/// tests' shared one): the host's listeners (every address, the managed bridge's gateway) and
/// the metadata address, which no sandbox may reach, and a listener in a test-made internet.
/// Returns those, the internet's target and each `target → open|closed`.
async fn probe_from_a_container(
    mode: NetworkMode,
    config: Option<DockerConfig>,
) -> (Vec<String>, String, BTreeMap<String, String>) {
    use crate::runtime::test_internet::{
        host_addresses, TestInternet, INTERNET_PORT, METADATA_ADDRESS,
    };
    let internet = TestInternet::new();
    let everywhere = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = everywhere.local_addr().unwrap().port();
    let mut case = Case::new("").await;
    if let Some(config) = config {
        case.runtime = DockerRuntime::connect(config)
            .await
            .expect("a runtime of its own");
    }
    let managed = case
        .runtime
        .docker
        .inspect_network(
            &case.runtime.managed.name,
            None::<bollard::network::InspectNetworkOptions<String>>,
        )
        .await
        .unwrap();
    // The engine gives the bridge the subnet's first address.
    let subnet: ipnet::Ipv4Net = managed
        .ipam
        .and_then(|i| i.config)
        .and_then(|c| c.into_iter().find_map(|c| c.subnet))
        .expect("the managed network's subnet")
        .parse()
        .unwrap();
    let gateway = std::net::Ipv4Addr::from(u32::from(subnet.network()) + 1);
    let mut blocked: Vec<String> = host_addresses()
        .iter()
        .map(|a| format!("{a}:{port}"))
        .collect();
    blocked.push(format!("{gateway}:{port}"));
    blocked.push(format!("{METADATA_ADDRESS}:{INTERNET_PORT}"));
    let allowed = format!("{}:{INTERNET_PORT}", internet.address);
    let r = format!("{OUTBOX_MOUNT}/result.txt");
    let probes: Vec<String> = blocked
        .iter()
        .chain([&allowed])
        .map(|t| {
            let (h, p) = t.rsplit_once(':').unwrap();
            format!("(if nc -w 3 {h} {p} -e true </dev/null; then echo \"{t}=open\"; else echo \"{t}=closed\"; fi >> {r}) &")
        })
        .collect();
    let body = format!("{}\nwait\n", probes.join("\n"));
    std::fs::write(
        case.dir.run().join("launch.sh"),
        format!(
            "exec >{OUTBOX_MOUNT}/progress/stdout.log 2>{OUTBOX_MOUNT}/progress/stderr.log\n{body}"
        ),
    )
    .unwrap();
    let mut spec = case.spec();
    spec.network = mode;
    let handle = case.run(&spec).await;
    assert_eq!(
        case.wait_exit(&handle).await,
        0,
        "stderr: {}",
        case.stderr()
    );
    (blocked, allowed, case.results())
}

/// On the gateway bridge a container reaches nothing directly, and through the worker's
/// proxy (named in its `HTTPS_PROXY`) only what the allow list names and no sandbox is denied:
/// not the host, loopback or the metadata address, even where the list names them.
#[tokio::test]
async fn gateway_containers_reach_only_what_the_proxy_allows() {
    use crate::runtime::gateway::{AllowList, Destinations};
    use crate::runtime::test_internet::{
        host_addresses, TestInternet, INTERNET_PORT, METADATA_ADDRESS,
    };
    let internet = TestInternet::new();
    let everywhere = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = everywhere.local_addr().unwrap().port();
    let mut config = DockerConfig::new(WorkerId::new("test-gateway-worker").unwrap());
    let mut allow = vec![
        format!("{}/32", internet.address),
        "localhost".to_owned(),
        "127.0.0.0/8".to_owned(),
        format!("{METADATA_ADDRESS}/32"),
    ];
    allow.extend(host_addresses().iter().map(|a| format!("{a}/32")));
    config.gateway = Some(Arc::new(
        Destinations::for_worker(
            AllowList::parse(&allow).unwrap(),
            &config.network.deny,
            &config.network.ip,
        )
        .unwrap(),
    ));
    let mut case = Case::new("").await;
    case.runtime = DockerRuntime::connect(config)
        .await
        .expect("gateway runtime");
    let allowed = format!("{}:{INTERNET_PORT}", internet.address);
    let mut targets = vec![
        format!("direct@{allowed}"),
        format!("via@{allowed}"),
        format!("via@{METADATA_ADDRESS}:{INTERNET_PORT}"),
        format!("via@localhost:{port}"),
        format!("direct@PROXYHOST:{port}"),
    ];
    for a in host_addresses() {
        targets.push(format!("direct@{a}:{port}"));
        targets.push(format!("via@{a}:{port}"));
    }
    let r = format!("{OUTBOX_MOUNT}/result.txt");
    let probes: Vec<String> = targets
        .iter()
        .map(|t| {
            let (kind, target) = t.split_once('@').unwrap();
            let target = target.replace("PROXYHOST", "$ph");
            let (h, p) = target.rsplit_once(':').unwrap();
            match kind {
                "via" => format!(
                    "(s=$(printf 'CONNECT {target} HTTP/1.1\\r\\n\\r\\n' | nc -w 3 $ph $pp | head -n 1 | cut -d ' ' -f 2); echo \"{t}=$s\" >> {r}) &"
                ),
                _ => format!(
                    "(if nc -w 3 {h} {p} -e true </dev/null; then echo \"{t}=open\"; else echo \"{t}=closed\"; fi >> {r}) &"
                ),
            }
        })
        .collect();
    let body = format!(
        "p=${{HTTPS_PROXY#http://}}; ph=${{p%:*}}; pp=${{p##*:}}\n{}\nwait\n",
        probes.join("\n")
    );
    std::fs::write(
        case.dir.run().join("launch.sh"),
        format!(
            "exec >{OUTBOX_MOUNT}/progress/stdout.log 2>{OUTBOX_MOUNT}/progress/stderr.log\n{body}"
        ),
    )
    .unwrap();
    let mut spec = case.spec();
    spec.network = NetworkMode::Gateway;
    let handle = case.run(&spec).await;
    assert_eq!(
        case.wait_exit(&handle).await,
        0,
        "stderr: {}",
        case.stderr()
    );
    let results = case.results();
    for target in &targets {
        let want = if *target == format!("via@{allowed}") {
            "200"
        } else if target.starts_with("direct@") {
            "closed"
        } else {
            "403"
        };
        assert_eq!(
            results.get(target).map(String::as_str),
            Some(want),
            "{target}: {results:?}"
        );
    }
    let events = crate::test_support::events(&case.dir);
    assert!(
        events.iter().any(|e| e["event"] == "gateway"
            && e["allowed"] == true
            && e["host"] == internet.address.to_string()),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "gateway" && e["allowed"] == false && e["host"] == "localhost"),
        "{events:?}"
    );
    case.runtime.destroy(&handle).await.unwrap();
    let gateway = case.runtime.gateway.as_ref().unwrap();
    assert!(gateway.admitted.lock().unwrap().is_empty());
}

#[tokio::test]
async fn full_network_is_refused_unless_the_worker_allows_it() {
    let case = Case::new("exit 0").await;
    let mut spec = case.spec();
    spec.network = NetworkMode::Full;
    let err = case.runtime.provision(&spec).await.expect_err("refused");
    assert!(err.to_string().contains("network_mode"), "{err}");
    assert!(case.runtime.inspect(&case.name()).await.unwrap().is_none());
}

#[tokio::test]
async fn terminate_lets_a_handler_finish_and_kills_after_the_grace_period() {
    let handles_term = format!(
        "trap 'echo term > {OUTBOX_MOUNT}/term.txt; exit 143' TERM\n\
         echo ready > {OUTBOX_MOUNT}/ready\n\
         while true; do sleep 1 & wait $!; done"
    );
    let case = Case::new(&handles_term).await;
    let handle = case.run(&case.spec()).await;
    case.wait_file("ready").await;
    let started = Instant::now();
    case.runtime
        .terminate(&handle, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a handled TERM took {:?}",
        started.elapsed()
    );
    assert_eq!(
        case.runtime.status(&handle).await.unwrap(),
        RunStatus::Exited { code: 143 }
    );
    assert_eq!(case.outbox_file("term.txt"), "term\n");

    let ignores_term = format!(
        "trap '' TERM\n\
         echo ready > {OUTBOX_MOUNT}/ready\n\
         while true; do sleep 1; done"
    );
    let case = Case::new(&ignores_term).await;
    let handle = case.run(&case.spec()).await;
    case.wait_file("ready").await;
    let grace = Duration::from_secs(3);
    let started = Instant::now();
    case.runtime.terminate(&handle, grace).await.unwrap();
    let took = started.elapsed();
    assert!(
        took >= grace,
        "killed after {took:?}, before the grace period"
    );
    assert!(
        took < grace + Duration::from_secs(STOP_MARGIN_SECS),
        "took {took:?}"
    );
    assert_eq!(
        case.runtime.status(&handle).await.unwrap(),
        RunStatus::Exited { code: 137 }
    );
}

#[tokio::test]
async fn destroy_removes_a_running_container_and_proves_it_gone() {
    let case = Case::new(&format!(
        "echo ready > {OUTBOX_MOUNT}/ready\nwhile true; do sleep 1; done"
    ))
    .await;
    let handle = case.run(&case.spec()).await;
    case.wait_file("ready").await;
    assert_eq!(
        case.runtime.status(&handle).await.unwrap(),
        RunStatus::Running
    );
    // Listed among the worker's containers (the soak's leak count) until destroyed.
    let name = case
        .runtime
        .inspect(&handle.id)
        .await
        .unwrap()
        .and_then(|c| c.name);
    let name = name.expect("a name").trim_start_matches('/').to_owned();
    assert!(case.runtime.sandboxes().await.unwrap().contains(&name));

    let report = case.runtime.destroy(&handle).await.unwrap();
    assert_eq!(report.sandbox, format!("docker:{}", handle.id));
    assert!(!report.populated);
    assert!(report.observed_at_ms > 0);
    assert!(report.detail.contains("was running"), "{}", report.detail);
    assert!(
        report.detail.contains("removed with force"),
        "{}",
        report.detail
    );
    assert!(case.runtime.inspect(&handle.id).await.unwrap().is_none());
    assert!(!case.runtime.sandboxes().await.unwrap().contains(&name));
    assert_eq!(
        case.runtime.status(&handle).await.unwrap(),
        RunStatus::Vanished
    );

    // Idempotent: a second destroy (a worker that crashed mid-destroy) still reports.
    let again = case.runtime.destroy(&handle).await.unwrap();
    assert!(!again.populated);
    assert!(again.detail.contains("already removed"), "{}", again.detail);
}

#[tokio::test]
async fn a_container_removed_from_outside_is_vanished() {
    let case = Case::new("while true; do sleep 1; done").await;
    let handle = case.run(&case.spec()).await;
    case.runtime
        .docker
        .remove_container(
            &handle.id,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .unwrap();
    assert_eq!(
        case.runtime.status(&handle).await.unwrap(),
        RunStatus::Vanished
    );
    // Nothing is left to stop.
    case.runtime
        .terminate(&handle, Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_restarted_worker_adopts_the_container_and_starts_nothing_twice() {
    let body = format!(
        "echo started >> {OUTBOX_MOUNT}/starts\n\
         echo ready > {OUTBOX_MOUNT}/ready\n\
         while true; do sleep 1 & wait $!; done"
    );
    let case = Case::new(&body).await;
    let spec = case.spec();
    let handle = case.run(&spec).await;
    case.wait_file("ready").await;

    // The worker's next life: a fresh connection, nothing but the task id and attempt.
    let reborn = runtime().await;
    let adopted = reborn
        .adopt(case.task, case.attempt, &case.dir)
        .await
        .unwrap();
    assert_eq!(adopted.as_ref(), Some(&handle));
    assert_eq!(
        reborn
            .adopt(case.task, case.attempt + 1, &case.dir)
            .await
            .unwrap(),
        None
    );

    // Replaying provision and start finds the same container and leaves it running once.
    assert_eq!(reborn.provision(&spec).await.unwrap(), handle);
    reborn.start(&handle, &spec).await.unwrap();
    assert_eq!(reborn.status(&handle).await.unwrap(), RunStatus::Running);
    assert_eq!(case.outbox_file("starts"), "started\n");

    // Once it exited, a replayed start must not run the provider again.
    reborn
        .terminate(&handle, Duration::from_secs(5))
        .await
        .unwrap();
    let exited = reborn.status(&handle).await.unwrap();
    assert!(matches!(exited, RunStatus::Exited { .. }), "{exited:?}");
    reborn.start(&handle, &spec).await.unwrap();
    assert_eq!(reborn.status(&handle).await.unwrap(), exited);
    assert_eq!(case.outbox_file("starts"), "started\n");

    let line = reborn.break_glass(&handle).await;
    assert!(
        line.contains(&format!("docker exec -it {} sh", handle.id)),
        "{line}"
    );
}

#[tokio::test]
async fn provision_rejects_a_bad_spec_naming_the_field() {
    let case = Case::new("exit 0").await;

    let mut spec = case.spec();
    spec.argv.clear();
    let err = case.runtime.provision(&spec).await.unwrap_err().to_string();
    assert!(err.contains("launch.argv"), "{err}");

    let mut spec = case.spec();
    spec.workdir = "relative".to_string();
    let err = case.runtime.provision(&spec).await.unwrap_err().to_string();
    assert!(err.contains("launch.workdir"), "{err}");

    let mut spec = case.spec();
    spec.global_dir = Some(PathBuf::from("/nonexistent/squadron-global"));
    let err = case.runtime.provision(&spec).await.unwrap_err().to_string();
    assert!(
        err.contains("global_dir") && err.contains("/nonexistent/squadron-global"),
        "{err}"
    );

    let mut spec = case.spec();
    spec.task = TaskId::new(case.task.get() + 1_000_000_000).unwrap();
    let err = case.runtime.provision(&spec).await.unwrap_err().to_string();
    assert!(err.contains("launch.task"), "{err}");

    let process = SandboxHandle {
        runtime: RuntimeKind::Process,
        id: "/sys/fs/cgroup/x".to_string(),
    };
    let err = case.runtime.status(&process).await.unwrap_err().to_string();
    assert!(err.contains("sandbox.runtime"), "{err}");
    assert!(case.runtime.inspect(&case.name()).await.unwrap().is_none());
}

#[tokio::test]
async fn hardened_container_runs_as_the_owner_of_the_task_directory() {
    let r = format!("{OUTBOX_MOUNT}/result.txt");
    let body = format!(
        r#"
echo "uid=$(id -u)" >> {r}
echo "gid=$(id -g)" >> {r}
(echo hello > {INBOX_MOUNT}/in.txt) 2>/dev/null && echo inbox=ok >> {r} || echo inbox=denied >> {r}
"#
    );
    let case = Case::new(&body).await;
    // As root, hand the task directory to an ordinary user as a non-root worker would own it;
    // otherwise it already belongs to the (non-root) user running the tests.
    let (uid, gid) = (1000, 1000);
    for entry in [
        case.dir.root().to_path_buf(),
        case.dir.inbox(),
        case.dir.outbox(),
        case.dir.progress(),
        case.dir.artifacts(),
    ] {
        match std::os::unix::fs::chown(&entry, Some(uid), Some(gid)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
            Err(e) => panic!("chown {}: {e}", entry.display()),
        }
    }
    let owner = std::fs::metadata(case.dir.inbox()).unwrap();
    let handle = case.run(&case.spec()).await;
    assert_eq!(
        case.wait_exit(&handle).await,
        0,
        "stderr: {}",
        case.stderr()
    );
    let results = case.results();
    assert_eq!(results["uid"], owner.uid().to_string());
    assert_eq!(results["gid"], owner.gid().to_string());
    assert_eq!(results["inbox"], "ok", "{results:?}");
    let written = std::fs::metadata(case.dir.inbox().join("in.txt")).unwrap();
    assert_eq!(written.uid(), owner.uid());
}

/// A root worker's hardened container runs as the sandbox user, which owns the outbox,
/// shares the inbox and cannot read a root-only file in a mounted directory.
#[tokio::test]
async fn hardened_container_of_a_root_worker_runs_as_the_sandbox_user() {
    let r = format!("{OUTBOX_MOUNT}/result.txt");
    let body = format!(
        r#"
echo "uid=$(id -u)" >> {r}
(echo hello > {INBOX_MOUNT}/in.txt) 2>/dev/null && echo inbox=ok >> {r} || echo inbox=denied >> {r}
(cat {GLOBAL_MOUNT}/root-only >/dev/null) 2>/dev/null && echo secret=read >> {r} || echo secret=denied >> {r}
"#
    );
    let case = Case::new(&body).await;
    let inbox_owner = std::fs::metadata(case.dir.inbox()).unwrap().uid();
    if inbox_owner != 0 {
        // Not a root worker: the container runs as the owner (the test above).
        return;
    }
    let secret = case.dir.root().join("root-only");
    std::fs::write(&secret, "root only\n").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut spec = case.spec();
    spec.global_dir = Some(case.dir.root().to_path_buf());
    let handle = case.run(&spec).await;
    assert_eq!(
        case.wait_exit(&handle).await,
        0,
        "stderr: {}",
        case.stderr()
    );
    let results = case.results();
    assert_eq!(
        results["uid"],
        crate::runtime::sandbox_user::SANDBOX_UID_DEFAULT.to_string()
    );
    assert_eq!(results["inbox"], "ok", "{results:?}");
    assert_eq!(results["secret"], "denied", "{results:?}");
    let config = case.inspect(&handle).await.config.unwrap();
    assert_eq!(config.user.as_deref(), Some("65534:65534"));
}

/// Container names must stay what an earlier build of the worker named them: the hash is
/// 64-bit FNV-1a, checked against its published test vectors.
#[test]
fn the_container_name_hash_is_fnv1a() {
    assert_eq!(crate::runtime::fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(crate::runtime::fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(crate::runtime::fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
}
