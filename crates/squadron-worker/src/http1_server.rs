//! The small HTTP/1 servers the worker runs for sandboxes (the MCP gateway on a Unix socket,
//! egress injection's proxy on a sandbox's loopback or a VM's channel): one accept loop with a
//! cap on connections and a bound on a request head's arrival, over any kind of listener.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// A listener the loop accepts from.
pub(crate) trait Acceptor: Send + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept_one(&self) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Acceptor for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept_one(&self) -> std::io::Result<Self::Stream> {
        self.accept().await.map(|(s, _)| s)
    }
}

impl Acceptor for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept_one(&self) -> std::io::Result<Self::Stream> {
        self.accept().await.map(|(s, _)| s)
    }
}

/// Streams handed over one by one through a channel (a VM's egress streams, which arrive over
/// its agent channel, not on a listener of the worker's). Once every sender is gone it waits
/// forever: the server ends when its task is aborted, as with a listener.
#[derive(Debug)]
pub(crate) struct StreamInbox<S>(tokio::sync::Mutex<mpsc::Receiver<S>>);

impl<S> StreamInbox<S> {
    pub(crate) fn new(inbox: mpsc::Receiver<S>) -> Self {
        Self(tokio::sync::Mutex::new(inbox))
    }
}

impl<S> Acceptor for StreamInbox<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = S;
    async fn accept_one(&self) -> std::io::Result<S> {
        match self.0.lock().await.recv().await {
            Some(stream) => Ok(stream),
            None => std::future::pending().await,
        }
    }
}

/// How many connections at once, and how long a request head may take to arrive (and a
/// connection idle between requests).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Http1Limits {
    pub(crate) connections_max: usize,
    pub(crate) header_read_ms_max: u64,
}

/// Accepts until the task running it is aborted; the connections live in this task's set, so
/// the abort ends them too. `what` names the server in the log of a failed accept.
pub(crate) async fn serve<A, H, Fut, B>(listener: A, limits: Http1Limits, what: String, handler: H)
where
    A: Acceptor,
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connections = JoinSet::new();
    loop {
        if connections.len() >= limits.connections_max {
            connections.join_next().await;
            continue;
        }
        tokio::select! {
            accepted = listener.accept_one() => match accepted {
                Ok(stream) => {
                    connections.spawn(serve_connection(stream, limits, handler.clone()));
                }
                Err(e) => {
                    tracing::warn!(server = %what, error = %e, "accept failed");
                    // Out of file descriptors and the like: do not spin.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve_connection<S, H, Fut, B>(stream: S, limits: Http1Limits, handler: H)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let service = hyper::service::service_fn(move |req| {
        let answer = handler(req);
        async move { Ok::<_, Infallible>(answer.await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_read_ms_max))
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// A JSON answer with `status`: both servers' refusals.
pub(crate) fn json_answer(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut answer = Response::new(Full::new(Bytes::from(body.to_string())));
    *answer.status_mut() = status;
    answer
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    answer
}
