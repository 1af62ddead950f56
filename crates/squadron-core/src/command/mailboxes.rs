//! Commands on mailboxes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::ProfileId;
use crate::lease::FencingToken;
use crate::mailbox::{MessageKind, MessageSender};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PostMessage {
    pub to: ProfileId,
    pub sender: MessageSender,
    pub kind: MessageKind,
    pub body: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AckMessages {
    pub fence: FencingToken,
    pub through_seq: u64,
}
