//! The answers of the broker's line protocol: a commit, a HEAD, or a refusal that names
//! its reason (`code`) and, for bad input, the field.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::broker_error::BrokerError;

/// Why the broker refused a request. Every refusal writes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalCode {
    /// Malformed or out-of-bounds input; `field` names it.
    InvalidArgument,
    /// No worktree is registered for the profile.
    UnknownProfile,
    /// The socket serves another profile only (see `GitBroker::serve_profile`).
    Forbidden,
    /// The idempotency key was used before with a different request.
    Conflict,
    /// The (profile, lease, generation) is not the profile's current active lease.
    StaleGeneration,
    /// The control plane could not answer the fence check; the broker fails closed.
    FenceUnavailable,
    /// The worktree's HEAD is not `expected_head`.
    HeadMoved,
    /// The listed paths do not change the tree of HEAD.
    NothingToCommit,
    /// Too many connections at once.
    Busy,
    /// A bounded wait (repository lock, fence check) ran out.
    Timeout,
    /// The repository could not be read or written.
    Internal,
}

impl fmt::Display for RefusalCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{self:?}"));
        f.write_str(&text)
    }
}

/// `{ok:false, code, message, field?, current_generation?, current_head?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub code: RefusalCode,
    pub message: String,
    /// The request field at fault (`paths[3]`, `expected_head`, `line`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// With `stale_generation`: the profile's current generation, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_generation: Option<u64>,
    /// With `head_moved`: the worktree's actual HEAD (absent when unborn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_head: Option<String>,
}

impl Refusal {
    /// A refusal without a field.
    pub fn new(code: RefusalCode, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
            field: None,
            current_generation: None,
            current_head: None,
        }
    }

    /// Names the request field at fault.
    pub fn with_field(mut self, field: impl Into<String>) -> Refusal {
        self.field = Some(field.into());
        self
    }

    fn to_value(&self) -> Value {
        let mut value = serde_json::to_value(self).unwrap_or_else(|_| json!({}));
        if let Value::Object(object) = &mut value {
            object.insert("ok".to_string(), Value::Bool(false));
        }
        value
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{} ({field}): {}", self.code, self.message),
            None => write!(f, "{}: {}", self.code, self.message),
        }
    }
}

/// The answer to a commit request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    /// `{ok:true, commit, replayed}`; `replayed` when the answer is the first answer to an
    /// earlier request with the same key, and nothing was written now.
    Committed {
        commit: String,
        replayed: bool,
    },
    Refused(Refusal),
}

/// The answer to a head request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadOutcome {
    /// `{ok:true, head, branch}`; `head` is `None` on an unborn branch, `branch` is `None`
    /// when HEAD is detached.
    Head {
        head: Option<String>,
        branch: Option<String>,
    },
    Refused(Refusal),
}

impl CommitOutcome {
    pub(crate) fn to_line(&self) -> Vec<u8> {
        let value = match self {
            CommitOutcome::Committed { commit, replayed } => {
                json!({"ok": true, "commit": commit, "replayed": replayed})
            }
            CommitOutcome::Refused(refusal) => refusal.to_value(),
        };
        line_bytes(&value)
    }

    pub(crate) fn from_line(line: &[u8]) -> Result<CommitOutcome, BrokerError> {
        match parse_ok(line)? {
            (true, value) => {
                let commit = value.get("commit").and_then(Value::as_str);
                let replayed = value.get("replayed").and_then(Value::as_bool);
                match (commit, replayed) {
                    (Some(commit), Some(replayed)) => Ok(CommitOutcome::Committed {
                        commit: commit.to_string(),
                        replayed,
                    }),
                    _ => Err(BrokerError::Protocol(
                        "a commit answer needs `commit` and `replayed`".into(),
                    )),
                }
            }
            (false, value) => Ok(CommitOutcome::Refused(parse_refusal(value)?)),
        }
    }
}

impl HeadOutcome {
    pub(crate) fn to_line(&self) -> Vec<u8> {
        let value = match self {
            HeadOutcome::Head { head, branch } => {
                json!({"ok": true, "head": head, "branch": branch})
            }
            HeadOutcome::Refused(refusal) => refusal.to_value(),
        };
        line_bytes(&value)
    }

    pub(crate) fn from_line(line: &[u8]) -> Result<HeadOutcome, BrokerError> {
        match parse_ok(line)? {
            (true, value) => {
                let text = |name: &str| value.get(name).and_then(Value::as_str).map(str::to_string);
                Ok(HeadOutcome::Head {
                    head: text("head"),
                    branch: text("branch"),
                })
            }
            (false, value) => Ok(HeadOutcome::Refused(parse_refusal(value)?)),
        }
    }
}

/// A refusal sent outside a commit or head answer (bad line, busy broker).
pub(crate) fn refusal_line(refusal: &Refusal) -> Vec<u8> {
    line_bytes(&refusal.to_value())
}

fn line_bytes(value: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
    bytes.push(b'\n');
    bytes
}

fn parse_ok(line: &[u8]) -> Result<(bool, Value), BrokerError> {
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| BrokerError::Protocol(format!("answer is not JSON: {e}")))?;
    let ok = value
        .get("ok")
        .and_then(Value::as_bool)
        .ok_or_else(|| BrokerError::Protocol("answer without a boolean `ok`".into()))?;
    Ok((ok, value))
}

fn parse_refusal(value: Value) -> Result<Refusal, BrokerError> {
    serde_json::from_value(value)
        .map_err(|e| BrokerError::Protocol(format!("unreadable refusal: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_round_trip() {
        let committed = CommitOutcome::Committed {
            commit: "a".repeat(40),
            replayed: true,
        };
        assert_eq!(
            CommitOutcome::from_line(&committed.to_line()).unwrap(),
            committed
        );
        let mut refusal =
            Refusal::new(RefusalCode::StaleGeneration, "fenced").with_field("generation");
        refusal.current_generation = Some(7);
        let refused = CommitOutcome::Refused(refusal);
        let line = refused.to_line();
        assert!(String::from_utf8_lossy(&line).contains(r#""code":"stale_generation""#));
        assert_eq!(CommitOutcome::from_line(&line).unwrap(), refused);
        let unborn = HeadOutcome::Head {
            head: None,
            branch: Some("refs/heads/main".into()),
        };
        assert_eq!(HeadOutcome::from_line(&unborn.to_line()).unwrap(), unborn);
        assert!(CommitOutcome::from_line(b"{\"ok\":true}").is_err());
    }
}
