//! `squadron mailbox`: a profile's mailbox.

use clap::Subcommand;
use squadron_client::{AckMessages, PostMessage};
use squadron_core::ids::{Generation, LeaseId, ProfileId};
use squadron_core::mailbox::{Mailbox, MessageKind, MessageSender};

use super::{parse_serde, Ctx};
use crate::output::{self, emit, Table};

#[derive(Debug, Subcommand)]
pub enum MailboxCmd {
    /// Post a message to a profile's mailbox, as an operator.
    Post {
        #[arg(long)]
        profile: ProfileId,
        #[arg(long, default_value = "note", value_parser = parse_serde::<MessageKind>)]
        kind: MessageKind,
        #[arg(long)]
        body: String,
        /// The operator posting it.
        #[arg(long, default_value = "cli")]
        operator: String,
    },
    /// Read a profile's unacknowledged messages.
    Read {
        #[arg(long)]
        profile: ProfileId,
    },
    /// Acknowledge messages through a sequence (fenced by the reader's lease).
    Ack {
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        lease: LeaseId,
        #[arg(long)]
        generation: Generation,
        #[arg(long)]
        through_seq: u64,
    },
}

pub async fn run(ctx: &Ctx, cmd: MailboxCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        MailboxCmd::Post {
            profile,
            kind,
            body,
            operator,
        } => {
            let req = PostMessage {
                sender: MessageSender::Operator(operator),
                kind,
                body,
            };
            ctx.outcome(&c.post_message(profile, &req, ctx.key()).await?)
        }
        MailboxCmd::Read { profile } => {
            let mailbox = c.read_mailbox(profile, ctx.consistency).await?;
            emit(ctx.out, &mailbox, mailbox_text)
        }
        MailboxCmd::Ack {
            profile,
            lease,
            generation,
            through_seq,
        } => {
            let req = AckMessages {
                lease,
                generation,
                through_seq,
            };
            ctx.outcome(&c.ack_messages(profile, &req, ctx.key()).await?)
        }
    }
}

fn mailbox_text(m: &Mailbox) -> String {
    let mut out = format!(
        "profile: {}   next_seq: {}   acked_through: {}\n",
        m.profile, m.next_seq, m.acked_through
    );
    let mut t = Table::new(&["seq", "kind", "sender", "posted_at_ms", "body"]);
    for msg in m.messages.values() {
        let value = |v: serde_json::Result<serde_json::Value>| {
            v.map(|v| output::cell(&v)).unwrap_or_default()
        };
        t.row(vec![
            msg.seq.to_string(),
            value(serde_json::to_value(msg.kind)),
            value(serde_json::to_value(&msg.sender)),
            msg.posted_at_ms.to_string(),
            value(serde_json::to_value(&msg.payload)),
        ]);
    }
    out.push_str(&t.render());
    out
}
