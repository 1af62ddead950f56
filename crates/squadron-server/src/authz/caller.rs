//! Who is calling: the bearer token's operator, or the identity in the client certificate the
//! TLS layer verified. Nothing a request says about itself (a worker id in a body, a header)
//! is believed here (DESIGN §5).

use axum::http::{header, HeaderMap};
use squadron_core::access::{AgentIdentity, CertSerial, ProjectScope, Role, Subject, TokenId};
use squadron_core::ids::{Generation, ProfileId, ProjectId, TaskId, TenantId, WorkerId};
use squadron_core::State;
use squadron_pki::{AgentSubject, CertFacts, SecretToken, SpiffeId, TokenHash, TokenKind};

use super::{scope_covers, AuthError};

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No credential at all (public routes only).
    Anonymous,
    Operator {
        token: TokenId,
        role: Role,
        /// Empty: everywhere.
        scope: Vec<ProjectScope>,
    },
    Worker(WorkerId),
    Agent(AgentIdentity),
    /// A control node's certificate: it speaks for no caller on the API listeners.
    Node(u64),
}

impl Caller {
    /// The subject recorded with every command this caller causes. Nobody unauthenticated
    /// proposes anything: `System` and `Legacy` would pass the core's checks, so an anonymous
    /// caller has no subject at all (enrollment proposes as the node itself).
    pub fn subject(&self) -> Result<Subject, AuthError> {
        Ok(match self {
            Caller::Anonymous => {
                return Err(AuthError::Unauthenticated(
                    "an unauthenticated caller may not change anything".into(),
                ))
            }
            Caller::Operator { token, .. } => Subject::Operator(token.clone()),
            Caller::Worker(w) => Subject::Worker(w.clone()),
            Caller::Agent(a) => Subject::Agent(*a),
            Caller::Node(id) => Subject::Node(*id),
        })
    }

    /// Resolves the caller of a request: a bearer token, when one is sent, decides; otherwise
    /// the client certificate; otherwise nobody.
    pub fn resolve(
        state: &State,
        now_ms: u64,
        headers: &HeaderMap,
        cert: Option<&CertFacts>,
    ) -> Result<Caller, AuthError> {
        if let Some(token) = bearer(headers)? {
            return operator(state, now_ms, &token);
        }
        match cert {
            Some(facts) => of_certificate(state, now_ms, facts),
            None => Ok(Caller::Anonymous),
        }
    }
}

impl Caller {
    /// For routes whose body names the project (creation, submission): an operator's token
    /// must cover it; `None` is an object outside any project (a dedicated task), which only
    /// an unscoped token reaches. Certificates are held to their objects by the core.
    pub fn require_project(
        &self,
        project: Option<(&TenantId, &ProjectId)>,
    ) -> Result<(), AuthError> {
        if self.sees(project) {
            return Ok(());
        }
        Err(match project {
            Some((t, p)) => {
                AuthError::forbidden(format!("project {t}/{p} is outside the token's scope"))
            }
            None => AuthError::forbidden(
                "a token scoped to projects may not reach objects outside any project \
                 (dedicated tasks)",
            ),
        })
    }

    /// Whether a listing shows this caller an object of `project` (`None`: outside any).
    /// Listings call it per object, so it decides without building a refusal.
    pub fn sees(&self, project: Option<(&TenantId, &ProjectId)>) -> bool {
        match self {
            Caller::Operator { scope, .. } if !scope.is_empty() => {
                project.is_some_and(|(t, p)| scope_covers(scope, t, p))
            }
            _ => true,
        }
    }
}

/// A browser cannot set `Authorization` on a WebSocket, so an upgrade request may carry the
/// token as the subprotocol `bearer.<token>`, offered beside the non-secret protocol the
/// stream answers with (`rest::task_output::STREAM_PROTOCOL`). Never in the query string: a
/// URL ends up in logs and in the browser's history.
pub const WS_BEARER_PROTOCOL_PREFIX: &str = "bearer.";

/// The caller's bearer token: `Authorization`, or on a WebSocket upgrade the bearer
/// subprotocol. A credential that is there but malformed is a bad credential, not an absent
/// one; two of them (header and subprotocol) are refused rather than one silently chosen.
fn bearer(headers: &HeaderMap) -> Result<Option<SecretToken>, AuthError> {
    let from_header = authorization_bearer(headers)?;
    let from_protocol = if is_websocket_upgrade(headers) {
        protocol_bearer(headers)?
    } else {
        None
    };
    match (from_header, from_protocol) {
        (Some(_), Some(_)) => Err(AuthError::bad(
            "send the token once: in Authorization or in the WebSocket subprotocol, not both",
        )),
        (header, protocol) => Ok(header.or(protocol)),
    }
}

/// The bearer token of `Authorization`, if any.
fn authorization_bearer(headers: &HeaderMap) -> Result<Option<SecretToken>, AuthError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| AuthError::bad("the Authorization header is not ASCII"))?;
    let token = text
        .strip_prefix("Bearer ")
        .or_else(|| text.strip_prefix("bearer "))
        .ok_or_else(|| AuthError::bad("the Authorization header must be `Bearer <token>`"))?;
    SecretToken::parse(TokenKind::Operator, token)
        .map(Some)
        .map_err(|e| AuthError::bad(e.to_string()))
}

/// An HTTP/1.1 WebSocket opening handshake (RFC 6455 §4.1): the only requests whose
/// subprotocol list may carry a token.
fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    let lists = |name: header::HeaderName, item: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|t| t.split(',').any(|i| i.trim().eq_ignore_ascii_case(item)))
        })
    };
    lists(header::UPGRADE, "websocket")
        && lists(header::CONNECTION, "upgrade")
        && headers.contains_key(header::SEC_WEBSOCKET_KEY)
}

/// The token of the one `bearer.<token>` entry of `Sec-WebSocket-Protocol`, if any. Errors
/// never repeat the header: it holds a secret.
fn protocol_bearer(headers: &HeaderMap) -> Result<Option<SecretToken>, AuthError> {
    let mut found = None;
    for value in headers.get_all(header::SEC_WEBSOCKET_PROTOCOL) {
        let text = value
            .to_str()
            .map_err(|_| AuthError::bad("the Sec-WebSocket-Protocol header is not ASCII"))?;
        let tokens = text
            .split(',')
            .filter_map(|p| p.trim().strip_prefix(WS_BEARER_PROTOCOL_PREFIX));
        for token in tokens {
            if found.is_some() {
                return Err(AuthError::bad(
                    "more than one bearer subprotocol; offer the token once",
                ));
            }
            let parsed = SecretToken::parse(TokenKind::Operator, token)
                .map_err(|e| AuthError::bad(format!("the bearer WebSocket subprotocol: {e}")))?;
            found = Some(parsed);
        }
    }
    Ok(found)
}

fn operator(state: &State, now_ms: u64, token: &SecretToken) -> Result<Caller, AuthError> {
    let unknown = || AuthError::bad("unknown or revoked token");
    let id = TokenId::new(token.id()).map_err(|_| unknown())?;
    let record = state.operator_token(&id).ok_or_else(unknown)?;
    // Compared in constant time; an unknown id and a wrong secret answer alike.
    if !TokenHash(*record.digest.as_bytes()).matches(token) || !record.is_live(now_ms) {
        return Err(unknown());
    }
    Ok(Caller::Operator {
        token: id,
        role: record.role,
        scope: record.scope.clone(),
    })
}

fn of_certificate(state: &State, now_ms: u64, facts: &CertFacts) -> Result<Caller, AuthError> {
    // Certificates made offline (`squadron init`) are not recorded; enrolled ones are, and a
    // revoked one stops here even though the TLS layer accepted its signature.
    if let Ok(serial) = CertSerial::new(facts.serial_hex.clone()) {
        if let Some(record) = state.certificate(&serial) {
            if !record.is_live(now_ms) {
                return Err(AuthError::bad(
                    "the client certificate is revoked or expired",
                ));
            }
        }
    }
    let bad_id = |e: squadron_core::ValidationError| AuthError::bad(e.to_string());
    Ok(match &facts.identity {
        SpiffeId::Node(id) => Caller::Node(*id),
        SpiffeId::Worker(w) => Caller::Worker(w.clone()),
        SpiffeId::Agent(AgentSubject::Task(t)) => {
            Caller::Agent(AgentIdentity::Task(TaskId::new(*t).map_err(bad_id)?))
        }
        SpiffeId::Agent(AgentSubject::ProfileGeneration {
            profile,
            generation,
        }) => Caller::Agent(AgentIdentity::ProfileGeneration {
            profile: ProfileId::new(*profile).map_err(bad_id)?,
            generation: Generation::new(*generation),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn token() -> String {
        SecretToken::generate(TokenKind::Operator).expose()
    }

    fn upgrade(protocols: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        h.insert(
            header::SEC_WEBSOCKET_KEY,
            HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="),
        );
        for p in protocols {
            h.append(
                header::SEC_WEBSOCKET_PROTOCOL,
                HeaderValue::from_str(p).unwrap(),
            );
        }
        h
    }

    fn with_authorization(mut h: HeaderMap, token: &str) -> HeaderMap {
        let value = HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
        h.insert(header::AUTHORIZATION, value);
        h
    }

    fn refusal(h: &HeaderMap) -> String {
        match bearer(h) {
            Err(AuthError::Unauthenticated(m)) => m,
            other => panic!("expected a 401, got {other:?}"),
        }
    }

    #[test]
    fn an_upgrade_s_bearer_subprotocol_carries_the_token() {
        let t = token();
        let one = upgrade(&[&format!("squadron.v1, bearer.{t}")]);
        assert_eq!(bearer(&one).unwrap().map(|s| s.expose()), Some(t.clone()));
        // The list may come as several header lines.
        let split = upgrade(&["squadron.v1", &format!("bearer.{t}")]);
        assert_eq!(bearer(&split).unwrap().map(|s| s.expose()), Some(t.clone()));
        // Without a bearer entry the caller is whoever else it is (a certificate, nobody).
        assert_eq!(bearer(&upgrade(&["squadron.v1"])).unwrap(), None);
        // The CLI's form keeps working on an upgrade.
        let cli = with_authorization(upgrade(&[]), &t);
        assert_eq!(bearer(&cli).unwrap().map(|s| s.expose()), Some(t));
    }

    #[test]
    fn a_bearer_subprotocol_outside_an_upgrade_is_not_a_credential() {
        let t = token();
        let mut h = HeaderMap::new();
        let list = format!("squadron.v1, bearer.{t}");
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_str(&list).unwrap(),
        );
        assert_eq!(bearer(&h).unwrap(), None);
        // An `Upgrade` without the rest of the handshake is not one either.
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert_eq!(bearer(&h).unwrap(), None);
    }

    #[test]
    fn bad_or_doubled_subprotocol_tokens_are_refused_without_repeating_them() {
        let t = token();
        let both = with_authorization(upgrade(&[&format!("squadron.v1, bearer.{t}")]), &t);
        assert!(refusal(&both).contains("not both"));
        let twice = upgrade(&[&format!("bearer.{t}"), &format!("bearer.{t}")]);
        assert!(refusal(&twice).contains("more than one"));
        let secret = "sqd_op_0123456789abcdef_nothex";
        let message = refusal(&upgrade(&[&format!("squadron.v1, bearer.{secret}")]));
        assert!(
            message.contains("bearer WebSocket subprotocol"),
            "{message}"
        );
        assert!(!message.contains("nothex"), "{message}");
        assert!(!message.contains("0123456789abcdef"), "{message}");
    }
}
