//! The worker's `/worker/v1/metrics` (OpenMetrics text, `prometheus-client`): what only the
//! worker knows — today its Docker warm pool's claims. Control nodes relay it to operators
//! at `GET /api/v1/workers/{id}/metrics`.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use squadron_api::OPENMETRICS_CONTENT_TYPE;
use squadron_core::manifest::Keyword as _;

use crate::runtime::probe::RuntimeSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimLabels {
    runtime: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuntimeLabels {
    runtime: String,
}

pub(crate) fn render(runtimes: &RuntimeSet) -> Response {
    let claims = Family::<ClaimLabels, Counter>::default();
    let idle = Family::<RuntimeLabels, Gauge>::default();
    for kind in runtimes.kinds() {
        let Some(figures) = runtimes.get(kind).and_then(|r| r.pool_figures()) else {
            continue;
        };
        let runtime = kind.as_str().to_string();
        for (result, n) in [
            ("hit", figures.hits),
            ("miss", figures.misses),
            ("ineligible", figures.ineligible),
        ] {
            let labels = ClaimLabels {
                runtime: runtime.clone(),
                result: result.to_string(),
            };
            claims.get_or_create(&labels).inc_by(n);
        }
        let idle_now = i64::try_from(figures.idle).unwrap_or(i64::MAX);
        idle.get_or_create(&RuntimeLabels { runtime }).set(idle_now);
    }
    let mut registry = Registry::default();
    registry.register(
        "squadron_worker_sandbox_pool_claims",
        "Sandbox starts by how the warm pool answered: hit (a warm sandbox claimed), miss (none \
         idle, or the claim failed: started cold), ineligible (a shape the pool does not hold)",
        claims,
    );
    registry.register(
        "squadron_worker_sandbox_pool_idle",
        "Warm sandboxes started and waiting for a claim",
        idle,
    );
    let mut out = String::new();
    match text::encode(&mut out, &registry) {
        Ok(()) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], out).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
