//! The OpenAI Responses API as the Codex CLI uses it: `POST /v1/responses` with `stream:
//! true`, answered by server-sent events — `response.created`, the output item
//! (`response.output_item.added` / `.done`: a `function_call` for a tool step, an assistant
//! `message` for a text step), `response.completed` with the usage.
//!
//! Which step answers: the number of model turns already in the request's `input` (its
//! `function_call` items and assistant messages).

use axum::response::Response;
use serde_json::{json, Value};

use super::{contents_text, event_stream, with_cwd, working_directory, Recorded, Step};

pub(super) fn answer(step: &Step, request: &Recorded) -> Response {
    let input = request.body["input"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // Codex tells the model its environment in the input's messages.
    let cwd = working_directory(&contents_text(&input));
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let item = match step {
        Step::Tool { name, input } => json!({
            "type": "function_call", "id": format!("fc_{n:04}"), "call_id": format!("call_{n:04}"),
            "name": name, "arguments": with_cwd(input, &cwd).to_string(), "status": "completed",
        }),
        Step::Text(text) => json!({
            "type": "message", "id": format!("msg_{n:04}"), "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }),
        Step::Hold => json!({
            "type": "message", "id": format!("msg_{n:04}"), "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "held", "annotations": []}],
        }),
    };
    let id = format!("resp_{n:04}");
    let model = request.body["model"].as_str().unwrap_or("scripted");
    let response = |status: &str, output: Value| {
        json!({"id": id, "object": "response", "created_at": 0, "status": status, "model": model,
               "output": output,
               "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0},
                         "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0},
                         "total_tokens": 120}})
    };
    let mut events = vec![
        (
            "response.created",
            json!({"type": "response.created", "response": response("in_progress", json!([]))}),
        ),
        (
            "response.output_item.added",
            json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
        ),
    ];
    if let Step::Text(text) = step {
        events.push((
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "item_id": item["id"], "output_index": 0,
                   "content_index": 0, "delta": text}),
        ));
    }
    events.push((
        "response.output_item.done",
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
    ));
    events.push((
        "response.completed",
        json!({"type": "response.completed", "response": response("completed", json!([item]))}),
    ));
    event_stream(&events)
}

/// The turn a Responses request is at: the model turns already in its input.
pub(crate) fn turn_of(request: &Recorded) -> usize {
    request.body["input"]
        .as_array()
        .map(|input| {
            input
                .iter()
                .filter(|i| {
                    i["type"] == "function_call"
                        || (i["type"] == "message" && i["role"] == "assistant")
                })
                .count()
        })
        .unwrap_or(0)
}
