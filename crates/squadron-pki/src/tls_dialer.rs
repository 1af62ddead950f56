//! Dialing over TLS for clients that bring their own transport (tonic channels): a connector
//! that opens TCP, sets `TCP_NODELAY`, and runs the handshake with a configuration from
//! [`client_config`](crate::client_config), so the server is checked by identity.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A tower connector from a URI to a TLS stream (`tonic`'s `connect_with_connector`).
#[derive(Clone)]
pub struct TlsConnector {
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector").finish_non_exhaustive()
    }
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("address {0:?} has no host")]
    NoHost(String),
    #[error("{host}: {source}")]
    Io {
        host: String,
        source: std::io::Error,
    },
}

impl TlsConnector {
    pub fn new(config: ClientConfig) -> Self {
        TlsConnector {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        }
    }

    /// Connects to `host:port` and finishes the handshake.
    pub async fn dial(&self, host: &str, port: u16) -> Result<TlsStream<TcpStream>, DialError> {
        let io = |source| DialError::Io {
            host: host.to_owned(),
            source,
        };
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let tcp = TcpStream::connect((bare, port)).await.map_err(io)?;
        // Small RPCs must leave at once rather than wait for a delayed ACK.
        tcp.set_nodelay(true).map_err(io)?;
        let name = ServerName::try_from(bare.to_owned())
            .map_err(|_| DialError::NoHost(host.to_owned()))?;
        self.connector.connect(name, tcp).await.map_err(io)
    }
}

impl tower_service::Service<http::Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, DialError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| DialError::NoHost(uri.to_string()))?
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            Ok(TokioIo::new(this.dial(&host, port).await?))
        })
    }
}

/// A tower connector that reaches the control plane through a Unix socket (the relay a worker
/// gives each sandbox) and runs the TLS handshake over it: the sandbox has no route to the
/// control plane, and the worker, which only forwards bytes, sees ciphertext.
#[derive(Clone)]
pub struct UnixTlsConnector {
    path: std::path::PathBuf,
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for UnixTlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnixTlsConnector")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The name a client behind a relay sends: it cannot know which node answers, so it expects
/// any node ([`ExpectedPeer::AnyNode`](crate::ExpectedPeer)) and the name is not checked.
pub const RELAYED_SERVER_NAME: &str = "squadron-node";

impl UnixTlsConnector {
    pub fn new(path: std::path::PathBuf, config: ClientConfig) -> Self {
        UnixTlsConnector {
            path,
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        }
    }

    /// Connects to the socket and finishes the handshake.
    pub async fn dial(&self) -> Result<TlsStream<tokio::net::UnixStream>, DialError> {
        let io = |source| DialError::Io {
            host: self.path.display().to_string(),
            source,
        };
        let stream = tokio::net::UnixStream::connect(&self.path)
            .await
            .map_err(io)?;
        let name = ServerName::try_from(RELAYED_SERVER_NAME)
            .map_err(|_| DialError::NoHost(RELAYED_SERVER_NAME.to_owned()))?;
        self.connector.connect(name, stream).await.map_err(io)
    }
}

impl tower_service::Service<http::Uri> for UnixTlsConnector {
    type Response = TokioIo<TlsStream<tokio::net::UnixStream>>;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, DialError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(TokioIo::new(this.dial().await?)) })
    }
}
