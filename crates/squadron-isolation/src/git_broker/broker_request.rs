//! The requests of the broker's line protocol, their parsing (every error names the field)
//! and the checks that need no filesystem.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::broker_answer::{Refusal, RefusalCode};
use super::commit_paths::check_path_syntax;

/// Paths in one commit.
pub const PATHS_PER_COMMIT_MAX: usize = 1_000;
/// A commit message, before the broker's trailers.
pub const MESSAGE_BYTES_MAX: usize = 16 * 1024;
/// An idempotency key; its characters are `[A-Za-z0-9._:-]`.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 128;

const COMMIT_FIELDS: [&str; 8] = [
    "op",
    "profile",
    "lease",
    "generation",
    "expected_head",
    "paths",
    "message",
    "idempotency_key",
];
const HEAD_FIELDS: [&str; 4] = ["op", "profile", "lease", "generation"];

/// `{op:"commit", …}`: commit exactly `paths` of the profile's worktree on its HEAD branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRequest {
    pub profile: u64,
    pub lease: u64,
    pub generation: u64,
    /// The HEAD the caller believes is current: a full hex OID, or `None` for an unborn
    /// branch. Required on the wire (as `null` when unborn) so that omitting it cannot mean
    /// "whatever HEAD is".
    pub expected_head: Option<String>,
    /// Worktree-relative paths, `/`-separated. A path present in the worktree is added or
    /// modified; a path absent from it is deleted.
    pub paths: Vec<String>,
    pub message: String,
    /// Scoped to the profile: a retry with the same key and the same request gets the first
    /// answer; the same key with another request is refused as `conflict`.
    pub idempotency_key: String,
}

/// `{op:"head", …}`: the current HEAD of the profile's worktree, fenced like a commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadRequest {
    pub profile: u64,
    pub lease: u64,
    pub generation: u64,
}

/// One parsed request line.
#[derive(Debug)]
pub(crate) enum BrokerRequest {
    Commit(CommitRequest),
    Head(HeadRequest),
}

impl BrokerRequest {
    /// Parses one line. Unknown fields are refused so that a misspelt field never
    /// silently falls back to a default.
    pub(crate) fn parse(line: &[u8]) -> Result<BrokerRequest, Refusal> {
        let value: Value = serde_json::from_slice(line).map_err(|e| {
            Refusal::new(RefusalCode::InvalidArgument, format!("not JSON: {e}")).with_field("line")
        })?;
        let Value::Object(object) = value else {
            return Err(
                Refusal::new(RefusalCode::InvalidArgument, "a request is a JSON object")
                    .with_field("line"),
            );
        };
        match object.get("op").and_then(Value::as_str) {
            Some("commit") => {
                reject_unknown_fields(&object, &COMMIT_FIELDS)?;
                Ok(BrokerRequest::Commit(CommitRequest {
                    profile: take_u64(&object, "profile")?,
                    lease: take_u64(&object, "lease")?,
                    generation: take_u64(&object, "generation")?,
                    expected_head: take_optional_string(&object, "expected_head")?,
                    paths: take_strings(&object, "paths")?,
                    message: take_string(&object, "message")?,
                    idempotency_key: take_string(&object, "idempotency_key")?,
                }))
            }
            Some("head") => {
                reject_unknown_fields(&object, &HEAD_FIELDS)?;
                Ok(BrokerRequest::Head(HeadRequest {
                    profile: take_u64(&object, "profile")?,
                    lease: take_u64(&object, "lease")?,
                    generation: take_u64(&object, "generation")?,
                }))
            }
            Some(other) => Err(invalid(
                "op",
                format!("unknown op {other:?} (commit, head)"),
            )),
            None => Err(invalid("op", "required string: commit or head")),
        }
    }
}

impl CommitRequest {
    /// The wire line (without the newline).
    pub(crate) fn to_line(&self) -> Result<Vec<u8>, serde_json::Error> {
        with_op("commit", serde_json::to_value(self)?)
    }

    /// SHA-256 (hex) of the canonical encoding of every field, key included. Stored in the
    /// ledger and as a commit trailer, so a retry can be recognised even when the ledger
    /// line was lost.
    pub(crate) fn digest(&self) -> String {
        // Serializing a struct of integers, strings and vectors cannot fail; the fallback
        // keeps the function total without an unwrap.
        let bytes = serde_json::to_vec(self).unwrap_or_else(|_| format!("{self:?}").into_bytes());
        hex::encode(Sha256::digest(&bytes))
    }

    /// The checks that need no filesystem: key, message, expected HEAD and path syntax.
    pub(crate) fn check_syntax(&self) -> Result<(), Refusal> {
        let key = &self.idempotency_key;
        if key.is_empty() || key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
            return Err(invalid(
                "idempotency_key",
                format!("must be 1..={IDEMPOTENCY_KEY_BYTES_MAX} bytes"),
            ));
        }
        if !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
        {
            return Err(invalid(
                "idempotency_key",
                "allowed characters are A-Z a-z 0-9 . _ : -",
            ));
        }
        if self.message.trim().is_empty() {
            return Err(invalid("message", "must not be empty"));
        }
        if self.message.len() > MESSAGE_BYTES_MAX {
            return Err(invalid(
                "message",
                format!("longer than {MESSAGE_BYTES_MAX} bytes"),
            ));
        }
        if self.message.contains('\0') {
            return Err(invalid("message", "contains a NUL byte"));
        }
        // The broker's trailers are the provenance record; a message must not forge them.
        if self.message.lines().any(|line| {
            line.trim_start()
                .to_ascii_lowercase()
                .starts_with("squadron-")
        }) {
            return Err(invalid(
                "message",
                "lines starting with `Squadron-` are reserved for the broker's trailers",
            ));
        }
        if let Some(head) = &self.expected_head {
            if git2::Oid::from_str(head).is_err() || head.len() != 40 {
                return Err(invalid(
                    "expected_head",
                    "a full 40-digit hex commit id, or null for an unborn branch",
                ));
            }
        }
        if self.paths.is_empty() {
            return Err(invalid("paths", "at least one path"));
        }
        if self.paths.len() > PATHS_PER_COMMIT_MAX {
            return Err(invalid(
                "paths",
                format!("more than {PATHS_PER_COMMIT_MAX} paths"),
            ));
        }
        let mut seen = std::collections::HashSet::with_capacity(self.paths.len());
        for (index, path) in self.paths.iter().enumerate() {
            let field = format!("paths[{index}]");
            check_path_syntax(path).map_err(|message| invalid(&field, message))?;
            if !seen.insert(path.as_str()) {
                return Err(invalid(&field, format!("{path:?} is listed twice")));
            }
        }
        Ok(())
    }
}

impl HeadRequest {
    /// The wire line (without the newline).
    pub(crate) fn to_line(&self) -> Result<Vec<u8>, serde_json::Error> {
        with_op("head", serde_json::to_value(self)?)
    }
}

fn with_op(op: &str, value: Value) -> Result<Vec<u8>, serde_json::Error> {
    let mut object = Map::new();
    object.insert("op".to_string(), Value::String(op.to_string()));
    if let Value::Object(fields) = value {
        object.extend(fields);
    }
    serde_json::to_vec(&Value::Object(object))
}

fn invalid(field: &str, message: impl Into<String>) -> Refusal {
    Refusal::new(RefusalCode::InvalidArgument, message).with_field(field)
}

fn reject_unknown_fields(object: &Map<String, Value>, known: &[&str]) -> Result<(), Refusal> {
    match object.keys().find(|key| !known.contains(&key.as_str())) {
        Some(key) => Err(invalid(key, "unknown field")),
        None => Ok(()),
    }
}

fn take_u64(object: &Map<String, Value>, field: &str) -> Result<u64, Refusal> {
    match object.get(field) {
        Some(value) => value
            .as_u64()
            .ok_or_else(|| invalid(field, "must be an unsigned integer")),
        None => Err(invalid(field, "required")),
    }
}

fn take_string(object: &Map<String, Value>, field: &str) -> Result<String, Refusal> {
    match object.get(field) {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(_) => Err(invalid(field, "must be a string")),
        None => Err(invalid(field, "required")),
    }
}

fn take_optional_string(
    object: &Map<String, Value>,
    field: &str,
) -> Result<Option<String>, Refusal> {
    match object.get(field) {
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(Value::Null) => Ok(None),
        Some(_) => Err(invalid(field, "must be a string or null")),
        None => Err(invalid(field, "required (null for an unborn branch)")),
    }
}

fn take_strings(object: &Map<String, Value>, field: &str) -> Result<Vec<String>, Refusal> {
    let Some(value) = object.get(field) else {
        return Err(invalid(field, "required"));
    };
    let Value::Array(items) = value else {
        return Err(invalid(field, "must be an array of strings"));
    };
    if items.len() > PATHS_PER_COMMIT_MAX {
        return Err(invalid(
            field,
            format!("more than {PATHS_PER_COMMIT_MAX} entries"),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item.as_str()
                .map(str::to_string)
                .ok_or_else(|| invalid(&format!("{field}[{index}]"), "must be a string"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit_line(extra: &str) -> String {
        format!(
            r#"{{"op":"commit","profile":1,"lease":2,"generation":3,"expected_head":null,"paths":["a.txt"],"message":"m","idempotency_key":"k-1"{extra}}}"#
        )
    }

    #[test]
    fn a_commit_line_round_trips() {
        let BrokerRequest::Commit(request) =
            BrokerRequest::parse(commit_line("").as_bytes()).unwrap()
        else {
            panic!("not a commit");
        };
        let again = request.to_line().unwrap();
        let BrokerRequest::Commit(parsed) = BrokerRequest::parse(&again).unwrap() else {
            panic!("not a commit");
        };
        assert_eq!(parsed, request);
        assert_eq!(parsed.digest(), request.digest());
        assert!(request.check_syntax().is_ok());
    }

    #[test]
    fn errors_name_the_field() {
        let unknown = BrokerRequest::parse(commit_line(r#","paths2":[]"#).as_bytes()).unwrap_err();
        assert_eq!(unknown.field.as_deref(), Some("paths2"));
        let line = r#"{"op":"commit","profile":"one","lease":2,"generation":3,"expected_head":null,"paths":[],"message":"m","idempotency_key":"k"}"#;
        assert_eq!(
            BrokerRequest::parse(line.as_bytes())
                .unwrap_err()
                .field
                .as_deref(),
            Some("profile")
        );
        let line = r#"{"op":"commit","profile":1,"lease":2,"generation":3,"paths":["a"],"message":"m","idempotency_key":"k"}"#;
        assert_eq!(
            BrokerRequest::parse(line.as_bytes())
                .unwrap_err()
                .field
                .as_deref(),
            Some("expected_head")
        );
        let line = r#"{"op":"commit","profile":1,"lease":2,"generation":3,"expected_head":null,"paths":["a",7],"message":"m","idempotency_key":"k"}"#;
        assert_eq!(
            BrokerRequest::parse(line.as_bytes())
                .unwrap_err()
                .field
                .as_deref(),
            Some("paths[1]")
        );
        assert_eq!(
            BrokerRequest::parse(br#"{"op":"push"}"#)
                .unwrap_err()
                .field
                .as_deref(),
            Some("op")
        );
        assert_eq!(
            BrokerRequest::parse(b"[1]").unwrap_err().field.as_deref(),
            Some("line")
        );
    }

    #[test]
    fn syntax_checks_name_the_field() {
        let base = CommitRequest {
            profile: 1,
            lease: 2,
            generation: 3,
            expected_head: None,
            paths: vec!["a.txt".into()],
            message: "m".into(),
            idempotency_key: "k".into(),
        };
        let cases: Vec<(CommitRequest, &str)> = vec![
            (
                CommitRequest {
                    idempotency_key: "a b".into(),
                    ..base.clone()
                },
                "idempotency_key",
            ),
            (
                CommitRequest {
                    idempotency_key: String::new(),
                    ..base.clone()
                },
                "idempotency_key",
            ),
            (
                CommitRequest {
                    message: " \n".into(),
                    ..base.clone()
                },
                "message",
            ),
            (
                CommitRequest {
                    message: "x\n\nSquadron-Generation: 9".into(),
                    ..base.clone()
                },
                "message",
            ),
            (
                CommitRequest {
                    expected_head: Some("abc".into()),
                    ..base.clone()
                },
                "expected_head",
            ),
            (
                CommitRequest {
                    paths: vec![],
                    ..base.clone()
                },
                "paths",
            ),
            (
                CommitRequest {
                    paths: vec!["a".into(), "a".into()],
                    ..base.clone()
                },
                "paths[1]",
            ),
            (
                CommitRequest {
                    paths: vec!["ok".into(), "../x".into()],
                    ..base.clone()
                },
                "paths[1]",
            ),
        ];
        for (request, field) in cases {
            let refusal = request.check_syntax().unwrap_err();
            assert_eq!(refusal.field.as_deref(), Some(field), "{request:?}");
            assert_eq!(refusal.code, RefusalCode::InvalidArgument);
        }
        let other_key = CommitRequest {
            idempotency_key: "k2".into(),
            ..base.clone()
        };
        assert_ne!(other_key.digest(), base.digest());
    }
}
