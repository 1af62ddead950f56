//! A stand-in for an upstream API (Anthropic's, say) in a network namespace this test makes:
//! a TLS server, its certificate from a CA of the test's own, that records the head of every
//! request it gets (one JSON line each) and answers in two streamed pieces (with the key it
//! got, when the path asks for an echo; gzipped, when it asks for gzip).

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use squadron_pki::{CertUse, ClusterCa, SpiffeId, SubjectName};

/// The upstream's port in its namespace.
pub const UPSTREAM_PORT: u16 = 8443;
/// Upstreams one test process runs, at most (each a /30 of its /24).
const UPSTREAMS_PER_PROCESS_MAX: u8 = 64;

const SERVER: &str = r#"
import json, ssl, sys, http.server
cert, key, record, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        with open(record, "a") as f:
            f.write(json.dumps({"path": self.path, "headers": dict(self.headers.items()), "body": body.decode()}) + "\n")
        # "/echo" in the path: the key it got comes back, in a header and split across two
        # pieces of the body, as an upstream quoting a bad key would.
        key = self.headers.get("x-api-key", "").encode()
        echo = b"echo" in self.path.encode()
        if b"gzip" in self.path.encode():
            # Compressed whatever the request asked: the proxy must not relay it.
            import gzip
            body = gzip.compress(b"got " + key)
            self.send_response(200)
            self.send_header("content-encoding", "gzip")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        if echo:
            self.send_header("x-echo", key.decode())
        self.end_headers()
        pieces = [b"data: one\n\n", b"data: two\n\n"]
        if echo:
            half = len(key) // 2
            pieces = [b"data: got " + key[:half], key[half:] + b" ok\n\n"]
        for piece in pieces:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("0.0.0.0", port), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain(cert, key)
s.socket = c.wrap_socket(s.socket, server_side=True)
s.serve_forever()
"#;

pub struct Upstream {
    netns: String,
    host_if: String,
    pub address: Ipv4Addr,
    /// The test CA's certificate: the worker's `--egress-ca`.
    pub ca: PathBuf,
    record: PathBuf,
    server: Child,
}

fn ip(args: &[&str]) {
    let ok = Command::new("ip")
        .args(args)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "ip {args:?}");
}

fn quiet(args: &[&str]) -> std::io::Result<std::process::ExitStatus> {
    Command::new("ip").args(args).stderr(Stdio::null()).status()
}

impl Upstream {
    /// The namespace `sqe-{pid}-{n}` (the process's `n`th upstream: tests of one file run at
    /// once), reached from the host over a veth pair addressed 100.101.K.4n/30 (shared
    /// address space, never a private range).
    pub fn start(dir: &Path) -> Upstream {
        static STARTED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
        let n =
            STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % UPSTREAMS_PER_PROCESS_MAX;
        let pid = std::process::id();
        let k = (pid % 250) as u8;
        let netns = format!("sqe-{pid}-{n}");
        let host_if = format!("sqe{:04x}{n:02x}", pid % 0x10000);
        let (host, address) = (
            Ipv4Addr::new(100, 101, k, 4 * n + 1),
            Ipv4Addr::new(100, 101, k, 4 * n + 2),
        );
        // A run killed before its drop left these.
        let _ = quiet(&["netns", "del", &netns]);
        let _ = quiet(&["link", "del", &host_if]);
        ip(&["netns", "add", &netns]);
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &netns,
        ]);
        ip(&["addr", "add", &format!("{host}/30"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{address}/30"),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &netns, "link", "set", "eth0", "up"]);

        let (ca, _) = ClusterCa::generate("egress-upstream").expect("test CA");
        let leaf = ca
            .issue(
                &SpiffeId::Node(1),
                &[SubjectName::Ip(address.into())],
                Duration::from_secs(3600),
                CertUse::ServerAndClient,
            )
            .expect("upstream certificate");
        let (cert, key, ca_file) = (
            dir.join("up.crt"),
            dir.join("up.key"),
            dir.join("up-ca.crt"),
        );
        std::fs::write(&cert, &leaf.cert_pem).expect("write the certificate");
        std::fs::write(&key, leaf.key_pem()).expect("write the key");
        std::fs::write(&ca_file, ca.cert_pem()).expect("write the CA");
        let record = dir.join("upstream-requests.jsonl");
        let server = Command::new("ip")
            .args(["netns", "exec", &netns, "python3", "-c", SERVER])
            .args([&cert, &key, &record])
            .arg(UPSTREAM_PORT.to_string())
            .stdin(Stdio::null())
            .spawn()
            .expect("upstream in the test namespace");
        let up = Upstream {
            netns,
            host_if,
            address,
            ca: ca_file,
            record,
            server,
        };
        let addr = SocketAddr::from((address, UPSTREAM_PORT));
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err() {
            assert!(Instant::now() < deadline, "upstream {addr} never came up");
            std::thread::sleep(Duration::from_millis(50));
        }
        up
    }

    pub fn url(&self) -> String {
        format!("https://{}:{UPSTREAM_PORT}/api", self.address)
    }

    /// The requests it got, oldest first.
    pub fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}
