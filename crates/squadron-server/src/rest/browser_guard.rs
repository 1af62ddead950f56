//! Browser safety for the REST listener.
//!
//! A web page open in an operator's browser can make that browser send requests to a node on
//! `127.0.0.1` (cross-site request forgery), and a DNS name it controls can be rebound to
//! `127.0.0.1` so the page may read the answers (DNS rebinding). Non-browser clients (the
//! CLI, workers, the client library) are unaffected: they send their own host, no `Origin`,
//! and JSON with a JSON content type. Three checks:
//! - `Host` must be an IP literal, `localhost`, or one of the node's own names (its listen
//!   and advertised REST hosts, its members' REST hosts, `server.allowed_hosts`). A rebound
//!   name is none of these.
//! - `Origin`, when a browser sends one (every cross-origin write, every WebSocket upgrade),
//!   must name the request's own host and port.
//! - A state-changing request with a body must declare a JSON (or, for manifests, YAML)
//!   media type: the three a page may send cross-origin without asking first (forms and
//!   `text/plain`) are refused, and so is a body without any type.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::uri::Authority;
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use squadron_core::error_code::ErrorCode;

use crate::config::NodeConfig;
use crate::error::ApiError;

/// Media types a state-changing request's body may have. YAML is for task manifests; the
/// routes parse their own body and refuse a type they do not take.
const BODY_MEDIA_TYPES: [&str; 4] = [
    "application/json",
    "application/yaml",
    "application/x-yaml",
    "text/yaml",
];

/// The names a node answers to; built once from its configuration.
#[derive(Debug, Clone)]
pub struct BrowserGuard {
    names: Arc<BTreeSet<String>>,
}

impl BrowserGuard {
    pub fn for_node(config: &NodeConfig) -> Self {
        let mut names = BTreeSet::from(["localhost".to_string()]);
        let addresses = [config.rest_addr(), config.rest_listen.to_string()];
        let members = config.initial_members.iter().map(|m| m.rest.clone());
        for address in addresses.into_iter().chain(members) {
            if let Ok(authority) = address.parse::<Authority>() {
                names.insert(authority.host().to_ascii_lowercase());
            }
        }
        let allowed = config.server.allowed_hosts.iter();
        names.extend(allowed.map(|h| h.to_ascii_lowercase()));
        Self {
            names: Arc::new(names),
        }
    }

    /// Whether a request passes; the error names the header at fault. `authority` is the
    /// request URI's (HTTP/2 carries the host there, as `:authority`, not in `Host`).
    pub fn check(
        &self,
        method: &Method,
        authority: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<(), ApiError> {
        let host = header_text(headers, header::HOST)?.or(authority);
        if let Some(host) = host {
            self.check_host(host)?;
        }
        if let Some(origin) = header_text(headers, header::ORIGIN)? {
            check_origin(origin, host)?;
        }
        if changes_state(method) && has_body(headers) {
            check_media_type(headers)?;
        }
        Ok(())
    }

    fn check_host(&self, host: &str) -> Result<(), ApiError> {
        let authority = host
            .parse::<Authority>()
            .map_err(|_| ApiError::invalid("Host", format!("{host:?} is not host[:port]")))?;
        let name = authority.host().to_ascii_lowercase();
        let literal = name.trim_start_matches('[').trim_end_matches(']');
        if literal.parse::<IpAddr>().is_ok() || self.names.contains(&name) {
            return Ok(());
        }
        Err(ApiError::invalid(
            "Host",
            format!(
                "{name:?} is not a name of this node; add it to server.allowed_hosts \
                 if clients reach the node by that name"
            ),
        ))
    }
}

/// The middleware: refuses a request that fails [`BrowserGuard::check`].
pub async fn guard(State(g): State<BrowserGuard>, request: Request, next: Next) -> Response {
    let authority = request.uri().authority().map(|a| a.as_str());
    match g.check(request.method(), authority, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Result<Option<&str>, ApiError> {
    match headers.get(&name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(Some)
            .map_err(|_| ApiError::invalid(name.as_str(), "must be ASCII")),
    }
}

fn check_origin(origin: &str, host: Option<&str>) -> Result<(), ApiError> {
    let authority = origin
        .split_once("://")
        .filter(|(scheme, _)| matches!(*scheme, "http" | "https"))
        .map(|(_, authority)| authority);
    let same = match (authority, host) {
        (Some(a), Some(h)) => a.eq_ignore_ascii_case(h),
        _ => false,
    };
    if same {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorCode::PermissionDenied,
        format!(
            "cross-origin request refused: Origin {origin:?} is not this node ({})",
            host.unwrap_or("no Host")
        ),
    ))
}

fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn has_body(headers: &HeaderMap) -> bool {
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match length {
        Some(n) => n > 0,
        // Without a length, a body comes chunked (or, in HTTP/2, in frames a client announces
        // with a content type): treat a declared type or a chunked transfer as a body.
        None => {
            headers.contains_key(header::TRANSFER_ENCODING)
                || headers.contains_key(header::CONTENT_TYPE)
        }
    }
}

/// The media type of a request's body, lower-case and without parameters (`; charset=…`).
pub fn media_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next().unwrap_or("").trim();
    Some(essence.to_ascii_lowercase())
}

fn check_media_type(headers: &HeaderMap) -> Result<(), ApiError> {
    match media_type(headers) {
        Some(t) if BODY_MEDIA_TYPES.contains(&t.as_str()) => Ok(()),
        Some(t) => Err(unsupported(format!(
            "Content-Type {t:?} is not accepted; send the body as application/json"
        ))),
        None => Err(unsupported(
            "a request body needs a Content-Type (application/json)".to_string(),
        )),
    }
}

pub fn unsupported(message: String) -> ApiError {
    let mut e = ApiError::new(ErrorCode::UnsupportedMediaType, message);
    e.body.field = Some("Content-Type".into());
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn guard() -> BrowserGuard {
        let mut config = NodeConfig::single_node(
            "/tmp/unused".into(),
            "127.0.0.1:8120".parse().unwrap(),
            "127.0.0.1:8121".parse().unwrap(),
            "127.0.0.1:8122".parse().unwrap(),
        );
        config.advertise_rest = Some("node-a.example:8120".into());
        config.server.allowed_hosts = vec!["Squadron.Internal".into()];
        BrowserGuard::for_node(&config)
    }

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn code(r: Result<(), ApiError>) -> Option<(ErrorCode, Option<String>)> {
        r.err().map(|e| (e.code(), e.body.field))
    }

    #[test]
    fn hosts_the_node_answers_to_pass_and_a_rebound_name_does_not() {
        let g = guard();
        for host in [
            "127.0.0.1:8120",
            "[::1]:8120",
            "localhost:8120",
            "LOCALHOST",
            "node-a.example:8120",
            "squadron.internal:9000",
            "203.0.113.7:8120",
        ] {
            let h = headers(&[(header::HOST, host)]);
            assert_eq!(code(g.check(&Method::GET, None, &h)), None, "{host}");
        }
        let h = headers(&[(header::HOST, "attacker.example:8120")]);
        let err = g.check(&Method::GET, None, &h).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert_eq!(err.body.field.as_deref(), Some("Host"));
        assert!(err.body.message.contains("attacker.example"), "{err:?}");
    }

    #[test]
    fn an_origin_must_be_the_request_s_own() {
        let g = guard();
        let same = headers(&[
            (header::HOST, "127.0.0.1:8120"),
            (header::ORIGIN, "http://127.0.0.1:8120"),
        ]);
        assert_eq!(code(g.check(&Method::GET, None, &same)), None);
        for origin in [
            "http://evil.example",
            "http://127.0.0.1:9999",
            "null",
            "file://",
        ] {
            let h = headers(&[(header::HOST, "127.0.0.1:8120"), (header::ORIGIN, origin)]);
            for method in [Method::GET, Method::POST] {
                assert_eq!(
                    code(g.check(&method, None, &h)).map(|c| c.0),
                    Some(ErrorCode::PermissionDenied),
                    "{method} from {origin}"
                );
            }
        }
    }

    #[test]
    fn http2_requests_are_judged_by_their_authority() {
        let g = guard();
        let origin = headers(&[(header::ORIGIN, "https://127.0.0.1:8120")]);
        assert_eq!(
            code(g.check(&Method::POST, Some("127.0.0.1:8120"), &origin)),
            None
        );
        let e = g.check(&Method::POST, Some("127.0.0.1:9999"), &origin);
        assert_eq!(code(e).map(|c| c.0), Some(ErrorCode::PermissionDenied));
        let e = g.check(&Method::GET, Some("attacker.example"), &HeaderMap::new());
        assert_eq!(code(e).map(|c| c.1), Some(Some("Host".to_string())));
    }

    #[test]
    fn a_write_s_body_must_declare_json_or_yaml() {
        let g = guard();
        let with = |ct: &str| {
            headers(&[
                (header::HOST, "127.0.0.1:8120"),
                (header::CONTENT_TYPE, ct),
                (header::CONTENT_LENGTH, "2"),
            ])
        };
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/yaml",
        ] {
            assert_eq!(code(g.check(&Method::POST, None, &with(ok))), None, "{ok}");
        }
        let refused = Some((ErrorCode::UnsupportedMediaType, Some("Content-Type".into())));
        for bad in [
            "text/plain",
            "text/plain; charset=utf-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            assert_eq!(
                code(g.check(&Method::POST, None, &with(bad))),
                refused,
                "{bad}"
            );
            assert_eq!(
                code(g.check(&Method::DELETE, None, &with(bad))),
                refused,
                "{bad}"
            );
            // Reads carry no body that changes anything.
            assert_eq!(code(g.check(&Method::GET, None, &with(bad))), None, "{bad}");
        }
        let untyped = headers(&[
            (header::HOST, "127.0.0.1:8120"),
            (header::CONTENT_LENGTH, "2"),
        ]);
        assert_eq!(code(g.check(&Method::POST, None, &untyped)), refused);
        let bodiless = headers(&[
            (header::HOST, "127.0.0.1:8120"),
            (header::CONTENT_LENGTH, "0"),
        ]);
        assert_eq!(code(g.check(&Method::POST, None, &bodiless)), None);
    }
}
