//! Keyed retries (INV-11), for the `keyed` workload: the CAS register's writes, each under an
//! `Idempotency-Key`, sent to one node at a time and, after an unknown outcome, sent again with
//! the same key to the next node, until a node answers. Some answered writes are later replayed
//! — the same request and key, to another node, after snapshots and faults — and the replay
//! must get the first answer again (`replay` operations; `invariants::inv11_replays`).

use std::time::Duration;

use serde_json::{json, Value};
use squadron_client::{ClientError, SetCapabilities, SquadronClient};
use squadron_core::ids::{IdempotencyKey, ProfileId};
use squadron_core::Outcome;
use tokio::time::Instant;

use crate::event::EventType;
use crate::outcome::write_failure;

/// Most sends of one keyed write (each to the next node) before its outcome stays unknown.
pub const KEYED_ATTEMPTS_MAX: usize = 4;
/// Pause after an attempt whose outcome is unknown, before the next node is asked.
pub const KEYED_RETRY_PAUSE_MS: u64 = 300;
/// A write is replayed no sooner than this after its answer, so snapshots and faults pass in
/// between.
pub const REPLAY_DELAY_MS_MIN: u64 = 2_000;
/// Answered writes a client keeps for replaying at once; older ones are dropped.
pub const REPLAYS_PENDING_MAX: usize = 16;

/// One keyed write: what is sent, and under which key.
#[derive(Debug, Clone)]
pub struct KeyedWrite {
    pub profile: ProfileId,
    pub request: SetCapabilities,
    pub key: IdempotencyKey,
}

/// A write answered by a node, to be sent again later under the same key.
#[derive(Debug, Clone)]
pub struct Replay {
    pub write: KeyedWrite,
    /// The first answer, as the history recorded it (`{version}` or the refusal).
    pub answer: Value,
    pub answered_at: Instant,
}

impl Replay {
    pub fn is_due(&self) -> bool {
        self.answered_at.elapsed() >= Duration::from_millis(REPLAY_DELAY_MS_MIN)
    }
}

/// Sends `write` to `nodes`, starting at `first`, one node per attempt. A node's answer ends
/// it (`Ok({version, attempts})` or a refusal); an unknown outcome moves on to the next node
/// after a pause; a request that never left (the node is down) moves on at once. When no node
/// answered, the outcome is unknown if any attempt may have reached one, else a failure.
pub async fn send(
    client: &SquadronClient,
    nodes: &[String],
    first: usize,
    write: &KeyedWrite,
) -> Result<Value, (EventType, Value)> {
    // Attempts whose outcome was unknown: a later answer is then a retry's (INV-11's case).
    let mut unknown = 0;
    let mut last = Value::Null;
    for attempt in 0..KEYED_ATTEMPTS_MAX {
        let node = client.with_endpoints(vec![nodes[(first + attempt) % nodes.len()].clone()]);
        let answer = node
            .set_capabilities(write.profile, &write.request, Some(&write.key))
            .await;
        let attempts = attempt + 1;
        match answer {
            Ok(Outcome::CapabilityManifestSet { version }) => {
                return Ok(json!({"version": version, "attempts": attempts,
                                 "unknown_attempts": unknown}))
            }
            Ok(other) => {
                return Err((
                    EventType::Info,
                    json!({"error": "unexpected", "message": format!("{other:?}"),
                           "attempts": attempts}),
                ))
            }
            Err(e) => {
                let (kind, mut value) = write_failure(&e);
                value["attempts"] = json!(attempts);
                value["unknown_attempts"] = json!(unknown);
                if kind == EventType::Fail && !matches!(e, ClientError::Unreachable { .. }) {
                    return Err((kind, value));
                }
                if kind == EventType::Info {
                    unknown += 1;
                    tokio::time::sleep(Duration::from_millis(KEYED_RETRY_PAUSE_MS)).await;
                }
                last = value;
            }
        }
    }
    let kind = if unknown > 0 {
        EventType::Info
    } else {
        EventType::Fail
    };
    Err((kind, last))
}

/// The part of a write's answer a replay must repeat: the version, or the refusal with the
/// state it reported (not how the attempts went).
pub fn answer_of(output: &Value) -> Value {
    let mut answer = output.clone();
    if let Some(fields) = answer.as_object_mut() {
        fields.remove("attempts");
        fields.remove("unknown_attempts");
    }
    answer
}

/// Whether an answer is one the node's idempotency record keeps (an applied write or a
/// refusal from the replicated state), so a replay must repeat it.
pub fn is_recorded(kind: EventType, output: &Value) -> bool {
    match kind {
        EventType::Ok => output.get("version").is_some(),
        EventType::Fail => output["error"] == "version_conflict",
        _ => false,
    }
}
