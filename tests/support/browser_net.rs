//! A network namespace of the browser's own, holding only loopback, joined to the host's
//! loopback by relays for the ports the test names.
//!
//! Chromium watches every interface of its namespace and, when one comes or goes, fails what
//! it has in flight with `ERR_NETWORK_CHANGED` — loopback requests included. The worker under
//! test makes a veth pair for every sandbox it starts and removes it after: in the host's
//! namespace, a task or takeover started while the page waits for an answer would fail that
//! answer. In a namespace of its own, Chromium sees no interface change at all.

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::process::Command;

/// A namespace `sqb-{pid}-{n}` with loopback up, removed on drop.
pub struct BrowserNet {
    pub name: String,
}

impl BrowserNet {
    pub fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("sqb-{}-{n}", std::process::id());
        let _ = ip(&["netns", "del", &name]);
        let net = BrowserNet { name };
        for args in [
            vec!["netns", "add", net.name.as_str()],
            vec!["-n", net.name.as_str(), "link", "set", "lo", "up"],
        ] {
            assert!(ip(&args), "ip {args:?}");
        }
        net
    }

    /// `program` with `args`, run inside the namespace.
    pub fn command(&self, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Connections to 127.0.0.1:`port` inside the namespace reach 127.0.0.1:`port` on the host.
    pub fn reach_host(&self, port: u16) {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let listener = self
            .in_namespace(move || TcpListener::bind(addr))
            .unwrap_or_else(|e| panic!("bind {addr} in the browser's namespace: {e}"));
        std::thread::spawn(move || {
            // An accept that fails ends the relay rather than spin on it.
            for inside in listener.incoming() {
                let Ok(inside) = inside else { break };
                if let Ok(host) = TcpStream::connect(addr) {
                    relay(inside, host);
                }
            }
        });
    }

    /// A host port whose connections reach 127.0.0.1:`port` inside the namespace.
    pub fn reach_inside(&self, port: u16) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a host port");
        let host_port = listener.local_addr().expect("address").port();
        let path = self.path();
        std::thread::spawn(move || {
            for host in listener.incoming() {
                let Ok(host) = host else { break };
                let path = path.clone();
                // Each connection from a thread of its own that enters the namespace.
                std::thread::spawn(move || {
                    let inside =
                        enter(&path).and_then(|()| TcpStream::connect(("127.0.0.1", port)));
                    if let Ok(inside) = inside {
                        relay(host, inside);
                    }
                });
            }
        });
        host_port
    }

    fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// Runs `f` on a thread that entered the namespace; a socket it makes stays there
    /// whichever thread uses it after.
    fn in_namespace<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        let path = self.path();
        std::thread::spawn(move || {
            enter(&path)?;
            f()
        })
        .join()
        .expect("namespace thread")
    }
}

impl Drop for BrowserNet {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Moves this thread (only) into the namespace at `path`.
fn enter(path: &str) -> std::io::Result<()> {
    let ns = std::fs::File::open(path)?;
    rustix::thread::move_into_link_name_space(
        ns.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )?;
    Ok(())
}

/// Copies both ways until each side has finished writing.
fn relay(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    std::thread::spawn(move || pipe(a, b2));
    std::thread::spawn(move || pipe(b, a2));
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
