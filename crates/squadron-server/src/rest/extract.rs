//! Extractors that turn malformed requests into `invalid_argument` answers naming the field.

use std::str::FromStr;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;
use squadron_core::ValidationError;

use crate::error::ApiError;

/// A JSON body; errors name the field path (`holder.worker`) instead of a generic 422.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

#[axum::async_trait]
impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // A JSON body only with a JSON media type: a browser may send `text/plain` across
        // origins without asking first, never `application/json`.
        match super::browser_guard::media_type(req.headers()) {
            Some(t) if t == "application/json" => {}
            other => {
                return Err(super::browser_guard::unsupported(format!(
                    "this route takes application/json, got {}",
                    other.map_or("no Content-Type".to_string(), |t| format!("{t:?}"))
                )))
            }
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    squadron_core::error_code::ErrorCode::PayloadTooLarge,
                    "request body is larger than this server accepts",
                )
            } else {
                ApiError::invalid("body", e.body_text())
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path.is_empty() {
            "body".to_string()
        } else {
            path
        };
        let inner = e.into_inner();
        // A validated id deserializes through its constructor; keep the constructor's words.
        ApiError::from(ValidationError::new(field, inner.to_string()))
    })
}

/// Parses a path segment into a validated id, naming the parameter on failure.
pub fn parse_id<T>(field: &str, raw: &str) -> Result<T, ApiError>
where
    T: FromStr<Err = ValidationError>,
{
    raw.parse::<T>()
        .map_err(|e| ApiError::from(ValidationError::new(field, e.reason)))
}

/// A query string; unknown or malformed parameters are `invalid_argument`.
#[derive(Debug)]
pub struct QueryParams<T>(pub T);

#[axum::async_trait]
impl<S, T> axum::extract::FromRequestParts<S> for QueryParams<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        // The refusal names the parameter (`limit`), or `query` when none is to blame.
        squadron_api::queries::decode_query(query)
            .map(QueryParams)
            .map_err(|r| ApiError::invalid(r.field, r.message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use squadron_core::error_code::ErrorCode;

    async fn extract(content_type: Option<&str>) -> Result<serde_json::Value, ApiError> {
        let mut req = Request::builder().method("POST").uri("/x");
        if let Some(t) = content_type {
            req = req.header("content-type", t);
        }
        let req = req.body(Body::from(r#"{"a": 1}"#)).expect("request");
        JsonBody::<serde_json::Value>::from_request(req, &())
            .await
            .map(|JsonBody(v)| v)
    }

    /// The peer routes take `JsonBody` without the REST listener's guard in front: the
    /// extractor itself refuses a body a browser could send across origins.
    #[tokio::test]
    async fn a_json_body_needs_a_json_media_type() {
        let ok = extract(Some("application/json; charset=utf-8")).await;
        assert_eq!(ok.expect("json")["a"], 1);
        for t in [
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            None,
        ] {
            let e = extract(t).await.expect_err("refused");
            assert_eq!(e.code(), ErrorCode::UnsupportedMediaType, "{t:?}");
            assert_eq!(e.body.field.as_deref(), Some("Content-Type"), "{t:?}");
        }
    }
}
