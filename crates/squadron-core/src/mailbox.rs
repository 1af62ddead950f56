//! Durable per-profile mailboxes with monotonic sequence numbers.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::ProfileId;
use crate::lease::FencingToken;
use crate::roster::RosterDelta;

/// Who posted a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MessageSender {
    /// A peer profile, writing under its current lease (INV-6).
    Profile(FencingToken),
    /// A named operator.
    Operator(String),
    /// The control plane itself (roster deltas).
    System,
}

/// What a message is for. Lifecycle-only chatter is refused at the door.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MessageKind {
    /// Handoff content meant for the recipient.
    Handoff,
    /// A free note.
    Note,
    /// Lifecycle-only status ("waiting for first tool"); never relayed.
    Lifecycle,
    /// A roster change; posted by the system only.
    RosterDelta,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MessagePayload {
    Text(String),
    Roster(RosterDelta),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MailboxMessage {
    pub seq: u64,
    pub sender: MessageSender,
    pub kind: MessageKind,
    pub payload: MessagePayload,
    pub posted_at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Mailbox {
    pub profile: ProfileId,
    /// The sequence number the next message gets; starts at 1 and never goes back.
    pub next_seq: u64,
    /// Every message up to and including this one was acknowledged (the mailbox cursor).
    pub acked_through: u64,
    /// Unacknowledged messages by sequence.
    pub messages: BTreeMap<u64, MailboxMessage>,
    /// Set when a roster delta could not be delivered because the mailbox was full: the
    /// recipient must fetch a full roster snapshot from this revision on.
    pub roster_resync_from: Option<u64>,
}

impl Mailbox {
    pub fn new(profile: ProfileId) -> Self {
        Self {
            profile,
            next_seq: 1,
            acked_through: 0,
            messages: BTreeMap::new(),
            roster_resync_from: None,
        }
    }
}

/// Status phrases that carry no handoff content. Compared after trimming, lowercasing and
/// dropping trailing dots, so "Waiting for first tool..." is caught too.
pub const LIFECYCLE_NOISE_PHRASES: [&str; 8] = [
    "waiting for first tool",
    "waiting for tool",
    "thinking",
    "starting",
    "started",
    "session started",
    "idle",
    "still working",
];

/// True when a text is lifecycle-only noise and must not be relayed as handoff content.
pub fn is_lifecycle_noise(text: &str) -> bool {
    let normal = text
        .trim()
        .trim_end_matches(['.', '…'])
        .trim()
        .to_lowercase();
    normal.is_empty() || LIFECYCLE_NOISE_PHRASES.contains(&normal.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_is_recognised_and_content_is_not() {
        assert!(is_lifecycle_noise("Waiting for first tool..."));
        assert!(is_lifecycle_noise("  thinking  "));
        assert!(is_lifecycle_noise(""));
        assert!(!is_lifecycle_noise(
            "waiting for first tool: the auth tests fail on CI"
        ));
        assert!(!is_lifecycle_noise("please review src/auth.rs"));
    }
}
