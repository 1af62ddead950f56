//! Listeners that admit only control nodes (the peer listener, a worker's output server): a
//! service wrapper that answers anything else before it reaches a handler — HTTP 403, or gRPC
//! `PERMISSION_DENIED` for a gRPC request (a gRPC client reads only the status trailer).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum_core::body::Body;

use crate::tls_listener::PeerCert;

/// gRPC's status code for "authenticated, but not allowed".
const GRPC_PERMISSION_DENIED: &str = "7";

/// Wraps `inner` so only requests whose [`PeerCert`] is a node identity reach it.
#[derive(Debug, Clone)]
pub struct NodesOnly<S> {
    inner: S,
}

impl<S> NodesOnly<S> {
    pub fn new(inner: S) -> Self {
        NodesOnly { inner }
    }
}

/// Whether the request carries a verified node certificate.
pub fn is_from_node<B>(request: &http::Request<B>) -> bool {
    matches!(
        request.extensions().get::<PeerCert>(),
        Some(PeerCert(Some(facts))) if facts.identity.is_node()
    )
}

fn refusal<B>(request: &http::Request<B>) -> http::Response<Body> {
    let grpc = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    let who = match request.extensions().get::<PeerCert>() {
        Some(PeerCert(Some(facts))) => facts.identity.to_string(),
        _ => "a client without a certificate".to_owned(),
    };
    let message = format!("only control nodes are admitted here, not {who}");
    if grpc {
        let mut r = http::Response::new(Body::empty());
        let headers = r.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        headers.insert(
            "grpc-status",
            http::HeaderValue::from_static(GRPC_PERMISSION_DENIED),
        );
        if let Ok(v) = http::HeaderValue::from_str(&message) {
            headers.insert("grpc-message", v);
        }
        r
    } else {
        let body = format!(r#"{{"code":"permission_denied","message":"{message}"}}"#);
        let mut r = http::Response::new(Body::from(body));
        *r.status_mut() = http::StatusCode::FORBIDDEN;
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        r
    }
}

impl<S, B> tower_service::Service<http::Request<B>> for NodesOnly<S>
where
    S: tower_service::Service<
        http::Request<B>,
        Response = http::Response<Body>,
        Error = Infallible,
    >,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !is_from_node(&request) {
            let refused = refusal(&request);
            return Box::pin(async move { Ok(refused) });
        }
        Box::pin(self.inner.call(request))
    }
}
