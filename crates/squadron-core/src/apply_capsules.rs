//! Continuity capsule commits (INV-7).

use crate::access::Subject;
use crate::capsule::{CapsuleDigestInput, CapsuleDraft, ContinuityCapsule};
use crate::command::CommitCapsule;
use crate::lease::RuntimeLease;
use crate::limits::CAPSULES_PER_PROFILE_KEPT;
use crate::profile::CapsuleHead;
use crate::rejection::Rejection;
use crate::response::Outcome;
use crate::state::State;

impl State {
    /// Builds the capsule a writer's draft describes and checks it against the chain, without
    /// changing anything. `writer` is the lease the fencing check already accepted.
    pub(crate) fn prepare_capsule(
        &self,
        writer: &RuntimeLease,
        draft: CapsuleDraft,
    ) -> Result<ContinuityCapsule, Rejection> {
        draft.validate()?;
        let profile = self.profile_ref(writer.profile)?;
        let (expected_sequence, expected_previous) = match profile.capsule_head {
            Some(head) => (head.sequence + 1, Some(head.digest)),
            None => (1, None),
        };
        if draft.sequence != expected_sequence || draft.previous != expected_previous {
            return Err(Rejection::ChainBroken {
                expected_sequence,
                expected_previous,
            });
        }
        let digest = CapsuleDigestInput {
            schema_version: draft.schema_version,
            profile: writer.profile,
            generation: writer.generation,
            sequence: draft.sequence,
            previous: draft.previous.as_ref(),
            payload: &draft.payload,
        }
        .digest();
        if let Some(expected) = draft.expected_digest {
            if expected != digest {
                return Err(Rejection::DigestMismatch { computed: digest });
            }
        }
        Ok(ContinuityCapsule {
            profile: writer.profile,
            lease: writer.id,
            generation: writer.generation,
            sequence: draft.sequence,
            previous: draft.previous,
            schema_version: draft.schema_version,
            payload: draft.payload,
            digest,
            committed_at_ms: self.clock_ms,
        })
    }

    /// Appends a prepared capsule and moves the chain head.
    pub(crate) fn append_capsule(&mut self, capsule: ContinuityCapsule) {
        let profile = self
            .profiles
            .get_mut(&capsule.profile)
            .expect("capsule was prepared for an existing profile");
        let expected = profile.capsule_head.map_or(1, |h| h.sequence + 1);
        assert_eq!(
            capsule.sequence, expected,
            "INV-7: capsule appended out of order"
        );
        profile.capsule_head = Some(CapsuleHead {
            sequence: capsule.sequence,
            digest: capsule.digest,
        });
        profile.capsules.push_back(capsule);
        while profile.capsules.len() > CAPSULES_PER_PROFILE_KEPT {
            profile.capsules.pop_front();
        }
    }

    pub(crate) fn commit_capsule(
        &mut self,
        now: u64,
        subject: &Subject,
        command: CommitCapsule,
    ) -> Result<Outcome, Rejection> {
        let CommitCapsule {
            fence,
            capsule: draft,
        } = command;
        let writer = self.check_fence(&fence, now, true)?.clone();
        self.require_holder_side(subject, &fence)?;
        let capsule = self.prepare_capsule(&writer, draft)?;
        let (sequence, digest) = (capsule.sequence, capsule.digest);
        self.append_capsule(capsule);
        Ok(Outcome::CapsuleCommitted { sequence, digest })
    }
}
