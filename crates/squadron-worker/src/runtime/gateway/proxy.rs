//! The worker-side HTTP CONNECT proxy of `gateway` sandboxes: their only way out. It listens
//! on an address only sandboxes reach (a process sandbox's host end, the gateway bridge's
//! address), knows each client by its source address, and for each CONNECT:
//!
//! - refuses every method but CONNECT (405: plain HTTP would need the proxy to read and
//!   forward requests; HTTPS, git and npm all tunnel);
//! - refuses a host the worker's allow list does not name (403);
//! - resolves the name itself and refuses it when every address is one no sandbox may reach
//!   (the host's own addresses, loopback, link-local and metadata, sandbox ranges, the deny
//!   list with the control endpoints) — an allowed name that resolves to the control plane
//!   is still refused (403);
//! - connects, answers 200, and relays bytes both ways until either side closes;
//! - appends one `gateway` event per request to the client task's `events.jsonl` (host,
//!   port, address, verdict, reason) and a `gateway_closed` event with the bytes each way.
//!
//! Limits: the request head (`HEAD_BYTES_MAX`, `HEAD_TIMEOUT_MS`), the connect
//! (`CONNECT_TIMEOUT_MS`), and connections at once per client (`CONNECTIONS_PER_CLIENT_MAX`).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ipnet::Ipv4Net;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::allow_list::AllowList;
use crate::error::WorkerError;
use crate::task::output_counter::append_event;
use crate::task::task_dir::TaskDir;

/// Longest request head read (request line and headers).
pub(crate) const HEAD_BYTES_MAX: usize = 8 * 1024;
/// How long a client may take to send its request head.
pub(crate) const HEAD_TIMEOUT_MS: u64 = 10_000;
/// How long resolving the host and connecting to it may take.
pub(crate) const CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Tunnels one sandbox may hold open at once; the next is answered 429.
pub(crate) const CONNECTIONS_PER_CLIENT_MAX: usize = 64;
/// The port the proxy listens on, on every address it serves.
pub(crate) const GATEWAY_PORT: u16 = 3128;
/// How long a connection from an address not admitted yet waits for its admission: a
/// container runs the moment the engine starts it, a little before the runtime has read its
/// address and admitted it.
pub(crate) const ADMISSION_WAIT_MS: u64 = 5_000;
/// Connections waiting for their admission at once; beyond, they are closed at once.
pub(crate) const ADMISSION_WAITERS_MAX: usize = 256;

/// What a sandbox may reach through the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Destinations {
    pub(crate) allow: AllowList,
    /// Never reached, whatever the allow list says: the always-denied ranges, the host's
    /// own addresses, the deny list (with the control endpoints).
    pub(crate) deny: Vec<Ipv4Net>,
}

impl Destinations {
    pub(crate) fn permits(&self, ip: Ipv4Addr) -> bool {
        !self.deny.iter().any(|n| n.contains(&ip))
    }
}

/// One client the proxy serves: where its events go, and its share of connections.
#[derive(Debug, Clone)]
struct Client {
    dir: TaskDir,
    slots: Arc<Semaphore>,
}

/// A running proxy; dropping it (or `stop`) closes the listener and every tunnel.
#[derive(Debug)]
pub(crate) struct GatewayProxy {
    addr: SocketAddr,
    clients: Arc<Mutex<HashMap<Ipv4Addr, Client>>>,
    stop: CancellationToken,
}

impl GatewayProxy {
    /// Binds `addr` and serves until stopped.
    pub(crate) async fn start(
        addr: SocketAddr,
        destinations: Arc<Destinations>,
    ) -> Result<GatewayProxy, WorkerError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| WorkerError::runtime("gateway", format!("bind {addr}: {e}")))?;
        let addr = listener.local_addr().unwrap_or(addr);
        let proxy = GatewayProxy {
            addr,
            clients: Arc::default(),
            stop: CancellationToken::new(),
        };
        tokio::spawn(serve(
            listener,
            proxy.clients.clone(),
            destinations,
            proxy.stop.clone(),
        ));
        tracing::debug!(%addr, "gateway proxy listening");
        Ok(proxy)
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections from `source` are the task's; its events go to its `events.jsonl`.
    pub(crate) fn admit(&self, source: Ipv4Addr, dir: TaskDir) {
        let client = Client {
            dir,
            slots: Arc::new(Semaphore::new(CONNECTIONS_PER_CLIENT_MAX)),
        };
        self.lock().insert(source, client);
    }

    /// Connections from `source` are refused from now on (open tunnels end with the
    /// sandbox's network).
    pub(crate) fn forget(&self, source: Ipv4Addr) {
        self.lock().remove(&source);
    }

    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Ipv4Addr, Client>> {
        self.clients.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for GatewayProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve(
    listener: TcpListener,
    clients: Arc<Mutex<HashMap<Ipv4Addr, Client>>>,
    destinations: Arc<Destinations>,
    stop: CancellationToken,
) {
    let waiters = Arc::new(Semaphore::new(ADMISSION_WAITERS_MAX));
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "gateway proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let IpAddr::V4(source) = peer.ip() else {
            continue;
        };
        let Ok(waiter) = waiters.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "gateway proxy: too many connections awaiting admission");
            continue;
        };
        let (clients, destinations, stop) = (clients.clone(), destinations.clone(), stop.clone());
        tokio::spawn(async move {
            // Only sandboxes this proxy serves reach its address; anything else is dropped.
            let Some(client) = admitted(&clients, source).await else {
                tracing::warn!(%peer, "gateway proxy: a connection from no known sandbox, closed");
                return;
            };
            drop(waiter);
            tokio::select! {
                () = stop.cancelled() => {}
                () = tunnel(stream, client, &destinations) => {}
            }
        });
    }
}

/// The client `source` is, waiting up to `ADMISSION_WAIT_MS` for its admission.
async fn admitted(clients: &Mutex<HashMap<Ipv4Addr, Client>>, source: Ipv4Addr) -> Option<Client> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(ADMISSION_WAIT_MS);
    loop {
        let found = clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&source)
            .cloned();
        if found.is_some() || tokio::time::Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The parsed request: `host:port` of a CONNECT, and any bytes the client sent after the head.
#[derive(Debug, PartialEq, Eq)]
struct Connect {
    host: String,
    port: u16,
    rest: Vec<u8>,
}

/// Why a request is answered with an error, with its status.
#[derive(Debug, PartialEq, Eq)]
struct Refusal {
    status: u16,
    reason: String,
}

impl Refusal {
    fn new(status: u16, reason: impl Into<String>) -> Refusal {
        Refusal {
            status,
            reason: reason.into(),
        }
    }
}

async fn tunnel(mut stream: TcpStream, client: Client, destinations: &Destinations) {
    let Ok(_slot) = client.slots.clone().try_acquire_owned() else {
        let refusal = Refusal::new(
            429,
            format!("more than {CONNECTIONS_PER_CLIENT_MAX} connections at once"),
        );
        refuse(&mut stream, &client, None, &refusal).await;
        return;
    };
    let head = tokio::time::timeout(
        Duration::from_millis(HEAD_TIMEOUT_MS),
        read_head(&mut stream),
    )
    .await
    .unwrap_or_else(|_| Err(Refusal::new(408, "no request head in time")));
    let connect = match head.and_then(|h| parse_connect(&h)) {
        Ok(c) => c,
        Err(refusal) => return refuse(&mut stream, &client, None, &refusal).await,
    };
    let upstream = match open(&connect, destinations).await {
        Ok(u) => u,
        Err(refusal) => return refuse(&mut stream, &client, Some(&connect), &refusal).await,
    };
    let address = upstream.peer_addr().map(|a| a.to_string()).ok();
    event(
        &client,
        json!({"event": "gateway", "host": connect.host, "port": connect.port,
               "address": address, "allowed": true}),
    );
    let (up, down) = relay(stream, upstream, &connect.rest).await;
    event(
        &client,
        json!({"event": "gateway_closed", "host": connect.host, "port": connect.port,
               "bytes_up": up, "bytes_down": down}),
    );
}

/// Reads up to the end of the head (`\r\n\r\n`); what follows is kept for the tunnel.
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, Refusal> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| Refusal::new(400, format!("reading the request: {e}")))?;
        if n == 0 {
            return Err(Refusal::new(400, "the request ended before its head did"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if memchr::memmem::find(&buf, b"\r\n\r\n").is_some() {
            return Ok(buf);
        }
        if buf.len() > HEAD_BYTES_MAX {
            return Err(Refusal::new(
                431,
                format!("request head over {HEAD_BYTES_MAX} bytes"),
            ));
        }
    }
}

fn parse_connect(buf: &[u8]) -> Result<Connect, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    let len = match request.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len <= HEAD_BYTES_MAX => len,
        Ok(httparse::Status::Complete(_)) => {
            return Err(Refusal::new(
                431,
                format!("request head over {HEAD_BYTES_MAX} bytes"),
            ))
        }
        Ok(httparse::Status::Partial) => return Err(Refusal::new(400, "incomplete request")),
        Err(e) => return Err(Refusal::new(400, format!("malformed request: {e}"))),
    };
    if request.method != Some("CONNECT") {
        return Err(Refusal::new(
            405,
            format!(
                "{} is not served: the gateway tunnels CONNECT only (use https)",
                request.method.unwrap_or("?")
            ),
        ));
    }
    let target = request.path.unwrap_or_default();
    let (host, port) = target
        .rsplit_once(':')
        .ok_or_else(|| Refusal::new(400, format!("CONNECT target {target:?} is not host:port")))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| Refusal::new(400, format!("CONNECT target {target:?}: bad port")))?;
    if host.starts_with('[') {
        return Err(Refusal::new(403, "IPv6 destinations are not served"));
    }
    Ok(Connect {
        host: host.to_ascii_lowercase(),
        port,
        rest: buf[len..].to_vec(),
    })
}

/// Checks the host against the allow list, resolves it, and connects to the first address
/// a sandbox may reach.
async fn open(connect: &Connect, destinations: &Destinations) -> Result<TcpStream, Refusal> {
    if !destinations.allow.allows(&connect.host) {
        return Err(Refusal::new(
            403,
            "not in the worker's gateway allow list (--gateway-allow)",
        ));
    }
    let deadline = Duration::from_millis(CONNECT_TIMEOUT_MS);
    let resolved = tokio::time::timeout(
        deadline,
        tokio::net::lookup_host((connect.host.as_str(), connect.port)),
    )
    .await
    .map_err(|_| Refusal::new(504, "resolving the host timed out"))?
    .map_err(|e| Refusal::new(502, format!("resolving the host: {e}")))?;
    let addresses: Vec<SocketAddr> = resolved
        .filter(|a| matches!(a.ip(), IpAddr::V4(ip) if destinations.permits(ip)))
        .collect();
    if addresses.is_empty() {
        return Err(Refusal::new(
            403,
            "the host resolves only to addresses no sandbox may reach",
        ));
    }
    let mut last = String::new();
    for address in addresses {
        match tokio::time::timeout(deadline, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => last = format!("{address}: {e}"),
            Err(_) => last = format!("{address}: timed out"),
        }
    }
    Err(Refusal::new(502, format!("connecting failed ({last})")))
}

/// Answers 200, then copies both ways; returns the bytes sent up and down.
async fn relay(mut client: TcpStream, mut upstream: TcpStream, early: &[u8]) -> (u64, u64) {
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return (0, 0);
    }
    if !early.is_empty() && upstream.write_all(early).await.is_err() {
        return (0, 0);
    }
    match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        Ok((up, down)) => (up + early.len() as u64, down),
        Err(_) => (early.len() as u64, 0),
    }
}

async fn refuse(
    stream: &mut TcpStream,
    client: &Client,
    connect: Option<&Connect>,
    refusal: &Refusal,
) {
    let mut e = json!({"event": "gateway", "allowed": false, "status": refusal.status,
                       "reason": refusal.reason});
    if let Some(c) = connect {
        e["host"] = json!(c.host);
        e["port"] = json!(c.port);
    }
    event(client, e);
    let answer = format!(
        "HTTP/1.1 {} Refused\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{}\n",
        refusal.status,
        refusal.reason.len() + 1,
        refusal.reason
    );
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}

fn event(client: &Client, event: Value) {
    if let Err(e) = append_event(&client.dir, &event) {
        tracing::warn!(task = client.dir.task().get(), error = %e, "gateway event not written");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_parses_with_the_bytes_after_it() {
        let c = parse_connect(b"CONNECT Api.Example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n\x16\x03")
            .unwrap();
        assert_eq!(
            c,
            Connect {
                host: "api.example.com".into(),
                port: 443,
                rest: b"\x16\x03".to_vec()
            }
        );
    }

    #[test]
    fn everything_else_is_refused_with_its_status() {
        let status = |b: &[u8]| parse_connect(b).unwrap_err().status;
        assert_eq!(status(b"GET http://x.com/ HTTP/1.1\r\n\r\n"), 405);
        assert_eq!(status(b"CONNECT x.com HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status(b"CONNECT x.com:0 HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status(b"CONNECT x.com:99999 HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status(b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n"), 403);
        assert_eq!(status(b"\x00\x01garbage\r\n\r\n"), 400);
    }

    fn destinations(allow: &[&str], deny: &[&str]) -> Destinations {
        Destinations {
            allow: AllowList::parse(&allow.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .unwrap(),
            deny: deny.iter().map(|d| d.parse().unwrap()).collect(),
        }
    }

    #[tokio::test]
    async fn an_allowed_name_that_resolves_to_a_denied_address_is_refused() {
        let d = destinations(&["localhost", "127.0.0.0/8"], &["127.0.0.0/8"]);
        for host in ["localhost", "127.0.0.1"] {
            let c = Connect {
                host: host.into(),
                port: 9,
                rest: Vec::new(),
            };
            let r = open(&c, &d).await.unwrap_err();
            assert_eq!(r.status, 403, "{host}: {r:?}");
            assert!(r.reason.contains("no sandbox may reach"), "{r:?}");
        }
        let c = Connect {
            host: "example.com".into(),
            port: 443,
            rest: Vec::new(),
        };
        assert!(open(&c, &d)
            .await
            .unwrap_err()
            .reason
            .contains("allow list"));
    }

    /// A connection that arrives before its sandbox is admitted (a container runs the moment
    /// the engine starts it) waits for the admission and is served.
    #[tokio::test]
    async fn a_connection_ahead_of_its_admission_is_served_once_admitted() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tmp = tempfile::tempdir().unwrap();
        let dir = TaskDir::new(tmp.path(), squadron_core::ids::TaskId::new(7).unwrap());
        std::fs::create_dir_all(dir.progress()).unwrap();
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = upstream.local_addr().unwrap();
        let proxy = GatewayProxy::start(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(destinations(&["127.0.0.0/8"], &[])),
        )
        .await
        .unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        client
            .write_all(format!("CONNECT {target} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        proxy.admit(Ipv4Addr::LOCALHOST, dir.clone());
        let (mut served, _) = upstream.accept().await.unwrap();
        served.write_all(b"pong").await.unwrap();
        drop(served);
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        assert!(answer.ends_with("pong"), "{answer:?}");
        let events = crate::test_support::events(&dir);
        assert_eq!(events[0]["event"], "gateway", "{events:?}");
        assert_eq!(events[0]["allowed"], true, "{events:?}");
        proxy.stop();
    }
}
