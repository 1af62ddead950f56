//! Enrollment (DESIGN §5): minting one-time bootstrap tokens (admin) and exchanging one, with
//! a CSR, for a worker certificate. The certificate is signed here but answered only once the
//! replicated `Enroll` that consumes the token is applied, so a token presented twice — even
//! at two nodes at once — yields one certificate.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Json;
use squadron_api::{
    Access, EnrollAgent, EnrollWorker, Enrolled, MintAgentToken, MintBootstrap, MintedAgentToken,
    MintedBootstrap, RenewCertificate, Scope,
};
use squadron_core::access::{AgentIdentity, BootstrapPurpose, CertSerial, Identity, TokenId};
use squadron_core::command as cmd;
use squadron_core::ids::{Digest, IdempotencyKey, TaskId, WorkerId};
use squadron_core::limits::{
    AGENT_TOKEN_TTL_MS_MAX, BOOTSTRAP_TOKEN_TTL_MS_MAX, BOOTSTRAP_TOKEN_TTL_MS_MIN,
};
use squadron_core::quantity::parse_duration_ms;
use squadron_core::{Command, Outcome};
use squadron_pki::{
    load_ca, AgentSubject, CertUse, IssuedCert, PkiDir, SecretToken, SpiffeId, SubjectName,
    TokenKind, LOOPBACK_NAMES,
};

use super::{body, json, parse_id, write, write_as, AppState, JsonBody, RouteBook};
use crate::authz::{AuthError, Caller};
use crate::error::ApiError;

/// A bootstrap token's life when the request names none.
pub const BOOTSTRAP_TTL_MS_DEFAULT: u64 = 10 * 60 * 1000;
/// Added to a bootstrap token's life for the time between this node's clock reading and the
/// leader's applying the mint.
pub const MINT_SLACK_MS: u64 = 2_000;
/// An enrolled worker certificate's life; the worker renews it before it ends.
pub const WORKER_CERT_VALIDITY_MS: u64 = 24 * 3_600 * 1_000;
/// Host names a worker may ask its certificate to carry besides loopback.
pub const ENROLL_HOSTS_MAX: usize = 8;

pub fn routes(book: RouteBook) -> RouteBook {
    book.add(
        "POST",
        "/api/v1/bootstrap-tokens",
        "Mint a one-time bootstrap token for a worker's enrollment; its secret is shown once",
        body::<squadron_api::MintBootstrap>(),
        json::<MintedBootstrap>(),
        Access::admin(),
        post(mint),
    )
    .add(
        "POST",
        "/api/v1/enroll",
        "Exchange a bootstrap token and a CSR for a worker certificate (the token is the credential)",
        body::<squadron_api::EnrollWorker>(),
        json::<Enrolled>(),
        Access::PUBLIC,
        post(enroll),
    )
    .add(
        "POST",
        "/api/v1/enroll/agent",
        "The agent inside a sandbox exchanges the token its worker minted and a CSR for its \
         certificate (the token is the credential)",
        body::<squadron_api::EnrollAgent>(),
        json::<Enrolled>(),
        Access::PUBLIC,
        post(enroll_agent),
    )
    .add(
        "POST",
        "/api/v1/workers/:id/certificate",
        "A worker renews its certificate under the live one it holds (a fresh key pair's CSR)",
        body::<squadron_api::RenewCertificate>(),
        json::<Enrolled>(),
        Access::worker_only(Scope::Worker),
        post(renew),
    )
}

async fn mint(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(b): JsonBody<MintBootstrap>,
) -> Result<Json<MintedBootstrap>, ApiError> {
    let ttl_ms = match b.ttl.as_deref() {
        Some(t) => parse_duration_ms("ttl", t)?,
        None => BOOTSTRAP_TTL_MS_DEFAULT,
    };
    if !(BOOTSTRAP_TOKEN_TTL_MS_MIN..=BOOTSTRAP_TOKEN_TTL_MS_MAX).contains(&ttl_ms) {
        return Err(ApiError::invalid(
            "ttl",
            format!(
                "a bootstrap token lives 10s to 24h ({BOOTSTRAP_TOKEN_TTL_MS_MIN} to \
                 {BOOTSTRAP_TOKEN_TTL_MS_MAX} ms), got {ttl_ms} ms"
            ),
        ));
    }
    // The leader checks the life against its own clock when it applies the command, a
    // moment after this one read it: the slack keeps the shortest life admissible.
    let life_ms = (ttl_ms + MINT_SLACK_MS).min(BOOTSTRAP_TOKEN_TTL_MS_MAX);
    let secret = SecretToken::generate(TokenKind::Bootstrap);
    let id: TokenId = parse_id("id", secret.id())?;
    let command = Command::MintBootstrapToken(cmd::MintBootstrapToken {
        id: id.clone(),
        digest: Digest::from_bytes(secret.hash().0),
        purpose: BootstrapPurpose::Worker {
            worker: b.worker.clone(),
        },
        expires_at_ms: node.clock.now_ms().saturating_add(life_ms),
    });
    let Json(outcome) = write(&node, &caller, &headers, command).await?;
    let expires_at_ms = minted(outcome, &id)?;
    Ok(Json(MintedBootstrap {
        id,
        token: secret.expose(),
        worker: b.worker,
        expires_at_ms,
    }))
}

/// When the token minted under `id` expires; a keyed retry's answer names the first
/// request's token, whose secret went to that request.
fn minted(outcome: Outcome, id: &TokenId) -> Result<u64, ApiError> {
    match outcome {
        Outcome::BootstrapTokenMinted {
            id: minted,
            expires_at_ms,
        } if minted == *id => Ok(expires_at_ms),
        Outcome::BootstrapTokenMinted { id: minted, .. } => Err(ApiError::invalid(
            "Idempotency-Key",
            format!("bootstrap token {minted} was minted by the first request with this key"),
        )),
        other => Err(ApiError::internal(format!("unexpected outcome {other:?}"))),
    }
}

async fn enroll(
    State(node): State<AppState>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<EnrollWorker>,
) -> Result<Json<Enrolled>, ApiError> {
    let identity = Identity::Worker(b.worker.clone());
    exchange(&node, &headers, &b.token, identity, &b.csr_pem, &b.hosts)
        .await
        .map(Json)
}

async fn enroll_agent(
    State(node): State<AppState>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<EnrollAgent>,
) -> Result<Json<Enrolled>, ApiError> {
    let identity = Identity::Agent(b.agent);
    exchange(&node, &headers, &b.token, identity, &b.csr_pem, &[])
        .await
        .map(Json)
}

/// A bootstrap token and a CSR exchanged for `identity`'s certificate, answered only once the
/// `Enroll` that consumes the token is applied.
async fn exchange(
    node: &AppState,
    headers: &HeaderMap,
    token: &str,
    identity: Identity,
    csr_pem: &str,
    hosts: &[String],
) -> Result<Enrolled, ApiError> {
    let token = SecretToken::parse(TokenKind::Bootstrap, token)
        .map_err(|e| AuthError::Unauthenticated(e.to_string()))?;
    let token_id: TokenId = TokenId::new(token.id())
        .map_err(|_| AuthError::Unauthenticated("the bootstrap token is not accepted".into()))?;
    let (spiffe, validity_ms) = certificate_of(node, &identity);
    let signed = sign(node, &spiffe, csr_pem, hosts, validity_ms)?;
    let command = Command::Enroll(cmd::Enroll {
        token: token_id,
        presented: Digest::from_bytes(token.hash().0),
        identity,
        serial: signed.serial.clone(),
        not_after_ms: signed.not_after_ms,
    });
    // Nobody is authenticated yet: the token is checked by the command itself, which the
    // node proposes as its own act.
    let subject = squadron_core::access::Subject::Node(node.id);
    let Json(outcome) = write_as(node, subject, headers, command).await?;
    match outcome {
        Outcome::Enrolled { serial, .. } => signed.answer(&serial),
        other => Err(ApiError::internal(format!("unexpected outcome {other:?}"))),
    }
}

fn agent_spiffe(agent: &AgentIdentity) -> SpiffeId {
    SpiffeId::Agent(match agent {
        AgentIdentity::Task(t) => AgentSubject::Task(t.get()),
        AgentIdentity::ProfileGeneration {
            profile,
            generation,
        } => AgentSubject::ProfileGeneration {
            profile: profile.get(),
            generation: generation.get(),
        },
    })
}

/// The one-time token of the agent of `task`, for the worker that provisions it
/// (`WorkerControl`); the core refuses any other caller.
pub(crate) async fn mint_agent_token(
    node: &AppState,
    caller: &Caller,
    key: Option<IdempotencyKey>,
    task: TaskId,
    b: MintAgentToken,
) -> Result<MintedAgentToken, ApiError> {
    if !(BOOTSTRAP_TOKEN_TTL_MS_MIN..=AGENT_TOKEN_TTL_MS_MAX).contains(&b.ttl_ms) {
        return Err(ApiError::invalid(
            "ttl_ms",
            format!(
                "an agent token lives {BOOTSTRAP_TOKEN_TTL_MS_MIN} to {AGENT_TOKEN_TTL_MS_MAX} \
                 ms, got {}",
                b.ttl_ms
            ),
        ));
    }
    let agent = AgentIdentity::Task(task);
    let secret = SecretToken::generate(TokenKind::Bootstrap);
    let id: TokenId = parse_id("id", secret.id())?;
    let command = Command::MintBootstrapToken(cmd::MintBootstrapToken {
        id: id.clone(),
        digest: Digest::from_bytes(secret.hash().0),
        purpose: BootstrapPurpose::Agent { agent },
        expires_at_ms: node.clock.now_ms().saturating_add(b.ttl_ms + MINT_SLACK_MS),
    });
    let outcome = super::write_keyed(node, caller.subject()?, key, command).await?;
    let expires_at_ms = minted(outcome, &id)?;
    Ok(MintedAgentToken {
        id,
        token: secret.expose(),
        agent,
        expires_at_ms,
    })
}

async fn renew(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<RenewCertificate>,
) -> Result<Json<Enrolled>, ApiError> {
    let worker: WorkerId = parse_id("worker_id", &id)?;
    let key = super::idempotency_key(&headers)?;
    renew_certificate(&node, &caller, key, worker, b)
        .await
        .map(Json)
}

/// Signs the worker's new key and records the certificate; answered once the record is
/// applied (REST and gRPC `WorkerControl`).
pub(crate) async fn renew_certificate(
    node: &AppState,
    caller: &Caller,
    key: Option<IdempotencyKey>,
    worker: WorkerId,
    b: RenewCertificate,
) -> Result<Enrolled, ApiError> {
    renew_identity(
        node,
        caller,
        key,
        Identity::Worker(worker),
        &b.csr_pem,
        &b.hosts,
    )
    .await
}

/// Signs a new key of `identity`, which the caller must be (the core holds it to that, and an
/// agent to a task that has not ended), and records the certificate; answered once the record
/// is applied.
pub(crate) async fn renew_identity(
    node: &AppState,
    caller: &Caller,
    key: Option<IdempotencyKey>,
    identity: Identity,
    csr_pem: &str,
    hosts: &[String],
) -> Result<Enrolled, ApiError> {
    let (spiffe, validity_ms) = certificate_of(node, &identity);
    let signed = sign(node, &spiffe, csr_pem, hosts, validity_ms)?;
    let command = Command::RecordCertificate(cmd::RecordCertificate {
        identity,
        serial: signed.serial.clone(),
        not_after_ms: signed.not_after_ms,
    });
    match super::write_keyed(node, caller.subject()?, key, command).await? {
        Outcome::CertificateRecorded { serial, .. } => signed.answer(&serial),
        other => Err(ApiError::internal(format!("unexpected outcome {other:?}"))),
    }
}

/// The certificate `identity` gets: its SPIFFE id and its life.
fn certificate_of(node: &AppState, identity: &Identity) -> (SpiffeId, u64) {
    match identity {
        Identity::Worker(w) => (SpiffeId::Worker(w.clone()), WORKER_CERT_VALIDITY_MS),
        Identity::Agent(a) => (agent_spiffe(a), node.config.server.agent_cert_ttl_ms),
    }
}

/// A certificate signed here, answered only once its record is applied.
struct Signed {
    cert: IssuedCert,
    serial: CertSerial,
    not_after_ms: u64,
}

impl Signed {
    /// The answer, if the applied record is this certificate's (a keyed retry's outcome
    /// names the first request's certificate, whose key this request does not hold).
    fn answer(self, recorded: &CertSerial) -> Result<Enrolled, ApiError> {
        if *recorded != self.serial {
            return Err(ApiError::internal(format!(
                "the applied record names certificate {recorded}, not the one signed here"
            )));
        }
        Ok(Enrolled {
            cert_pem: self.cert.cert_pem,
            ca_pem: self.cert.ca_pem,
            serial: self.serial.to_string(),
            not_after_ms: self.not_after_ms,
        })
    }
}

/// Signs a CSR for `identity` with the cluster CA this node holds; a worker's certificate
/// also serves its output listener at loopback and `hosts`, an agent's only dials.
fn sign(
    node: &AppState,
    identity: &SpiffeId,
    csr_pem: &str,
    hosts: &[String],
    validity_ms: u64,
) -> Result<Signed, ApiError> {
    if hosts.len() > ENROLL_HOSTS_MAX {
        return Err(ApiError::invalid(
            "hosts",
            format!("at most {ENROLL_HOSTS_MAX} host names"),
        ));
    }
    let pki = PkiDir::of_data_dir(&node.config.data_dir);
    let ca = load_ca(&pki)
        .map_err(|e| ApiError::unavailable(format!("this node cannot sign certificates: {e}")))?;
    let (names, usage): (Vec<SubjectName>, _) = match identity {
        SpiffeId::Agent(_) => (Vec::new(), CertUse::Client),
        _ => (
            LOOPBACK_NAMES
                .iter()
                .copied()
                .chain(hosts.iter().map(String::as_str))
                .map(SubjectName::of_host)
                .collect(),
            CertUse::ServerAndClient,
        ),
    };
    let pem = ca
        .sign_csr(
            csr_pem,
            identity,
            &names,
            Duration::from_millis(validity_ms),
            usage,
        )
        .map_err(|e| ApiError::invalid("csr_pem", e.to_string()))?;
    let cert = IssuedCert::new(pem, String::new(), ca.cert_pem());
    let facts = cert
        .facts()
        .map_err(|e| ApiError::internal(format!("the signed certificate: {e}")))?;
    Ok(Signed {
        serial: CertSerial::new(facts.serial_hex)?,
        not_after_ms: facts.not_after_ms,
        cert,
    })
}
