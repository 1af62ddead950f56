//! Operator tokens: create (the secret is made here and answered once; only its SHA-256
//! enters the log, INV-13), list (never a secret or a hash), revoke.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{delete, get, post};
use axum::Json;
use squadron_api::{CreateToken, CreatedToken, TokenView};
use squadron_core::access::TokenId;
use squadron_core::command as cmd;
use squadron_core::ids::Digest;
use squadron_core::quantity::parse_duration_ms;
use squadron_core::{Command, Outcome};
use squadron_pki::{SecretToken, TokenKind};

use super::{
    body, json, parse_id, query, read, write, AppState, ConsistencyQuery, Input, JsonBody,
    QueryParams, RouteBook,
};
use crate::authz::Caller;
use crate::error::ApiError;
use squadron_api::Access;

/// The longest life a token may be given (`ttl`); a token without one lives until revoked.
pub const TOKEN_TTL_MS_MAX: u64 = 10 * 365 * 24 * 60 * 60 * 1000;

pub fn routes(book: RouteBook) -> RouteBook {
    book.add(
        "POST",
        "/api/v1/tokens",
        "Create an operator token; the answer holds its secret, shown this once",
        body::<squadron_api::CreateToken>(),
        json::<CreatedToken>(),
        Access::admin(),
        post(create),
    )
    .add(
        "GET",
        "/api/v1/tokens",
        "List operator tokens (names, roles, scopes, lifetimes; never a secret)",
        query::<ConsistencyQuery>(),
        json::<Vec<TokenView>>(),
        Access::admin(),
        get(list),
    )
    .add(
        "DELETE",
        "/api/v1/tokens/:id",
        "Revoke an operator token",
        Input::NONE,
        json::<Outcome>(),
        Access::admin(),
        delete(revoke),
    )
}

async fn create(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(b): JsonBody<CreateToken>,
) -> Result<Json<CreatedToken>, ApiError> {
    let expires_at_ms = b
        .ttl
        .as_deref()
        .map(|ttl| expiry(node.clock.now_ms(), ttl))
        .transpose()?;
    let secret = SecretToken::generate(TokenKind::Operator);
    let id: TokenId = parse_id("id", secret.id())?;
    let command = Command::CreateOperatorToken(cmd::CreateOperatorToken {
        id: id.clone(),
        digest: Digest::from_bytes(secret.hash().0),
        role: b.role,
        scope: b.scope.clone(),
        name: b.name.clone(),
        expires_at_ms,
    });
    let Json(outcome) = write(&node, &caller, &headers, command).await?;
    match outcome {
        Outcome::OperatorTokenCreated { id: created } if created == id => Ok(Json(CreatedToken {
            id,
            token: secret.expose(),
            name: b.name,
            role: b.role,
            scope: b.scope,
            expires_at_ms,
        })),
        // A retry under an Idempotency-Key gets the first request's answer, whose secret went
        // to that request: this one's secret belongs to no token and must not be shown.
        Outcome::OperatorTokenCreated { id: created } => Err(ApiError::invalid(
            "Idempotency-Key",
            format!(
                "token {created} was created by the first request with this key and its \
                 secret was answered then; revoke it and create another if it was lost"
            ),
        )),
        other => Err(ApiError::internal(format!("unexpected outcome {other:?}"))),
    }
}

fn expiry(now_ms: u64, ttl: &str) -> Result<u64, ApiError> {
    let ms = parse_duration_ms("ttl", ttl)?;
    if ms == 0 || ms > TOKEN_TTL_MS_MAX {
        return Err(ApiError::invalid(
            "ttl",
            format!("must be more than 0 and at most {TOKEN_TTL_MS_MAX} ms, got {ttl:?}"),
        ));
    }
    Ok(now_ms.saturating_add(ms))
}

async fn list(
    State(node): State<AppState>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<Vec<TokenView>>, ApiError> {
    read(&node, q.consistency, |s| {
        let tokens = s.operator_tokens().map(|t| TokenView {
            id: t.id.clone(),
            name: t.name.clone(),
            role: t.role,
            scope: t.scope.clone(),
            created_at_ms: t.created_at_ms,
            created_by: t.created_by.clone(),
            expires_at_ms: t.expires_at_ms,
            revoked_at_ms: t.revoked_at_ms,
        });
        Ok(Json(tokens.collect()))
    })
    .await
}

async fn revoke(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Outcome>, ApiError> {
    let id: TokenId = parse_id("token_id", &id)?;
    write(
        &node,
        &caller,
        &headers,
        Command::RevokeOperatorToken(cmd::RevokeOperatorToken { id }),
    )
    .await
}
