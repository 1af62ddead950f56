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

/// The bearer token of `Authorization`, if any; a header that is there but not a bearer token
/// is a bad credential, not an absent one.
fn bearer(headers: &HeaderMap) -> Result<Option<SecretToken>, AuthError> {
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
