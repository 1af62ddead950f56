//! Endpoint failover against tiny axum servers on 127.0.0.1:0.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{Generation, ProfileId, WorkerId};
use squadron_core::lease::LeaseHolder;
use squadron_core::provider::Provider;
use squadron_core::{Outcome, Rejection};

use super::*;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Answers at once.
    Live,
    /// Answers after two seconds (clients in these tests time out after 300 ms).
    Slow,
    /// Answers every request with 503 unavailable.
    Unavailable,
    /// Answers every request with a 409 stale-generation rejection.
    Stale,
}

#[derive(Clone)]
struct Recorder {
    mode: Mode,
    hits: Arc<AtomicUsize>,
    keys: Arc<Mutex<Vec<String>>>,
    queries: Arc<Mutex<Vec<String>>>,
}

struct TestServer {
    url: String,
    rec: Recorder,
}

impl TestServer {
    fn hits(&self) -> usize {
        self.rec.hits.load(Ordering::SeqCst)
    }
}

async fn answer(rec: &Recorder, headers: &HeaderMap, ok: serde_json::Value) -> impl IntoResponse {
    rec.hits.fetch_add(1, Ordering::SeqCst);
    if let Some(k) = headers
        .get(IDEMPOTENCY_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        rec.keys.lock().unwrap().push(k.to_string());
    }
    match rec.mode {
        Mode::Live => (StatusCode::OK, Json(ok)),
        Mode::Slow => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            (StatusCode::OK, Json(ok))
        }
        Mode::Unavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"code": "unavailable", "message": "no leader is known"})),
        ),
        Mode::Stale => {
            let body = ErrorBody {
                code: ErrorCode::Conflict,
                message: "stale generation: expected 1, current is 2".into(),
                field: None,
                rejection: Some(Rejection::StaleGeneration {
                    expected: Generation::new(1),
                    current: Generation::new(2),
                }),
            };
            (
                StatusCode::CONFLICT,
                Json(serde_json::to_value(body).unwrap()),
            )
        }
    }
}

async fn serve(mode: Mode) -> TestServer {
    let rec = Recorder {
        mode,
        hits: Arc::default(),
        keys: Arc::default(),
        queries: Arc::default(),
    };
    let app = Router::new()
        .route(
            "/api/v1/projects",
            get(
                |State(rec): State<Recorder>, headers: HeaderMap, RawQuery(q): RawQuery| async move {
                    rec.queries.lock().unwrap().push(q.unwrap_or_default());
                    answer(&rec, &headers, serde_json::json!([])).await
                },
            )
            .post(|State(rec): State<Recorder>, headers: HeaderMap| async move {
                answer(&rec, &headers, serde_json::json!("project_created")).await
            }),
        )
        .route(
            "/api/v1/profiles/:id/leases",
            post(|State(rec): State<Recorder>, headers: HeaderMap| async move {
                let grant = serde_json::json!({"lease_granted": {
                    "profile": 1, "lease": 7, "generation": 2, "expires_at_ms": 99}});
                answer(&rec, &headers, grant).await
            }),
        )
        .with_state(rec.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    TestServer {
        url: format!("http://{addr}"),
        rec,
    }
}

/// An address nothing listens on: connections to it are refused.
fn refused() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

fn client(endpoints: Vec<String>) -> SquadronClient {
    SquadronClient::with_timeouts(
        endpoints,
        Duration::from_millis(300),
        Duration::from_millis(300),
    )
}

fn project() -> CreateProject {
    CreateProject {
        tenant: "acme".parse().unwrap(),
        project: "web".parse().unwrap(),
        max_profiles: None,
        max_active: None,
    }
}

fn acquire() -> AcquireLease {
    AcquireLease {
        expected_generation: Generation::new(1),
        provider: Provider::Codex,
        holder: LeaseHolder {
            worker: WorkerId::new("w1").unwrap(),
            process: "test".into(),
            cgroup: None,
        },
        ttl_ms: 30_000,
    }
}

#[tokio::test]
async fn read_moves_past_a_refused_endpoint_and_sticks_to_the_live_one() {
    let live = serve(Mode::Live).await;
    let c = client(vec![refused(), live.url.clone()]);
    assert!(c
        .list_projects(Consistency::default())
        .await
        .unwrap()
        .is_empty());
    assert_eq!(c.preferred_endpoint(), Some(live.url.as_str()));
    c.list_projects(Consistency::default()).await.unwrap();
    assert_eq!(live.hits(), 2);
}

#[tokio::test]
async fn unkeyed_write_moves_on_when_the_connection_was_refused() {
    let live = serve(Mode::Live).await;
    let c = client(vec![refused(), live.url.clone()]);
    let out = c.create_project(&project(), None).await.unwrap();
    assert_eq!(out, Outcome::ProjectCreated);
    assert_eq!(live.hits(), 1);
}

#[tokio::test]
async fn unkeyed_write_that_timed_out_after_sending_is_not_resent() {
    let slow = serve(Mode::Slow).await;
    let live = serve(Mode::Live).await;
    let c = client(vec![slow.url.clone(), live.url.clone()]);
    let err = c.create_project(&project(), None).await.unwrap_err();
    assert!(
        matches!(err, ClientError::OutcomeUnknown { ref endpoint, .. } if *endpoint == slow.url),
        "{err:?}"
    );
    assert!(err.is_transport());
    assert_eq!(err.code(), ErrorCode::Unavailable);
    assert_eq!(slow.hits(), 1);
    assert_eq!(
        live.hits(),
        0,
        "a write of unknown outcome must not be sent again"
    );
}

#[tokio::test]
async fn keyed_write_that_timed_out_is_resent_with_the_same_key() {
    let slow = serve(Mode::Slow).await;
    let live = serve(Mode::Live).await;
    let c = client(vec![slow.url.clone(), live.url.clone()]);
    let key = new_idempotency_key();
    let out = c.create_project(&project(), Some(&key)).await.unwrap();
    assert_eq!(out, Outcome::ProjectCreated);
    assert_eq!(live.hits(), 1);
    assert_eq!(*slow.rec.keys.lock().unwrap(), vec![key.to_string()]);
    assert_eq!(*live.rec.keys.lock().unwrap(), vec![key.to_string()]);
}

#[tokio::test]
async fn read_that_timed_out_tries_the_next_endpoint() {
    let slow = serve(Mode::Slow).await;
    let live = serve(Mode::Live).await;
    let c = client(vec![slow.url.clone(), live.url.clone()]);
    c.list_projects(Consistency::Stale).await.unwrap();
    assert_eq!(live.hits(), 1);
    assert_eq!(*live.rec.queries.lock().unwrap(), vec!["consistency=stale"]);
}

#[tokio::test]
async fn linearizable_reads_send_no_consistency_parameter() {
    let live = serve(Mode::Live).await;
    let c = client(vec![live.url.clone()]);
    c.list_projects(Consistency::Linearizable).await.unwrap();
    assert_eq!(*live.rec.queries.lock().unwrap(), vec![""]);
}

#[tokio::test]
async fn a_business_rejection_carries_the_body_and_is_not_tried_elsewhere() {
    let stale = serve(Mode::Stale).await;
    let live = serve(Mode::Live).await;
    let c = client(vec![stale.url.clone(), live.url.clone()]);
    let key = new_idempotency_key();
    let err = c
        .acquire_lease(ProfileId::new(1).unwrap(), &acquire(), Some(&key))
        .await
        .unwrap_err();
    match &err {
        ClientError::Api { status, body, .. } => {
            assert_eq!(*status, 409);
            assert_eq!(body.code, ErrorCode::Conflict);
        }
        other => panic!("expected an API error, got {other:?}"),
    }
    assert_eq!(
        err.rejection(),
        Some(&Rejection::StaleGeneration {
            expected: Generation::new(1),
            current: Generation::new(2)
        })
    );
    assert_eq!(live.hits(), 0);
}

#[tokio::test]
async fn unavailable_read_tries_the_next_endpoint() {
    let down = serve(Mode::Unavailable).await;
    let live = serve(Mode::Live).await;
    let c = client(vec![down.url.clone(), live.url.clone()]);
    c.list_projects(Consistency::default()).await.unwrap();
    assert_eq!((down.hits(), live.hits()), (1, 1));
}

#[tokio::test]
async fn unavailable_unkeyed_write_is_returned_not_resent() {
    let down = serve(Mode::Unavailable).await;
    let live = serve(Mode::Live).await;
    let c = client(vec![down.url.clone(), live.url.clone()]);
    let err = c.create_project(&project(), None).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable);
    assert!(err.body().is_some());
    assert_eq!(live.hits(), 0);
}

#[tokio::test]
async fn unavailable_everywhere_returns_the_servers_answer() {
    let a = serve(Mode::Unavailable).await;
    let c = client(vec![a.url.clone(), refused()]);
    let err = c.list_projects(Consistency::default()).await.unwrap_err();
    assert_eq!(err.body().map(|b| b.code), Some(ErrorCode::Unavailable));
}

#[tokio::test]
async fn nothing_reachable_lists_every_attempt() {
    let c = client(vec![refused(), refused()]);
    match c.create_project(&project(), None).await.unwrap_err() {
        ClientError::Unreachable { attempts } => assert_eq!(attempts.len(), 2),
        other => panic!("expected Unreachable, got {other:?}"),
    }
    match client(Vec::new())
        .list_projects(Consistency::default())
        .await
    {
        Err(ClientError::Unreachable { attempts }) => assert!(attempts.is_empty()),
        other => panic!("expected Unreachable, got {other:?}"),
    }
}

#[tokio::test]
async fn typed_outcomes_decode() {
    let live = serve(Mode::Live).await;
    let c = client(vec![live.url.clone()]);
    let out = c
        .acquire_lease(ProfileId::new(1).unwrap(), &acquire(), None)
        .await
        .unwrap();
    let grant = out.lease_grant().unwrap();
    assert_eq!(grant.generation, Generation::new(2));
    assert_eq!(grant.lease.get(), 7);
}

#[test]
fn endpoints_are_normalized() {
    assert_eq!(
        normalize_endpoint("127.0.0.1:8120"),
        "https://127.0.0.1:8120"
    );
    assert_eq!(
        normalize_endpoint(" http://127.0.0.1:8120/ "),
        "http://127.0.0.1:8120"
    );
    assert_eq!(normalize_endpoint("https://a.example"), "https://a.example");
}

#[test]
fn path_segments_are_escaped() {
    assert_eq!(segment("sb-1.a_b~"), "sb-1.a_b~");
    assert_eq!(segment("a/b c"), "a%2Fb%20c");
}

#[test]
fn generated_keys_are_valid_and_distinct() {
    let a = new_idempotency_key();
    let b = new_idempotency_key();
    assert_ne!(a, b);
    assert!(a.as_str().starts_with("sq-"));
    assert!(IdempotencyKey::new(a.as_str()).is_ok());
}
