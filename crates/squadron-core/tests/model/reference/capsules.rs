//! The model's capsule commits (INV-7).

use crate::*;

impl Model {
    pub(crate) fn commit_capsule(&mut self, c: &CommitCapsule) -> MResult<Outcome> {
        let CommitCapsule { fence, capsule } = c;
        let writer = self.check_fence(fence, true)?;
        let (sequence, digest) = self.check_capsule(writer, capsule)?;
        let p = self.leases[&writer].profile;
        self.profiles[p].head = Some((sequence, digest));
        Ok(Outcome::CapsuleCommitted { sequence, digest })
    }

    /// INV-7: the draft continues the chain; returns (sequence, digest) of the new head.
    pub(crate) fn check_capsule(
        &self,
        writer: u64,
        draft: &CapsuleDraft,
    ) -> MResult<(u64, Digest)> {
        if draft.schema_version != 1 || draft.sequence == 0 {
            return rej("Invalid");
        }
        let l = &self.leases[&writer];
        let head = self.profiles[l.profile].head;
        let expected_sequence = head.map_or(1, |h| h.0 + 1);
        let expected_previous = head.map(|h| h.1);
        if draft.sequence != expected_sequence || draft.previous != expected_previous {
            return Err(Rej::Exact(Rejection::ChainBroken {
                expected_sequence,
                expected_previous,
            }));
        }
        let digest = capsule_digest(l.profile, l.generation, draft);
        if draft.expected_digest.is_some_and(|d| d != digest) {
            return Err(Rej::Exact(Rejection::DigestMismatch { computed: digest }));
        }
        Ok((draft.sequence, digest))
    }
}

pub(crate) fn capsule_digest(profile: usize, generation: u64, draft: &CapsuleDraft) -> Digest {
    CapsuleDigestInput {
        schema_version: draft.schema_version,
        profile: profile_id(profile),
        generation: Generation::new(generation),
        sequence: draft.sequence,
        previous: draft.previous.as_ref(),
        payload: &draft.payload,
    }
    .digest()
}
