//! Serving HTTP (REST, gRPC, or both) over TLS, with the client's verified identity attached
//! to every request.
//!
//! One accept loop for every listener of a node or worker, so each gets the same handshake
//! bound, connection bound, `TCP_NODELAY` and graceful shutdown. The request extension
//! [`PeerCert`] carries what the client's certificate says — the only identity an
//! authorization rule may believe. A client speaking plaintext to this port fails the
//! handshake and is closed; nothing of it reaches a handler.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::peer_identity::CertFacts;

/// How long a client may take to finish the TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Open connections one listener serves at once; beyond it new ones wait in the backlog.
pub const LISTENER_CONNECTIONS_MAX: usize = 4_096;
/// How long open connections get to finish after shutdown is asked.
pub const SHUTDOWN_GRACE_MS: u64 = 5_000;

/// What the client's certificate says, or `None` for a client without one (an operator with
/// a bearer token). Present on every request served by [`serve_tls`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCert(pub Option<CertFacts>);

/// Serves `service` on `listener` until `shutdown` resolves, then lets open connections
/// finish for [`SHUTDOWN_GRACE_MS`]. Counts the connections it accepts in `accepted`: a
/// connection a client makes per request (where one per client should serve) shows as this
/// count growing with the requests.
pub async fn serve_tls<S>(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    service: S,
    shutdown: impl Future<Output = ()>,
    accepted: Arc<AtomicU64>,
) where
    S: tower_service::Service<
            http::Request<Incoming>,
            Response = http::Response<axum_core::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let acceptor = TlsAcceptor::from(config);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(LISTENER_CONNECTIONS_MAX));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let (tcp, remote) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        accepted.fetch_add(1, Ordering::Relaxed);
        // Small replies must leave at once rather than wait for a delayed ACK (~40 ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let acceptor = acceptor.clone();
        let service = service.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let handshake = tokio::time::timeout(
                Duration::from_millis(TLS_HANDSHAKE_TIMEOUT_MS),
                acceptor.accept(tcp),
            );
            let tls = match handshake.await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%remote, error = %e, "TLS handshake refused");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%remote, "TLS handshake timed out");
                    return;
                }
            };
            let peer = PeerCert(peer_facts(tls.get_ref().1));
            let service = tower_service_with_peer(service, peer);
            let builder = Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(
                TokioIo::new(tls),
                TowerToHyperService::new(service),
            );
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%remote, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_millis(SHUTDOWN_GRACE_MS)) => {}
    }
}

/// The leaf's facts; a chain the verifier accepted but whose identity does not parse counts
/// as no certificate (authorization then refuses anything that needs one).
fn peer_facts(conn: &rustls::ServerConnection) -> Option<CertFacts> {
    let leaf = conn.peer_certificates()?.first()?;
    match CertFacts::of_der(leaf) {
        Ok(facts) => Some(facts),
        Err(e) => {
            tracing::warn!(error = %e, "client certificate without a usable identity");
            None
        }
    }
}

fn tower_service_with_peer<S>(
    service: S,
    peer: PeerCert,
) -> impl tower_service::Service<
    http::Request<Incoming>,
    Response = S::Response,
    Error = S::Error,
    Future = S::Future,
> + Clone
where
    S: tower_service::Service<http::Request<Incoming>> + Clone,
{
    WithPeer {
        inner: service,
        peer,
    }
}

#[derive(Clone)]
struct WithPeer<S> {
    inner: S,
    peer: PeerCert,
}

impl<S> tower_service::Service<http::Request<Incoming>> for WithPeer<S>
where
    S: tower_service::Service<http::Request<Incoming>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.peer.clone());
        self.inner.call(request)
    }
}
