//! A test-made "internet" for sandbox network tests: a namespace reached through the host,
//! with a listener, and the metadata address served inside it. One at a time per test
//! process (they share the host route of the metadata address): `TestInternet::new` waits
//! for the previous one to be dropped.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The port the "internet" listener uses inside its namespace.
pub(crate) const INTERNET_PORT: u16 = 8080;
/// The metadata-style address, served inside the test namespace.
pub(crate) const METADATA_ADDRESS: &str = "169.254.169.254";
pub(crate) const CONNECT_TIMEOUT_S: u32 = 3;

/// Tries every `host:port` argument at once (GATEWAY is the default route's address) and
/// prints `target open|closed`, one per line.
pub(crate) const PROBE_PY: &str = r#"
import socket, struct, sys, threading
def gateway():
    for line in open('/proc/net/route').read().splitlines()[1:]:
        f = line.split()
        if f[1] == '00000000':
            return socket.inet_ntoa(struct.pack('<L', int(f[2], 16)))
    return '0.0.0.0'
results = {}
def probe(target):
    host, port = target.rsplit(':', 1)
    if host == 'GATEWAY':
        host = gateway()
    try:
        socket.create_connection((host, int(port)), timeout=TIMEOUT).close()
        results[target] = 'open'
    except Exception:
        results[target] = 'closed'
threads = [threading.Thread(target=probe, args=(t,)) for t in sys.argv[1:]]
for t in threads: t.start()
for t in threads: t.join()
for t in sys.argv[1:]: print(t, results[t])
"#;

/// A network namespace standing in for the internet: a veth pair to the host, addressed
/// 100.100.K.0/30, with a listener on every address of it and the metadata address on its
/// loopback (routed there from the host). Removed on drop.
pub(crate) struct TestInternet {
    pub(crate) netns: String,
    host_if: String,
    pub(crate) address: Ipv4Addr,
    /// The host's end of the pair.
    pub(crate) host: Ipv4Addr,
    listener: Child,
}

/// The internet, held for one test.
pub(crate) struct InternetGuard {
    internet: Option<TestInternet>,
    _turn: MutexGuard<'static, ()>,
}

impl std::ops::Deref for InternetGuard {
    type Target = TestInternet;
    fn deref(&self) -> &TestInternet {
        self.internet.as_ref().expect("present until drop")
    }
}

impl Drop for InternetGuard {
    fn drop(&mut self) {
        // Torn down before the next test may make its own.
        self.internet.take();
    }
}

impl TestInternet {
    #[allow(clippy::new_ret_no_self)]
    pub(crate) fn new() -> InternetGuard {
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        InternetGuard {
            internet: Some(TestInternet::make()),
            _turn: turn,
        }
    }

    fn make() -> TestInternet {
        let pid = std::process::id();
        let _nets = lock_test_nets();
        // 100.100.0-199: the model servers' nets take 200-249.
        let k = free_test_subnet(0..200, pid);
        let netns = format!("sqt-{pid}");
        let host_if = format!("sqt{:04x}", pid % 0x10000);
        let (host, address) = (Ipv4Addr::new(100, 100, k, 1), Ipv4Addr::new(100, 100, k, 2));
        // A run killed before its drop left these.
        let _ = ip_quiet(&["netns", "del", &netns]);
        let _ = ip_quiet(&["link", "del", &host_if]);
        for args in [
            vec!["netns", "add", &netns],
            vec![
                "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &netns,
            ],
        ] {
            assert!(ip(&args), "ip {args:?}");
        }
        let host_cidr = format!("{host}/30");
        let addr_cidr = format!("{address}/30");
        let metadata = format!("{METADATA_ADDRESS}/32");
        let host_s = host.to_string();
        let address_s = address.to_string();
        for args in [
            vec!["addr", "add", &host_cidr, "dev", &host_if],
            vec!["link", "set", &host_if, "up"],
            vec!["-n", &netns, "link", "set", "lo", "up"],
            vec!["-n", &netns, "addr", "add", &addr_cidr, "dev", "eth0"],
            vec!["-n", &netns, "addr", "add", &metadata, "dev", "lo"],
            vec!["-n", &netns, "link", "set", "eth0", "up"],
            vec!["-n", &netns, "route", "add", "default", "via", &host_s],
            vec!["route", "replace", &metadata, "via", &address_s],
        ] {
            assert!(ip(&args), "ip {args:?}");
        }
        let server = format!(
            "import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, \
             socket.SO_REUSEADDR, 1)\ns.bind(('0.0.0.0', {INTERNET_PORT}))\ns.listen(64)\n\
             while True:\n    c, _ = s.accept()\n    c.close()\n"
        );
        let listener = Command::new("ip")
            .args(["netns", "exec", &netns, "python3", "-c", &server])
            .stdin(Stdio::null())
            .spawn()
            .expect("listener in the test namespace");
        let net = TestInternet {
            netns,
            host_if,
            address,
            host,
            listener,
        };
        // The host reaches both (its own traffic is not filtered): wait for the listener.
        let deadline = Instant::now() + Duration::from_secs(20);
        for target in [net.address.to_string(), METADATA_ADDRESS.to_owned()] {
            let addr: SocketAddr = format!("{target}:{INTERNET_PORT}").parse().unwrap();
            while TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "test listener {addr} never came up"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        net
    }
}

impl TestInternet {
    /// Whether a TCP connection from inside the test internet to `target` opens.
    pub(crate) fn connects(&self, target: &str) -> bool {
        let (host, port) = target.rsplit_once(':').expect("host:port");
        let script = format!(
            "import socket\nsocket.create_connection(('{host}', {port}), \
             timeout={CONNECT_TIMEOUT_S}).close()\n"
        );
        Command::new("ip")
            .args(["netns", "exec", &self.netns, "python3", "-c", &script])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for TestInternet {
    fn drop(&mut self) {
        let _ = self.listener.kill();
        let _ = self.listener.wait();
        let _ = ip(&["route", "del", &format!("{METADATA_ADDRESS}/32")]);
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.netns]);
    }
}

fn ip_quiet(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// The host's own IPv4 addresses other than loopback and the sandboxes' and test's veths.
pub(crate) fn host_addresses() -> Vec<Ipv4Addr> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .expect("ip addr");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let dev = words.nth(1)?;
            let cidr = words.skip_while(|w| *w != "inet").nth(1)?;
            let addr: Ipv4Addr = cidr.split('/').next()?.parse().ok()?;
            (!addr.is_loopback() && !dev.starts_with("sqh") && !dev.starts_with("sqt"))
                .then_some(addr)
        })
        .collect()
}

/// Test binaries run side by side (`scripts/run-tests.py`), and the worker's unit tests and
/// the integration tests' model servers both make 100.100.K.0/30 networks on the host: a
/// subnet is chosen, and its address added, under this lock, and only one no interface holds.
/// The same lock and choice as `tests/model_server/mod.rs`: the test code of two crates cannot share a
/// module (the worker's is `cfg(test)`).
const TEST_NETS_LOCK: &str = "/tmp/squadron-test-nets.lock";

/// Holds [`TEST_NETS_LOCK`] until dropped.
fn lock_test_nets() -> std::fs::File {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(TEST_NETS_LOCK)
        .expect("the test networks' lock file");
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .expect("lock the test networks");
    file
}

/// The first K of `range`, from `start` on, whose 100.100.K.1 no interface of the host holds.
fn free_test_subnet(range: std::ops::Range<u32>, start: u32) -> u8 {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .expect("ip addr show");
    let used = String::from_utf8_lossy(&out.stdout);
    let span = range.end - range.start;
    (0..span)
        .map(|i| range.start + (start.wrapping_add(i)) % span)
        .find(|k| !used.contains(&format!(" 100.100.{k}.1/")))
        .and_then(|k| u8::try_from(k).ok())
        .expect("a free test subnet")
}
