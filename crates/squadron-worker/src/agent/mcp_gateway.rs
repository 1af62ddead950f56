//! The MCP gateway (issue 16 item 7): a provider reaches an MCP server only through its
//! worker, over its profile's Unix socket (`/mnt/broker/mcp.sock`), speaking MCP's streamable
//! HTTP. Every message must carry the generation's bearer token (else 401), and the profile
//! must hold `mcp_server:use` on that server at that moment (INV-14) — asked of the control
//! plane, which counts a refusal for `squadron evidence` (else 403 `insufficient_scope`).
//! Allowed messages are relayed to the server's upstream (`--mcp-server NAME=URL`), which the
//! sandbox itself cannot reach: its egress filter closes the host and its loopback.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, ALLOW, AUTHORIZATION, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{McpServerId, ProfileId};
use squadron_pki::{SecretToken, TokenHash, TokenKind};
use tokio::net::UnixListener;

use crate::agent::error::AgentError;
use crate::control_link::{CallError, ControlLink};
use crate::error::WorkerError;
use crate::http1_server::{self, Http1Limits};

/// The gateway's socket in the profile's socket directory (`/mnt/broker` in the sandbox).
pub(crate) const MCP_SOCKET_NAME: &str = "mcp.sock";
/// Largest MCP message a provider may send.
pub const MCP_MESSAGE_BYTES_MAX: usize = 4 << 20;
/// Largest answer relayed from an upstream server.
pub const MCP_ANSWER_BYTES_MAX: usize = 16 << 20;
/// Longest an upstream server may take to answer one message.
pub const MCP_UPSTREAM_TIMEOUT_MS: u64 = 120_000;
/// Longest a connection may take to send a message's head (and idle between messages).
pub const MCP_HEADER_READ_MS_MAX: u64 = 30_000;
/// Connections one generation's socket serves at once; more wait to be accepted.
pub const MCP_CONNECTIONS_MAX: usize = 32;
/// Where https upstreams' trust anchors are read from: Debian's bundle.
pub const MCP_CA_BUNDLE_PATH: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The socket is 0660: the provider, running as the sandbox user, connects through its group.
const SOCKET_MODE: u32 = 0o660;
/// Headers of MCP's streamable HTTP relayed each way; never `Authorization`, so the
/// generation's token stays between the provider and its worker.
const RELAYED_HEADERS: [&str; 5] = [
    "content-type",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];
const REALM: &str = "squadron-mcp";

/// The MCP servers this worker offers and how it reaches them.
#[derive(Debug, Clone)]
pub(crate) struct McpGateway {
    inner: Arc<GatewayInner>,
}

#[derive(Debug)]
struct GatewayInner {
    upstreams: BTreeMap<McpServerId, reqwest::Url>,
    control: ControlLink,
    http: reqwest::Client,
}

/// One generation's gateway socket. Dropping it stops accepting, ends every connection it
/// had open (a keep-alive connection must not outlive its generation) and removes the socket
/// file unless a newer generation's socket took its place.
#[derive(Debug)]
pub(crate) struct McpSocket {
    socket: PathBuf,
    /// The socket file's identity when bound: device, inode and change time (an inode number
    /// alone may be reused by the next generation's socket).
    file: (u64, u64, i64, i64),
    accept_loop: tokio::task::JoinHandle<()>,
}

fn file_identity(meta: &std::fs::Metadata) -> (u64, u64, i64, i64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec())
}

impl Drop for McpSocket {
    fn drop(&mut self) {
        self.accept_loop.abort();
        let ours =
            std::fs::symlink_metadata(&self.socket).is_ok_and(|m| file_identity(&m) == self.file);
        if ours {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

/// What one socket serves: whose it is and the token its generation holds.
struct Served {
    gateway: McpGateway,
    profile: ProfileId,
    token: TokenHash,
}

/// Parses `--mcp-server NAME=URL`: an MCP server this host offers and its streamable-HTTP
/// endpoint.
pub fn parse_mcp_server(spec: &str) -> Result<(McpServerId, reqwest::Url), WorkerError> {
    let bad = |message: String| WorkerError::Invalid {
        field: "mcp_server".into(),
        message,
    };
    let (name, url) = spec
        .split_once('=')
        .ok_or_else(|| bad(format!("{spec:?} is not NAME=URL")))?;
    let id = McpServerId::new(name).map_err(|e| bad(e.to_string()))?;
    let url = reqwest::Url::parse(url).map_err(|e| bad(format!("{name}: {url:?}: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(bad(format!(
            "{name}: {url} is not an http(s) URL with a host"
        )));
    }
    Ok((id, url))
}

impl McpGateway {
    pub(crate) fn new(
        upstreams: BTreeMap<McpServerId, reqwest::Url>,
        control: ControlLink,
    ) -> Result<McpGateway, WorkerError> {
        let mut http = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .timeout(Duration::from_millis(MCP_UPSTREAM_TIMEOUT_MS))
            .redirect(reqwest::redirect::Policy::none());
        if upstreams.values().any(|u| u.scheme() == "https") {
            let pem = std::fs::read(MCP_CA_BUNDLE_PATH)
                .map_err(|e| WorkerError::io("read the CA bundle", MCP_CA_BUNDLE_PATH, e))?;
            let roots = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                WorkerError::runtime("MCP gateway", format!("{MCP_CA_BUNDLE_PATH}: {e}"))
            })?;
            for root in roots {
                http = http.add_root_certificate(root);
            }
        }
        let http = http
            .build()
            .map_err(|e| WorkerError::runtime("MCP gateway", e.to_string()))?;
        Ok(McpGateway {
            inner: Arc::new(GatewayInner {
                upstreams,
                control,
                http,
            }),
        })
    }

    pub(crate) fn offers(&self, server: &McpServerId) -> bool {
        self.inner.upstreams.contains_key(server)
    }

    /// Binds `socket` for one generation of `profile` holding `token` (a stale socket file
    /// is replaced, any other file refused) and serves it on the current runtime.
    pub(crate) fn serve(
        &self,
        socket: &Path,
        profile: ProfileId,
        token: &SecretToken,
        group: Option<u32>,
    ) -> Result<McpSocket, AgentError> {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let io = |what: &'static str, e| AgentError::from(WorkerError::io(what, socket, e));
        match std::fs::symlink_metadata(socket) {
            Ok(meta) if meta.file_type().is_socket() => {
                std::fs::remove_file(socket).map_err(|e| io("remove the stale socket", e))?
            }
            Ok(_) => {
                return Err(AgentError::invalid(
                    "socket",
                    format!("{} exists and is not a socket", socket.display()),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("stat the socket path", e)),
        }
        let listener = UnixListener::bind(socket).map_err(|e| io("bind the MCP socket", e))?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(SOCKET_MODE))
            .map_err(|e| io("set the MCP socket's mode", e))?;
        if let Some(gid) = group {
            std::os::unix::fs::lchown(socket, None, Some(gid))
                .map_err(|e| io("share the MCP socket", e))?;
        }
        let file = file_identity(
            &std::fs::symlink_metadata(socket).map_err(|e| io("stat the MCP socket", e))?,
        );
        let served = Arc::new(Served {
            gateway: self.clone(),
            profile,
            token: token.hash(),
        });
        Ok(McpSocket {
            socket: socket.to_owned(),
            file,
            accept_loop: tokio::spawn(http1_server::serve(
                listener,
                Http1Limits {
                    connections_max: MCP_CONNECTIONS_MAX,
                    header_read_ms_max: MCP_HEADER_READ_MS_MAX,
                },
                format!("MCP gateway of profile {profile}"),
                move |req| {
                    let served = served.clone();
                    async move { served.answer(req).await }
                },
            )),
        })
    }
}

type Answer = Response<Full<Bytes>>;

impl Served {
    async fn answer(&self, req: Request<Incoming>) -> Answer {
        let (server, upstream) = match self.admit(&req).await {
            Ok(admitted) => admitted,
            Err(refusal) => return refusal,
        };
        let answer = self.relay(req, upstream).await;
        tracing::info!(profile = %self.profile, %server, status = answer.status().as_u16(), "MCP message relayed");
        answer
    }

    /// The server a message is for and its upstream, once its path, method, token, the
    /// server (offered here) and the grant are checked — the grant last, so only a message
    /// that could be relayed costs the control plane a read.
    async fn admit(&self, req: &Request<Incoming>) -> Result<(McpServerId, reqwest::Url), Answer> {
        let Some(name) = req.uri().path().strip_prefix("/mcp/") else {
            return Err(error(
                StatusCode::NOT_FOUND,
                "not_found",
                "MCP servers are at /mcp/{server}",
            ));
        };
        if !matches!(*req.method(), Method::POST | Method::DELETE) {
            let mut refusal = error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "the gateway relays POST and DELETE",
            );
            refusal
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static("POST, DELETE"));
            return Err(refusal);
        }
        self.authenticate(req)?;
        let server = McpServerId::new(name)
            .map_err(|e| error(StatusCode::BAD_REQUEST, "invalid_request", &e.to_string()))?;
        let Some(upstream) = self.gateway.inner.upstreams.get(&server).cloned() else {
            return Err(error(
                StatusCode::NOT_FOUND,
                "not_found",
                &format!("this worker does not offer MCP server {server}"),
            ));
        };
        match self
            .gateway
            .inner
            .control
            .check_mcp_use(self.profile, &server)
            .await
        {
            Ok(_) => Ok((server, upstream)),
            // A profile deleted meanwhile holds no grant either.
            Err(CallError::Refused(body))
                if matches!(body.code, ErrorCode::PermissionDenied | ErrorCode::NotFound) =>
            {
                tracing::warn!(profile = %self.profile, %server, "MCP use refused: no grant");
                let mut refusal = error(StatusCode::FORBIDDEN, "insufficient_scope", &body.message);
                refusal.headers_mut().insert(
                    WWW_AUTHENTICATE,
                    header_value(&format!(
                        "Bearer realm=\"{REALM}\", error=\"insufficient_scope\", \
                         scope=\"mcp_server:use:{server}\""
                    )),
                );
                Err(refusal)
            }
            Err(e) => Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                &format!("the control plane could not decide the use of {server}: {e}"),
            )),
        }
    }

    /// 401 unless the message carries this generation's token.
    fn authenticate(&self, req: &Request<Incoming>) -> Result<(), Answer> {
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let (challenge, message) = match given.map(|t| SecretToken::parse(TokenKind::Mcp, t)) {
            Some(Ok(token)) if self.token.matches(&token) => return Ok(()),
            Some(_) => (
                format!("Bearer realm=\"{REALM}\", error=\"invalid_token\""),
                "the token is not this generation's",
            ),
            None => (
                format!("Bearer realm=\"{REALM}\""),
                "a bearer token is required",
            ),
        };
        let mut refusal = error(StatusCode::UNAUTHORIZED, "unauthorized", message);
        refusal
            .headers_mut()
            .insert(WWW_AUTHENTICATE, header_value(&challenge));
        Err(refusal)
    }

    /// Sends the message on and the upstream's answer back, each within its bound.
    async fn relay(&self, req: Request<Incoming>, upstream: reqwest::Url) -> Answer {
        let (parts, body) = req.into_parts();
        let body = match Limited::new(body, MCP_MESSAGE_BYTES_MAX).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    &format!("an MCP message is at most {MCP_MESSAGE_BYTES_MAX} bytes"),
                )
            }
        };
        let mut out = self
            .gateway
            .inner
            .http
            .request(parts.method, upstream)
            .body(body);
        for name in RELAYED_HEADERS {
            if let Some(v) = parts.headers.get(name) {
                out = out.header(name, v.clone());
            }
        }
        let bad_gateway = |e: String| {
            error(
                StatusCode::BAD_GATEWAY,
                "bad_gateway",
                &format!("upstream: {e}"),
            )
        };
        let mut answer = match out.send().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(profile = %self.profile, error = %e, "MCP upstream unreachable");
                return bad_gateway(e.without_url().to_string());
            }
        };
        // The upstream's own 401 or 403 is not this gateway's refusal of the token or grant.
        if matches!(
            answer.status(),
            reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN
        ) {
            let status = answer.status();
            tracing::warn!(profile = %self.profile, %status, "MCP upstream refused the worker");
            return bad_gateway(format!("the server refused the worker ({status})"));
        }
        let mut back = Response::builder().status(answer.status());
        for name in RELAYED_HEADERS {
            if let Some(v) = answer.headers().get(name) {
                back = back.header(HeaderName::from_static(name), v.clone());
            }
        }
        let mut bytes = Vec::new();
        loop {
            match answer.chunk().await {
                Ok(Some(chunk)) if bytes.len() + chunk.len() <= MCP_ANSWER_BYTES_MAX => {
                    bytes.extend_from_slice(&chunk)
                }
                Ok(Some(_)) => {
                    return bad_gateway(format!("answer over {MCP_ANSWER_BYTES_MAX} bytes"))
                }
                Ok(None) => break,
                Err(e) => return bad_gateway(e.without_url().to_string()),
            }
        }
        back.body(Full::new(Bytes::from(bytes)))
            .unwrap_or_else(|e| bad_gateway(e.to_string()))
    }
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
}

/// An RFC 6750-style error body: `error` and `error_description`.
fn error(status: StatusCode, code: &str, description: &str) -> Answer {
    let body = serde_json::json!({ "error": code, "error_description": description });
    http1_server::json_answer(status, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_mcp_server_flag_names_what_is_wrong() {
        let (id, url) = parse_mcp_server("notes=http://127.0.0.1:9000/mcp").expect("good");
        assert_eq!(id.as_str(), "notes");
        assert_eq!(url.as_str(), "http://127.0.0.1:9000/mcp");
        for (spec, says) in [
            ("notes", "is not NAME=URL"),
            ("=http://x/", "mcp_server"),
            ("notes=not a url", "notes"),
            ("notes=file:///etc/passwd", "is not an http(s) URL"),
            ("notes=unix:/run/x.sock", "is not an http(s) URL"),
        ] {
            let e = parse_mcp_server(spec).expect_err(spec).to_string();
            assert!(e.contains(says), "{spec}: {e}");
            assert!(e.contains("mcp_server"), "{spec}: {e}");
        }
    }
}
