//! How long the REST API takes to answer, by method and status class, for `/metrics`
//! (`squadron_http_request_duration_seconds`): the latency an operator's client sees, from the
//! request's arrival to its answer's head (a streamed body may go on after).

use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use crate::rest::AppState;

/// The methods counted by name; any other is `other`, so a client cannot grow the label set.
const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    method: &'static str,
    /// `1xx` (a WebSocket's upgrade), `2xx`, `3xx`, `4xx` or `5xx`.
    status: &'static str,
}

/// One histogram per (method, status class): at most 6 × 5.
#[derive(Debug)]
pub struct RequestLatency(Family<RequestLabels, Histogram, fn() -> Histogram>);

impl Default for RequestLatency {
    fn default() -> Self {
        RequestLatency(Family::new_with_constructor(|| {
            // 0.5 ms doubling to about 16 s: a stale read to a write that waits for a leader.
            Histogram::new(exponential_buckets(0.000_5, 2.0, 16))
        }))
    }
}

impl RequestLatency {
    pub fn family(&self) -> &Family<RequestLabels, Histogram, fn() -> Histogram> {
        &self.0
    }

    fn observe(&self, method: &str, status: u16, seconds: f64) {
        let method = METHODS
            .into_iter()
            .find(|m| *m == method)
            .unwrap_or("other");
        let status = match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.0
            .get_or_create(&RequestLabels { method, status })
            .observe(seconds);
    }
}

/// The REST listener's layer: times every request, refused ones included.
pub async fn layer(State(node): State<AppState>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let started = Instant::now();
    let response = next.run(request).await;
    node.request_latency.observe(
        method.as_str(),
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_and_statuses_fall_into_a_bounded_label_set() {
        let latency = RequestLatency::default();
        latency.observe("GET", 200, 0.001);
        latency.observe("GET", 204, 0.002);
        latency.observe("BREW", 418, 0.003);
        latency.observe("POST", 503, 0.004);
        latency.observe("GET", 101, 0.005);
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register(
            "squadron_http_request_duration_seconds",
            "test",
            latency.0.clone(),
        );
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains(
                "squadron_http_request_duration_seconds_count{method=\"GET\",status=\"2xx\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains("method=\"other\",status=\"4xx\"} 1"),
            "{text}"
        );
        assert!(text.contains("method=\"POST\",status=\"5xx\"} 1"), "{text}");
        assert!(text.contains("method=\"GET\",status=\"1xx\"} 1"), "{text}");
    }
}
