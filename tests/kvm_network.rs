//! The networks of KVM guests (issue 15 item 2: the sandbox issue's network modes on the VM's
//! NIC), against real libvirt guests under software emulation and a namespace this test made
//! (the "internet"): an `outbound` guest fetches the internet's token through the worker's
//! NAT; a `gateway` guest only through the worker's proxy; neither reaches a listener on
//! every host address, at the worker's end of its link or at the host's end of the
//! internet's; each guest's address is in the sandbox range and its tap is gone
//! once its task is destroyed; `full` is refused naming the field.
//!
//! A file of its own, so its guests boot with nothing else on the machine (the end-to-end
//! KVM scenarios of `worker_tasks.rs` run five guests through two slots).

mod model_server;
mod support;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;
use std::time::Duration;

use model_server::TestNet;
use support::*;

const VM_TASK_TIMEOUT: Duration = Duration::from_secs(300);
/// The port of the "internet"'s web server, inside its namespace.
const INTERNET_PORT: u16 = 8080;

/// The internet: `model_server::TestNet`'s namespace (a veth pair to the host, 100.100.K.0/30,
/// never a private range), answering every request on `INTERNET_PORT` with its token. (The
/// guest asks with `nc`: the image's static busybox `wget` crashes in the C library's resolver
/// set-up, even for an address.)
struct Internet {
    _net: TestNet,
    /// The host's end of the pair.
    host: Ipv4Addr,
    address: Ipv4Addr,
    token: String,
}

impl Internet {
    fn new() -> Internet {
        let net = TestNet::new("kvmnet");
        let token = format!("internet-token-{}", std::process::id());
        serve_token(net.listen(INTERNET_PORT), token.clone());
        Internet {
            host: net.host(),
            address: net.address,
            _net: net,
            token,
        }
    }
}

/// Answers each connection with `token` once its request (a first read of it) came.
fn serve_token(listener: TcpListener, token: String) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let _ = write!(
                stream,
                "HTTP/1.0 200 OK\r\ncontent-length: {}\r\n\r\n{token}\n",
                token.len() + 1
            );
        }
    });
}

/// The tap of the sandbox slot `address` is in: `sqh` and the slot in hex (see
/// `squadron_isolation::sandbox_network`).
fn tap_of(address: Ipv4Addr) -> String {
    let slot = (u32::from(address) - u32::from(Ipv4Addr::new(100, 64, 0, 0))) / 4;
    format!("sqh{slot:04x}")
}

/// What one guest's task ended as: the task, its stdout and its events.
struct Run {
    task: serde_json::Value,
    stdout: String,
    events: String,
}

/// Runs `script` in a guest of `mode` to its end, which must be COMPLETED.
fn run_guest(url: &str, repo: &std::path::Path, mode: &str, script: &str) -> Run {
    let indented: String = script.lines().map(|l| format!("    {l}\n")).collect();
    let yaml = format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: kvm-{mode}\nrepository:\n  url: {repo}\n  branch: main\n\
         agent:\n  prompt: probe\n  provider: script\n  script: |\n{indented}\
         vm:\n  runtime: kvm\n  network_mode: {mode}\n  memory: 512Mi\n  disk: 256Mi\nlifecycle:\n  timeout: 240s\n",
        repo = repo.display(),
    );
    let submitted = submit_yaml(url, &yaml);
    assert!(submitted.ok(), "submission refused: {submitted:?}");
    let id = submitted.body["task_submitted"]["task"]
        .as_u64()
        .expect("a task id");
    let task = wait_task_state(url, id, &["COMPLETED", "FAILED"], VM_TASK_TIMEOUT);
    let read = |stream: &str| {
        http_text(&format!("{url}/api/v1/tasks/{id}/logs?stream={stream}"))
            .expect(stream)
            .1
    };
    let run = Run {
        task,
        stdout: read("stdout"),
        events: read("events"),
    };
    assert_eq!(
        run.task["state"], "COMPLETED",
        "{:#}\n{}\n{}",
        run.task, run.stdout, run.events
    );
    run
}

/// The guest's script lines that print `address A/30` and `probe TARGET open|closed` for
/// each `host:port` of `targets` (`GATEWAY` is the guest's default route), in parallel.
fn probes(targets: &[String]) -> String {
    format!(
        "gw=$(ip route | awk '/^default/ {{print $3}}')\n\
         echo \"address $(ip -4 -o addr show dev eth0 | awk '{{print $4}}')\"\n\
         for t in {}; do\n\
           h=${{t%:*}}; [ \"$h\" = GATEWAY ] && h=$gw\n\
           ( if nc -w 3 \"$h\" \"${{t##*:}}\" </dev/null >/dev/null 2>&1; then echo \"probe $t open\"; else echo \"probe $t closed\"; fi ) &\n\
         done\n\
         wait\n",
        targets.join(" ")
    )
}

/// The guest's address, from its `address` line: in the sandbox range.
fn guest_address(stdout: &str) -> Ipv4Addr {
    let address: Ipv4Addr = stdout
        .lines()
        .find_map(|l| l.strip_prefix("address "))
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no guest address in:\n{stdout}"));
    let sandboxes =
        u32::from(Ipv4Addr::new(100, 64, 0, 0))..u32::from(Ipv4Addr::new(100, 68, 0, 0));
    assert!(
        sandboxes.contains(&u32::from(address)),
        "{address} is not in 100.64.0.0/14"
    );
    address
}

fn assert_probed(stdout: &str, target: &str, state: &str) {
    assert!(
        stdout
            .lines()
            .any(|l| l == format!("probe {target} {state}")),
        "{target} should be {state} from the guest:\n{stdout}"
    );
}

/// Waits until the tap of the guest at `address` is gone (its task was destroyed), and
/// checks its filter table (`sq_{owner}_{slot}`) went with it.
fn assert_network_removed(address: Ipv4Addr, owner: &str) {
    let tap = tap_of(address);
    let gone = wait_until(Duration::from_secs(60), || {
        !std::path::Path::new("/sys/class/net").join(&tap).exists()
    });
    assert!(gone.is_ok(), "the guest's tap {tap} outlived its task");
    let table = format!("sq_{owner}_{}", &tap[3..]);
    let tables = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .expect("nft");
    let tables = String::from_utf8_lossy(&tables.stdout);
    assert!(
        !tables.contains(&table),
        "the guest's table {table} outlived its task:\n{tables}"
    );
}

/// An `outbound` guest fetches the internet's token through the worker's NAT and reaches no
/// listener of the host; a `gateway` guest reaches the internet only through the worker's
/// proxy (named in its `HTTPS_PROXY`, each connection an event), never directly, and no
/// listener of the host either; `full` is refused naming the field.
#[test]
fn guests_reach_the_internet_by_their_mode_and_nothing_of_the_host() {
    let internet = Internet::new();
    // On every host address: reachable from the guest only if the filter let it be.
    let host_listener = TcpListener::bind("0.0.0.0:0").expect("a host listener");
    let host_port = host_listener.local_addr().expect("port").port();
    let cluster = Cluster::start(1);
    let worker = unique_worker_id("w-kvm-net");
    let owner = squadron_isolation::sandbox_network::owner_tag(&format!("{worker}/kvm"));
    let kvm = WorkerProc::start_with(
        cluster.dir.path(),
        &worker,
        cluster.urls(),
        "kvm",
        [
            kvm_worker_args(1),
            vec!["--gateway-allow".into(), format!("{}/32", internet.address)],
        ]
        .concat(),
    );
    // The cluster's own ports listen on loopback only (the guest's loopback is its own):
    // the listener on every host address is the one a missing filter would expose.
    let targets: Vec<String> = ["GATEWAY".to_string(), internet.host.to_string()]
        .iter()
        .map(|host| format!("{host}:{host_port}"))
        .collect();
    let repo = git_repo(cluster.dir.path());
    let url = &cluster.urls()[0];
    let fetch = format!(
        "printf 'GET /token.txt HTTP/1.0\\r\\n\\r\\n' | nc -w 10 {} {INTERNET_PORT} | sed 's/^/fetched /'\n",
        internet.address
    );

    // The guest's /tmp is its scratch disk, of the manifest's `disk` (mounted over the
    // init's RAM /tmp: the last /tmp of the mount table).
    let scratch = "echo \"scratch $(awk '$2 == \"/tmp\" {m = $1 \" \" $3} END {print m}' /proc/mounts) $(df -k /tmp | awk 'NR==2 {print $2}')\"\n";
    let outbound = run_guest(
        url,
        &repo,
        "outbound",
        &(probes(&targets) + &fetch + scratch),
    );
    let line = outbound
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("scratch "))
        .unwrap_or_else(|| panic!("no scratch line:\n{}", outbound.stdout));
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.get(..2), Some(&["/dev/vda", "ext2"][..]), "{line}");
    let kib: u64 = words.get(2).and_then(|w| w.parse().ok()).expect(line);
    assert!(
        (200 * 1024..=256 * 1024).contains(&kib),
        "a 256 MiB scratch disk holds {kib} KiB"
    );
    let address = guest_address(&outbound.stdout);
    for target in &targets {
        assert_probed(&outbound.stdout, target, "closed");
    }
    assert!(
        outbound
            .stdout
            .lines()
            .any(|l| l == format!("fetched {}", internet.token)),
        "the guest did not reach the internet:\n{}\n{}",
        outbound.stdout,
        outbound.events
    );
    assert_network_removed(address, &owner);

    // Through the proxy: CONNECT, then the request once the tunnel is up.
    let via_proxy = format!(
        "echo \"proxy $HTTPS_PROXY\"\n\
         ( printf 'CONNECT {i}:{INTERNET_PORT} HTTP/1.1\\r\\nHost: {i}:{INTERNET_PORT}\\r\\n\\r\\n'; sleep 3; \
         printf 'GET /token.txt HTTP/1.0\\r\\n\\r\\n'; sleep 5 ) | nc -w 10 $gw \"${{HTTPS_PROXY##*:}}\" | sed 's/^/via /'\n",
        i = internet.address
    );
    let gateway = run_guest(
        url,
        &repo,
        "gateway",
        &(probes(&targets) + &fetch + &via_proxy),
    );
    let address = guest_address(&gateway.stdout);
    for target in &targets {
        assert_probed(&gateway.stdout, target, "closed");
    }
    let proxy = format!("http://{}:3128", tap_host_address(address));
    assert!(
        gateway
            .stdout
            .lines()
            .any(|l| l == format!("proxy {proxy}")),
        "the agent's proxy variable:\n{}",
        gateway.stdout
    );
    assert!(
        !gateway.stdout.contains("fetched"),
        "a gateway guest reached the internet directly:\n{}",
        gateway.stdout
    );
    assert!(
        gateway
            .stdout
            .lines()
            .any(|l| l == format!("via {}", internet.token)),
        "the guest did not reach the internet through its proxy:\n{}\n{}",
        gateway.stdout,
        gateway.events
    );
    assert!(
        gateway
            .events
            .lines()
            .any(|l| l.contains(r#""event":"gateway""#)
                && l.contains(r#""allowed":true"#)
                && l.contains(&internet.address.to_string())),
        "no gateway event for the connection:\n{}",
        gateway.events
    );
    assert_network_removed(address, &owner);
    // The probes work: the host listener answers where the filter is not in the way.
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", host_port)).is_ok(),
        "the host listener does not listen"
    );

    // A mode the runtime does not offer fails naming the field, before any guest is made.
    let yaml = format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: kvm-full\nrepository:\n  url: {}\n\
         agent:\n  prompt: probe\n  provider: script\n  script: \"true\"\n\
         vm:\n  runtime: kvm\n  network_mode: full\n",
        repo.display()
    );
    let refused = submit_yaml(url, &yaml);
    if refused.ok() {
        let id = refused.body["task_submitted"]["task"]
            .as_u64()
            .expect("a task id");
        let t = wait_task_state(url, id, &["COMPLETED", "FAILED"], VM_TASK_TIMEOUT);
        assert_eq!(t["state"], "FAILED", "{t:#}");
        assert!(t.to_string().contains("network_mode"), "{t:#}");
    } else {
        assert!(
            refused.body.to_string().contains("network_mode"),
            "{refused:?}"
        );
    }
    drop(host_listener);
    drop(kvm);
}

/// The host end of the /30 the guest at `address` is in.
fn tap_host_address(address: Ipv4Addr) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(address) - 1)
}
