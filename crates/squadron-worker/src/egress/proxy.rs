//! The proxy a sandbox reaches on its own loopback: `/{mount}/{path}` goes to the mount's
//! upstream with `{path}` appended, once the binding's header carries this attempt's
//! placeholder; the header leaves with the value in its place. Answers stream back as they
//! come (a model's server-sent events).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::HeaderValue;
use hyper::{Request, Response, StatusCode};
use squadron_pki::{SecretToken, TokenKind};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt as _;

use crate::http1_server::{self, Acceptor, Http1Limits};

use super::echo_scrub::EchoScrub;
use super::{
    EgressOwner, EgressSession, Route, EGRESS_CONNECTIONS_MAX, EGRESS_HEADER_READ_MS_MAX,
    EGRESS_REQUEST_BYTES_MAX,
};

/// Headers that describe one hop, never relayed either way.
const HOP_HEADERS: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];
/// Request headers never relayed upstream: each would let an echoed value come back in a
/// shape the scrub cannot see (compressed, or cut into ranges fetched apart).
const SCRUB_DEFEATING_HEADERS: [&str; 3] = ["accept-encoding", "range", "if-range"];
/// Chunks of an answer buffered between the upstream and the sandbox.
const ANSWER_CHUNKS_BUFFERED: usize = 16;

type Answer = Response<BoxBody<Bytes, std::io::Error>>;

/// Serves until aborted.
pub(super) async fn accept_loop<A: Acceptor>(listener: A, session: Arc<EgressSession>) {
    let limits = Http1Limits {
        connections_max: EGRESS_CONNECTIONS_MAX,
        header_read_ms_max: EGRESS_HEADER_READ_MS_MAX,
    };
    let what = format!("egress proxy of {}", session.owner);
    http1_server::serve(listener, limits, what, move |req| {
        let session = session.clone();
        async move { session.answer(req).await }
    })
    .await;
}

impl EgressSession {
    async fn answer(&self, req: Request<Incoming>) -> Answer {
        let path = req.uri().path().to_owned();
        let (mount, rest) = split_path(&path);
        let Some(route) = self.routes.get(mount) else {
            return error(
                StatusCode::NOT_FOUND,
                &format!("no credential is injected under /{mount}; the base URLs are in the *_BASE_URL variables"),
            );
        };
        if let Err(refusal) = self.admit(&req, route) {
            return refusal;
        }
        if let Err(refusal) = self.lease_active().await {
            tracing::warn!(owner = %self.owner, credential = %route.id, status = refusal.status().as_u16(), "egress request refused: the lease is not active");
            return refusal;
        }
        let answer = self.relay(req, route, rest).await;
        tracing::info!(owner = %self.owner, credential = %route.id, %mount, status = answer.status().as_u16(), "egress request relayed");
        answer
    }

    /// 401 unless the binding's header carries this attempt's placeholder.
    fn admit(&self, req: &Request<Incoming>, route: &Route) -> Result<(), Answer> {
        let header = &route.binding.header;
        let given = req
            .headers()
            .get(header.as_str())
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix(route.binding.value_prefix.as_str()))
            .and_then(|t| SecretToken::parse(TokenKind::Egress, t.trim()).ok());
        match given {
            Some(token) if self.placeholder_hash.matches(&token) => Ok(()),
            _ => Err(error(
                StatusCode::UNAUTHORIZED,
                &format!(
                    "the {header} header must carry this sandbox's placeholder (the {} variable)",
                    route_variable(req.uri().path())
                ),
            )),
        }
    }

    /// The lease must still be active (revoking the credential ends it); a control plane that
    /// cannot say so refuses too.
    async fn lease_active(&self) -> Result<(), Answer> {
        let revoked = match self.owner {
            EgressOwner::Task(_) => self
                .control
                .get_credential_lease(self.lease)
                .await
                .map(|v| {
                    v.revoked_at_ms
                        .map(|_| v.revoked_reason.unwrap_or_default())
                }),
            EgressOwner::Agent { .. } => self
                .control
                .get_agent_credential_lease(self.lease)
                .await
                .map(|v| {
                    v.revoked_at_ms
                        .map(|_| v.revoked_reason.unwrap_or_default())
                }),
        };
        match revoked {
            Ok(None) => Ok(()),
            Ok(Some(reason)) => Err(error(
                StatusCode::FORBIDDEN,
                &format!("credential lease {} ended: {reason}", self.lease),
            )),
            Err(e) => Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "the control plane could not confirm credential lease {}: {e}",
                    self.lease
                ),
            )),
        }
    }

    async fn relay(&self, req: Request<Incoming>, route: &Route, rest: &str) -> Answer {
        let (parts, body) = req.into_parts();
        let body = match Limited::new(body, EGRESS_REQUEST_BYTES_MAX).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("a request is at most {EGRESS_REQUEST_BYTES_MAX} bytes"),
                )
            }
        };
        let mut url = route.upstream.clone();
        let base = url.path().trim_end_matches('/').to_owned();
        url.set_path(&format!("{base}/{rest}"));
        url.set_query(parts.uri.query());
        let mut out = self.http.request(parts.method, url).body(body);
        for (name, value) in &parts.headers {
            let name = name.as_str();
            if !HOP_HEADERS.contains(&name)
                && !SCRUB_DEFEATING_HEADERS.contains(&name)
                && name != route.binding.header
            {
                out = out.header(name, value.clone());
            }
        }
        // The answer uncompressed, so an echoed value is found and scrubbed on its way in.
        out = out.header("accept-encoding", "identity");
        let mut secret = match HeaderValue::from_str(&format!(
            "{}{}",
            route.binding.value_prefix,
            route.value.as_str()
        )) {
            Ok(v) => v,
            Err(_) => {
                return error(
                    StatusCode::BAD_GATEWAY,
                    &format!("credential {} cannot travel in a header", route.id),
                )
            }
        };
        secret.set_sensitive(true);
        out = out.header(route.binding.header.as_str(), secret);
        match out.send().await {
            Ok(answer) => stream_back(answer, EchoScrub::new(&route.value, route.id.as_str())),
            Err(e) => {
                let e = e.without_url();
                tracing::warn!(owner = %self.owner, credential = %route.id, error = %e, "egress upstream unreachable");
                error(StatusCode::BAD_GATEWAY, &format!("upstream: {e}"))
            }
        }
    }
}

/// The answer's status and headers at once, its body as it arrives; the value wherever the
/// upstream echoed it scrubbed.
fn stream_back(mut answer: reqwest::Response, mut scrub: EchoScrub) -> Answer {
    // Asked for `identity`; an upstream that encodes anyway is not relayed: its bytes could
    // hide an echoed value from the scrub.
    if let Some(coding) = answer
        .headers()
        .get("content-encoding")
        .filter(|c| !c.as_bytes().eq_ignore_ascii_case(b"identity"))
    {
        return error(
            StatusCode::BAD_GATEWAY,
            &format!(
                "the upstream answered with content-encoding {}; the proxy relays \
                 uncompressed answers only",
                String::from_utf8_lossy(coding.as_bytes())
            ),
        );
    }
    let mut back = Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        if !HOP_HEADERS.contains(&name.as_str()) {
            back = back.header(name.as_str(), scrub.scrub(value.as_bytes()));
        }
    }
    let (tx, rx) = tokio::sync::mpsc::channel(ANSWER_CHUNKS_BUFFERED);
    tokio::spawn(async move {
        loop {
            // A sandbox that hung up ends the relay now, not at the upstream's next chunk.
            let chunk = tokio::select! {
                chunk = answer.chunk() => chunk,
                () = tx.closed() => break,
            };
            let (next, end) = match chunk {
                Ok(Some(chunk)) => (Ok(scrub.push(&chunk)), false),
                Ok(None) => (Ok(scrub.finish()), true),
                Err(e) => (
                    Err(std::io::Error::other(e.without_url().to_string())),
                    true,
                ),
            };
            // A chunk held back whole (it may be the value's start) sends nothing yet.
            let empty = next.as_ref().is_ok_and(Bytes::is_empty);
            if (!empty && tx.send(next).await.is_err()) || end {
                break;
            }
        }
    });
    let body = StreamBody::new(ReceiverStream::new(rx).map(|r| r.map(Frame::data)));
    back.body(BodyExt::boxed(body))
        .unwrap_or_else(|e| error(StatusCode::BAD_GATEWAY, &e.to_string()))
}

/// `/{mount}/{rest}` → (mount, rest).
fn split_path(path: &str) -> (&str, &str) {
    let path = path.strip_prefix('/').unwrap_or(path);
    path.split_once('/').unwrap_or((path, ""))
}

fn route_variable(path: &str) -> String {
    split_path(path).0.to_ascii_uppercase()
}

fn error(status: StatusCode, message: &str) -> Answer {
    let body = serde_json::json!({"error": {"type": "squadron_egress", "message": message}});
    http1_server::json_answer(status, &body)
        .map(|b| b.map_err(|never: Infallible| match never {}).boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_names_its_mount_then_the_upstream_path() {
        assert_eq!(
            split_path("/anthropic_api_key/v1/messages"),
            ("anthropic_api_key", "v1/messages")
        );
        assert_eq!(split_path("/openai_api_key"), ("openai_api_key", ""));
        assert_eq!(split_path("/"), ("", ""));
        assert_eq!(route_variable("/gh_token/x"), "GH_TOKEN");
    }
}
