//! How a client error becomes a history completion: a business refusal is a `fail` that
//! pins down the state; a write that may have been applied is `info`; a write that was never
//! sent, and any failed read, is a `fail` that says nothing.

use serde_json::{json, Value};
use squadron_client::ClientError;
use squadron_core::Rejection;

use crate::event::EventType;

/// The refusal's name and the state facts it reports (see the models' docs).
fn rejection_value(r: &Rejection) -> Value {
    match r {
        Rejection::StaleGeneration { current, .. } => {
            json!({"error": "stale_generation", "current": current.get()})
        }
        Rejection::ProfileBusy { generation, .. } => {
            json!({"error": "busy", "live_generation": generation.get()})
        }
        Rejection::CapacityFull { held, max } => {
            json!({"error": "capacity_full", "held": held, "max": max})
        }
        Rejection::Fenced {
            current_generation,
            reason,
            ..
        } => json!({"error": "fenced", "current": current_generation.get(), "message": reason}),
        Rejection::ManifestVersionConflict { current, .. } => {
            json!({"error": "version_conflict", "current": current})
        }
        Rejection::ChainBroken {
            expected_sequence, ..
        } => json!({"error": "chain_broken", "expected_sequence": expected_sequence}),
        Rejection::LeaseExpired { expired_at_ms } => {
            json!({"error": "lease_expired", "expired_at_ms": expired_at_ms})
        }
        Rejection::EvidenceRefused { reason } => {
            json!({"error": "evidence_refused", "message": reason})
        }
        Rejection::StaleTaskState { current, .. } => {
            json!({"error": "stale_task_state", "current": current.as_str()})
        }
        Rejection::IllegalTransition { reason, .. } => {
            json!({"error": "illegal_transition", "message": reason})
        }
        Rejection::NotTaskOwner { reason } => json!({"error": "not_task_owner", "message": reason}),
        Rejection::IdempotencyKeyReused => json!({"error": "idempotency_key_reused"}),
        other => json!({"error": "rejected", "message": other.to_string()}),
    }
}

/// The completion of a write that failed.
pub fn write_failure(e: &ClientError) -> (EventType, Value) {
    match e {
        ClientError::Api { status, body, .. } if *status < 500 => (
            EventType::Fail,
            match &body.rejection {
                Some(r) => rejection_value(r),
                None => json!({"error": body.code.as_str(), "message": body.message}),
            },
        ),
        // A 5xx may come after the leader applied a forwarded write; a garbled 2xx too.
        ClientError::Api { status, body, .. } => (
            EventType::Info,
            json!({"error": body.code.as_str(), "status": status, "message": body.message}),
        ),
        ClientError::OutcomeUnknown { message, .. } => (
            EventType::Info,
            json!({"error": "outcome_unknown", "message": message}),
        ),
        ClientError::Decode { message, .. } => (
            EventType::Info,
            json!({"error": "decode", "message": message}),
        ),
        ClientError::Unreachable { .. } => (
            EventType::Fail,
            json!({"error": "unreachable", "message": e.to_string()}),
        ),
        ClientError::Invalid(m) => (EventType::Fail, json!({"error": "invalid", "message": m})),
    }
}

/// The completion of a read that failed: reads change nothing, so always `fail`.
pub fn read_failure(e: &ClientError) -> (EventType, Value) {
    (
        EventType::Fail,
        json!({"error": e.code().as_str(), "message": e.to_string()}),
    )
}
