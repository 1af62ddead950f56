//! The HTTP core every call goes through: the endpoint list with its preferred endpoint, one
//! request per endpoint in turn, and the rule that keeps failover safe — a read, or a write
//! with an idempotency key, may go on to the next endpoint after any transport failure (and
//! after a `503 unavailable` answer); a write without a key goes on only when it provably
//! never left this process, and otherwise fails with [`ClientError::OutcomeUnknown`] rather
//! than being sent a second time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderValue, CONTENT_TYPE};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use squadron_core::ids::IdempotencyKey;
use squadron_core::Outcome;

use crate::credentials::Credentials;
use crate::error::{self, ClientError, EndpointFailure, ErrorBody};
use crate::{normalize_endpoint, Consistency, CONNECT_TIMEOUT_DEFAULT, REQUEST_TIMEOUT_DEFAULT};

pub use squadron_api::IDEMPOTENCY_HEADER;

/// Percent-encodes one path segment (everything but RFC 3986 unreserved characters).
pub(crate) fn segment(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An error and its sources, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

pub(crate) enum Body {
    Empty,
    Json(Vec<u8>),
    Text(&'static str, String),
}

#[derive(Clone, Copy)]
pub(crate) enum Call<'a> {
    Read(Consistency),
    Write(Option<&'a IdempotencyKey>),
}

impl Call<'_> {
    /// Whether the request may be sent to another endpoint after it may have reached one.
    fn resend_safe(self) -> bool {
        match self {
            Call::Read(_) => true,
            Call::Write(key) => key.is_some(),
        }
    }
}

/// What one endpoint's attempt came to.
enum Attempt {
    /// A 2xx answer's body.
    Answered(Vec<u8>),
    /// An answer that ends the call (an error body, or a failure that must not be resent).
    Final(ClientError),
    /// Nothing usable, and the call may go on to the next endpoint.
    Next(EndpointFailure),
    /// A `503` that may go on; kept to report if no endpoint does better.
    Unavailable(ClientError),
}

/// A client of one Squadron cluster. Cheap to clone; clones share the connection pool and the
/// preferred endpoint.
#[derive(Debug, Clone)]
pub struct SquadronClient {
    endpoints: Arc<Vec<String>>,
    http: reqwest::Client,
    preferred: Arc<AtomicUsize>,
    credentials: Credentials,
}

impl SquadronClient {
    /// A client of the given endpoints (`https://127.0.0.1:8120`; a bare `host:port` gets
    /// `https://`), with the default timeouts and no credentials (plain `http://` only).
    pub fn new(endpoints: Vec<String>) -> Self {
        Self::with_timeouts(endpoints, REQUEST_TIMEOUT_DEFAULT, CONNECT_TIMEOUT_DEFAULT)
    }

    /// A client with explicit timeouts: `request` bounds a whole call to one endpoint,
    /// `connect` the connection set-up (after which the next endpoint is tried).
    pub fn with_timeouts(endpoints: Vec<String>, request: Duration, connect: Duration) -> Self {
        let http = reqwest::Client::builder()
            .timeout(request)
            .connect_timeout(connect)
            .tcp_nodelay(true)
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Self::build(endpoints, http, Credentials::default())
    }

    /// A client that trusts the cluster CA and presents `credentials` (a bearer token on
    /// every request; a certificate when it is a worker's or agent's).
    pub fn secured(endpoints: Vec<String>, credentials: &Credentials) -> Result<Self, ClientError> {
        Self::secured_with_timeouts(
            endpoints,
            credentials,
            REQUEST_TIMEOUT_DEFAULT,
            CONNECT_TIMEOUT_DEFAULT,
        )
    }

    /// [`secured`](Self::secured) with explicit timeouts.
    pub fn secured_with_timeouts(
        endpoints: Vec<String>,
        credentials: &Credentials,
        request: Duration,
        connect: Duration,
    ) -> Result<Self, ClientError> {
        let mut builder = reqwest::Client::builder()
            .timeout(request)
            .connect_timeout(connect)
            .tcp_nodelay(true);
        if let Some(tls) = credentials
            .tls_config()
            .map_err(|e| ClientError::Invalid(format!("TLS: {e}")))?
        {
            builder = builder.use_preconfigured_tls(tls);
        }
        if let Some(token) = credentials.token() {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                ClientError::Invalid("the token is not a valid header value".into())
            })?;
            value.set_sensitive(true);
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(reqwest::header::AUTHORIZATION, value);
            builder = builder.default_headers(headers);
        }
        let http = builder
            .build()
            .map_err(|e| ClientError::Invalid(format!("the HTTP client: {e}")))?;
        Ok(Self::build(endpoints, http, credentials.clone()))
    }

    fn build(endpoints: Vec<String>, http: reqwest::Client, credentials: Credentials) -> Self {
        Self {
            endpoints: Arc::new(endpoints.iter().map(|e| normalize_endpoint(e)).collect()),
            http,
            preferred: Arc::new(AtomicUsize::new(0)),
            credentials,
        }
    }

    /// The credentials this client presents (gRPC channels to the leader use them too).
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// A client of other endpoints that shares this one's connection pool and timeouts.
    pub fn with_endpoints(&self, endpoints: Vec<String>) -> Self {
        Self {
            endpoints: Arc::new(endpoints.iter().map(|e| normalize_endpoint(e)).collect()),
            http: self.http.clone(),
            preferred: Arc::new(AtomicUsize::new(0)),
            credentials: self.credentials.clone(),
        }
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The endpoint the next call tries first.
    pub fn preferred_endpoint(&self) -> Option<&str> {
        let n = self.endpoints.len();
        if n == 0 {
            return None;
        }
        self.endpoints
            .get(self.preferred.load(Ordering::Relaxed) % n)
            .map(String::as_str)
    }

    /// Tries the endpoints in turn from the preferred one; the answering endpoint and the
    /// 2xx body.
    pub(crate) async fn call_bytes(
        &self,
        method: Method,
        path: &str,
        mut query: Vec<(&'static str, String)>,
        body: Body,
        call: Call<'_>,
    ) -> Result<(String, Vec<u8>), ClientError> {
        if let Call::Read(Consistency::Stale) = call {
            query.push(("consistency", "stale".into()));
        }
        let n = self.endpoints.len();
        let start = if n == 0 {
            0
        } else {
            self.preferred.load(Ordering::Relaxed) % n
        };
        let mut attempts = Vec::new();
        let mut unavailable: Option<ClientError> = None;
        for i in 0..n {
            let idx = (start + i) % n;
            let Some(base) = self.endpoints.get(idx) else {
                continue;
            };
            let req = self.request(base, method.clone(), path, &query, &body, call);
            match attempt(base, req, call).await {
                Attempt::Answered(bytes) => {
                    self.preferred.store(idx, Ordering::Relaxed);
                    return Ok((base.clone(), bytes));
                }
                Attempt::Final(err) => {
                    // An answer other than 503 (which says nothing of the others) makes this
                    // endpoint the preferred one; a failure that was not resent does not.
                    if matches!(&err, ClientError::Api { status, .. } if *status != 503) {
                        self.preferred.store(idx, Ordering::Relaxed);
                    }
                    return Err(err);
                }
                Attempt::Next(failure) => attempts.push(failure),
                Attempt::Unavailable(err) => {
                    attempts.push(EndpointFailure {
                        endpoint: base.clone(),
                        message: err.to_string(),
                    });
                    unavailable = Some(err);
                }
            }
        }
        Err(unavailable.unwrap_or(ClientError::Unreachable { attempts }))
    }

    fn request(
        &self,
        base: &str,
        method: Method,
        path: &str,
        query: &[(&'static str, String)],
        body: &Body,
        call: Call<'_>,
    ) -> reqwest::RequestBuilder {
        let mut req = self.http.request(method, format!("{base}{path}"));
        if !query.is_empty() {
            req = req.query(query);
        }
        req = match body {
            Body::Empty => req,
            Body::Json(bytes) => req
                .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                .body(bytes.clone()),
            Body::Text(content_type, text) => req
                .header(CONTENT_TYPE, HeaderValue::from_static(content_type))
                .body(text.clone()),
        };
        if let Call::Write(Some(key)) = call {
            req = req.header(IDEMPOTENCY_HEADER, key.as_str());
        }
        req
    }

    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: Vec<(&'static str, String)>,
        body: Body,
        call: Call<'_>,
    ) -> Result<T, ClientError> {
        let (endpoint, bytes) = self.call_bytes(method, path, query, body, call).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode {
            endpoint,
            message: e.to_string(),
        })
    }

    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        c: Consistency,
    ) -> Result<T, ClientError> {
        self.call(Method::GET, path, Vec::new(), Body::Empty, Call::Read(c))
            .await
    }

    pub(crate) async fn write<T: DeserializeOwned, B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        key: Option<&IdempotencyKey>,
    ) -> Result<T, ClientError> {
        let body = match body {
            Some(b) => {
                Body::Json(serde_json::to_vec(b).map_err(|e| ClientError::Invalid(e.to_string()))?)
            }
            None => Body::Empty,
        };
        self.call(method, path, Vec::new(), body, Call::Write(key))
            .await
    }

    pub(crate) async fn post<B: Serialize>(
        &self,
        path: &str,
        body: &B,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.write(Method::POST, path, Some(body), key).await
    }

    pub(crate) async fn send_empty(
        &self,
        method: Method,
        path: &str,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.write::<Outcome, ()>(method, path, None, key).await
    }
}

/// Sends one request to one endpoint and sorts out what its answer (or its lack) allows.
async fn attempt(base: &str, req: reqwest::RequestBuilder, call: Call<'_>) -> Attempt {
    let failure = |message: String| EndpointFailure {
        endpoint: base.to_string(),
        message,
    };
    let resp = match req.send().await {
        Ok(resp) => resp,
        Err(e) => {
            // A refused or failed connection (and a URL that could not even be built) means
            // nothing was sent: any call may go on to the next endpoint.
            let not_sent = e.is_connect() || e.is_builder();
            let message = chain(&e);
            if !not_sent && !call.resend_safe() {
                return Attempt::Final(ClientError::OutcomeUnknown {
                    endpoint: base.to_string(),
                    message,
                });
            }
            tracing::debug!(endpoint = %base, %message, "endpoint failed; trying the next");
            return Attempt::Next(failure(message));
        }
    };
    let status = resp.status().as_u16();
    let bytes = match resp.bytes().await {
        Ok(b) => b.to_vec(),
        Err(e) => {
            let message = format!("status {status}, then reading the answer: {}", chain(&e));
            if !call.resend_safe() {
                return Attempt::Final(ClientError::OutcomeUnknown {
                    endpoint: base.to_string(),
                    message,
                });
            }
            return Attempt::Next(failure(message));
        }
    };
    if (200..300).contains(&status) {
        return Attempt::Answered(bytes);
    }
    let err = ClientError::Api {
        endpoint: base.to_string(),
        status,
        body: error_body(status, &bytes),
    };
    // A node without a leader (or that lost its forward) answers 503. Another node may do
    // better — but a write without a key may have been forwarded and applied.
    if status == 503 && call.resend_safe() {
        return Attempt::Unavailable(err);
    }
    Attempt::Final(err)
}

/// The server's error body, or one made from the status for an answer that is not one (a
/// proxy, a route the server does not know the method of).
fn error_body(status: u16, bytes: &[u8]) -> ErrorBody {
    serde_json::from_slice::<ErrorBody>(bytes).unwrap_or_else(|_| ErrorBody {
        code: error::code_for_status(status),
        message: {
            let text = String::from_utf8_lossy(bytes).trim().to_string();
            if text.is_empty() {
                format!("HTTP {status}")
            } else {
                format!("HTTP {status}: {text}")
            }
        },
        field: None,
        rejection: None,
    })
}
