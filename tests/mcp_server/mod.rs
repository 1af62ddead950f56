//! A small real MCP server for tests (issue 16 item 7): MCP's streamable HTTP on host
//! loopback — `initialize` (with a session id), `tools/list` with one tool, `add_note`, and
//! `tools/call` of it, answered as server-sent events — recording every message it got and
//! the headers it came with, so a test can see what reached it and what did not (the
//! gateway's token). A sandbox cannot reach host loopback; only its worker's gateway can.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// The session id this server hands out.
pub const SESSION: &str = "mcp-session-0001";

/// One message as the server got it.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: Vec<(String, String)>,
    pub message: Value,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn method(&self) -> &str {
        self.message["method"].as_str().unwrap_or("")
    }
}

pub struct McpServer {
    /// The endpoint, `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    received: Arc<Mutex<Vec<Received>>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for McpServer {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl McpServer {
    pub fn start() -> McpServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        listener.set_nonblocking(true).expect("nonblocking");
        let received = Arc::new(Mutex::new(Vec::new()));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let shared = received.clone();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let app = axum::Router::new()
                .route("/mcp", axum::routing::post(answer))
                .with_state(shared);
            axum::serve(listener, app).await.expect("serve");
        });
        McpServer {
            url: format!("http://{addr}/mcp"),
            received,
            runtime: Some(runtime),
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("received").clone()
    }

    /// The arguments of every `tools/call` of `add_note`.
    pub fn notes(&self) -> Vec<Value> {
        self.received()
            .into_iter()
            .filter(|r| r.method() == "tools/call")
            .filter(|r| r.message["params"]["name"] == "add_note")
            .map(|r| r.message["params"]["arguments"].clone())
            .collect()
    }
}

async fn answer(
    State(received): State<Arc<Mutex<Vec<Received>>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "not JSON").into_response();
    };
    received.lock().expect("received").push(Received {
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
        message: message.clone(),
    });
    let Some(id) = message.get("id").cloned() else {
        // A notification (`notifications/initialized`): accepted, nothing to say.
        return StatusCode::ACCEPTED.into_response();
    };
    let params = &message["params"];
    let reply = |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result});
    match message["method"].as_str().unwrap_or("") {
        "initialize" => {
            let version = params["protocolVersion"].as_str().unwrap_or("2025-03-26");
            let body = reply(json!({
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "notes", "version": "1.0.0"},
            }));
            ([("mcp-session-id", SESSION)], axum::Json(body)).into_response()
        }
        "ping" => axum::Json(reply(json!({}))).into_response(),
        "tools/list" => axum::Json(reply(json!({"tools": [{
            "name": "add_note",
            "description": "Adds a note to the shared notebook.",
            "inputSchema": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        }]})))
        .into_response(),
        "tools/call" => {
            let text = params["arguments"]["text"].as_str().unwrap_or("");
            let body = reply(json!({
                "content": [{"type": "text", "text": format!("noted: {text}")}],
                "isError": false,
            }));
            // As server-sent events, the other shape a streamable-HTTP answer takes.
            (
                [("content-type", "text/event-stream")],
                format!("event: message\ndata: {body}\n\n"),
            )
                .into_response()
        }
        other => axum::Json(json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": -32601, "message": format!("no method {other}")},
        }))
        .into_response(),
    }
}
