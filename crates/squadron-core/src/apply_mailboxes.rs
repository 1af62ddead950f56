//! Mailbox posts and acknowledgements, and roster delivery.

use std::sync::Arc;

use crate::command::{AckMessages, PostMessage};
use crate::ids::ProfileId;
use crate::lease::check_descriptor;
use crate::limits::{MAILBOX_MESSAGES_MAX, MESSAGE_BODY_BYTES_MAX, ROSTER_REVISIONS_KEPT};
use crate::mailbox::{
    is_lifecycle_noise, MailboxMessage, MessageKind, MessagePayload, MessageSender,
};
use crate::rejection::Rejection;
use crate::response::Outcome;
use crate::roster::{RosterDelta, RosterEntry, RosterStatus};
use crate::state::State;

impl State {
    pub(crate) fn post_message(
        &mut self,
        now: u64,
        command: PostMessage,
    ) -> Result<Outcome, Rejection> {
        let PostMessage {
            to,
            sender,
            kind,
            body,
        } = command;
        if body.len() > MESSAGE_BODY_BYTES_MAX {
            return Err(Rejection::invalid(
                "body",
                format!(
                    "must be at most {MESSAGE_BODY_BYTES_MAX} bytes, got {}",
                    body.len()
                ),
            ));
        }
        self.check_sender(now, to, &sender)?;
        if kind == MessageKind::RosterDelta {
            return Err(Rejection::invalid(
                "kind",
                "roster deltas are posted by the control plane only",
            ));
        }
        // Lifecycle-only chatter is not handoff content and is not relayed.
        if kind == MessageKind::Lifecycle || is_lifecycle_noise(&body) {
            return Err(Rejection::LifecycleNoise);
        }
        self.profile_ref(to)?;
        let mailbox = self
            .mailboxes
            .get_mut(&to)
            .map(Arc::make_mut)
            .expect("every profile has a mailbox");
        if mailbox.messages.len() >= MAILBOX_MESSAGES_MAX {
            return Err(Rejection::MailboxFull {
                max: MAILBOX_MESSAGES_MAX,
            });
        }
        let seq = mailbox.next_seq;
        mailbox.next_seq += 1;
        mailbox.messages.insert(
            seq,
            MailboxMessage {
                seq,
                sender,
                kind,
                payload: MessagePayload::Text(body),
                posted_at_ms: now,
            },
        );
        Ok(Outcome::MessagePosted { seq })
    }

    /// Who may post to `to`: a peer of the same project under its current lease, or an operator.
    fn check_sender(
        &self,
        now: u64,
        to: ProfileId,
        sender: &MessageSender,
    ) -> Result<(), Rejection> {
        match sender {
            // INV-6: a peer posts only under its current lease.
            MessageSender::Profile(fence) => {
                self.check_fence(fence, now, true)?;
                let from = self.profile_ref(fence.profile)?;
                let target = self.profile_ref(to)?;
                if (&from.tenant, &from.project) != (&target.tenant, &target.project) {
                    return Err(Rejection::PermissionDenied {
                        reason: "profiles may write only to mailboxes of their own project".into(),
                    });
                }
                Ok(())
            }
            MessageSender::Operator(name) => Ok(check_descriptor("sender.operator", name, true)?),
            MessageSender::System => Err(Rejection::invalid(
                "sender",
                "system messages are posted by the control plane only",
            )),
        }
    }

    pub(crate) fn ack_messages(
        &mut self,
        now: u64,
        command: AckMessages,
    ) -> Result<Outcome, Rejection> {
        let AckMessages { fence, through_seq } = command;
        self.check_fence(&fence, now, true)?;
        let mailbox = self
            .mailboxes
            .get_mut(&fence.profile)
            .map(Arc::make_mut)
            .expect("every profile has a mailbox");
        let last_seq = mailbox.next_seq - 1;
        if through_seq > last_seq {
            return Err(Rejection::AckBeyondHead { last_seq });
        }
        // Acknowledging an older cursor again is harmless and answers the current cursor.
        if through_seq > mailbox.acked_through {
            mailbox.acked_through = through_seq;
            mailbox.messages = mailbox.messages.split_off(&(through_seq + 1));
        }
        // A reader that saw the resync flag fetched a roster snapshot before acknowledging.
        if through_seq == last_seq {
            mailbox.roster_resync_from = None;
        }
        Ok(Outcome::MessagesAcked {
            acked_through: mailbox.acked_through,
        })
    }

    /// Records a profile's new roster status as a revision and delivers the delta to every
    /// other profile of the project. Unchanged status makes no revision.
    pub(crate) fn publish_roster(&mut self, now: u64, profile: ProfileId, status: RosterStatus) {
        let p = &self.profiles[&profile];
        let entry = RosterEntry {
            profile,
            key: p.key.clone(),
            status,
        };
        let key = (p.tenant.clone(), p.project.clone());
        let Some(project) = self.projects.get_mut(&key) else {
            return;
        };
        if project.roster.entries.get(&profile) == Some(&entry) {
            return;
        }
        project.roster.revision += 1;
        let delta = RosterDelta {
            revision: project.roster.revision,
            entry: entry.clone(),
        };
        project.roster.entries.insert(profile, entry);
        project.roster.recent.push_back(delta.clone());
        while project.roster.recent.len() > ROSTER_REVISIONS_KEPT {
            project.roster.recent.pop_front();
        }
        let mut delivered = 0;
        for peer in project.profiles.iter().filter(|id| **id != profile) {
            let Some(mailbox) = self.mailboxes.get_mut(peer).map(Arc::make_mut) else {
                continue;
            };
            if mailbox.messages.len() >= MAILBOX_MESSAGES_MAX {
                // Never drop a delta silently: the peer is told to resync from a snapshot.
                mailbox.roster_resync_from.get_or_insert(delta.revision);
                continue;
            }
            let seq = mailbox.next_seq;
            mailbox.next_seq += 1;
            mailbox.messages.insert(
                seq,
                MailboxMessage {
                    seq,
                    sender: MessageSender::System,
                    kind: MessageKind::RosterDelta,
                    payload: MessagePayload::Roster(delta.clone()),
                    posted_at_ms: now,
                },
            );
            delivered += 1;
        }
        project.stats.roster_deliveries += delivered;
    }
}
