//! The middleware that applies the access table: one instance per REST route (carrying that
//! route's rule), one in front of the gRPC services (looking the method up by path).

use axum::body::Body;
use axum::extract::{FromRequestParts, RawPathParams, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use squadron_api::Access;
use squadron_pki::PeerCert;

use super::{decide, AuthError, Caller, Target};
use crate::error::ApiError;
use crate::rest::AppState;

/// One route's rule and the node whose state resolves callers and objects.
#[derive(Debug, Clone)]
pub struct RouteGuard {
    pub node: AppState,
    pub access: Access,
}

/// Admits the request under its route's rule, or answers 401/403 without running the handler.
pub async fn rest_guard(
    State(guard): State<RouteGuard>,
    params: Option<RawPathParams>,
    mut request: Request,
    next: Next,
) -> Response {
    let param = |name: &str| {
        params.as_ref().and_then(|ps| {
            ps.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_owned())
        })
    };
    match admit(&guard.node, &guard.access, &request, param) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(e) => e.into_response(),
    }
}

fn admit(
    node: &AppState,
    access: &Access,
    request: &Request,
    param: impl Fn(&str) -> Option<String>,
) -> Result<Caller, AuthError> {
    if access.public {
        return Ok(Caller::Anonymous);
    }
    let cert = request
        .extensions()
        .get::<PeerCert>()
        .and_then(|p| p.0.as_ref());
    let now = node.clock.now_ms();
    node.state.with_state(|state| {
        let caller = Caller::resolve(state, now, request.headers(), cert)?;
        let target = Target::resolve(access.scope, state, param);
        decide(access, &caller, &target)?;
        Ok(caller)
    })
}

/// The gRPC listener's guard: the method's row of `GRPC_METHODS`; a method without one is
/// refused, so a service added without a rule is unreachable rather than open.
pub async fn grpc_guard(
    State(node): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(access) = squadron_api::grpc_access(request.uri().path()) else {
        return grpc_refusal(tonic::Status::unimplemented(
            "no such method on this listener",
        ));
    };
    match admit(&node, &access, &request, |_| None) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        // The one error table maps the code to gRPC, as for every other refusal.
        Err(e) => grpc_refusal(crate::grpc::status(e.code(), e.to_string())),
    }
}

/// A trailers-only gRPC answer (the status in the headers), as tonic encodes one.
fn grpc_refusal(status: tonic::Status) -> Response {
    let (parts, _) = status.into_http().into_parts();
    Response::from_parts(parts, Body::empty())
}

#[axum::async_trait]
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::internal("no access rule was applied to this route"))
    }
}
