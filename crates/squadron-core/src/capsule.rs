//! Continuity capsules: the provider-neutral record that carries an identity's working state
//! across provider swaps and crashes, chained by digest (INV-7).
//!
//! The digest is SHA-256 over the canonical encoding specified in `docs/capsule-encoding.md`.
//! That encoding is hand-written rather than derived from serde so that it can never drift with
//! a library upgrade: a capsule committed today must verify in ten years.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::ids::{Digest, Generation, LeaseId, ProfileId};
use crate::limits::{
    CAPSULE_LIST_ITEMS_MAX, CAPSULE_PAYLOAD_BYTES_MAX, CAPSULE_SCHEMA_VERSION_CURRENT,
};
use crate::validation_error::ValidationError;

/// Domain-separation prefix of the canonical encoding, schema version 1.
pub const CAPSULE_ENCODING_PREFIX_V1: &[u8] = b"squadron/capsule/v1\n";

/// The working state a capsule carries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct CapsulePayload {
    /// Canonical task state, as the agent chooses to write it.
    pub task_state: String,
    pub decisions: Vec<String>,
    pub pending_work: Vec<String>,
    /// The repository revision (commit id) the state refers to.
    pub repository_revision: String,
    /// The mailbox sequence the agent had processed.
    pub mailbox_cursor: u64,
    pub context_ref: String,
}

/// What a writer submits: the chain position it believes in and the payload. The core computes
/// the digest; `expected_digest`, when given, must equal it ("commit and verify").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CapsuleDraft {
    pub sequence: u64,
    pub previous: Option<Digest>,
    pub schema_version: u32,
    pub payload: CapsulePayload,
    pub expected_digest: Option<Digest>,
}

/// A committed capsule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ContinuityCapsule {
    pub profile: ProfileId,
    pub lease: LeaseId,
    pub generation: Generation,
    pub sequence: u64,
    pub previous: Option<Digest>,
    pub schema_version: u32,
    pub payload: CapsulePayload,
    pub digest: Digest,
    pub committed_at_ms: u64,
}

/// The fields the digest covers, in canonical order.
#[derive(Debug, Clone, Copy)]
pub struct CapsuleDigestInput<'a> {
    pub schema_version: u32,
    pub profile: ProfileId,
    pub generation: Generation,
    pub sequence: u64,
    pub previous: Option<&'a Digest>,
    pub payload: &'a CapsulePayload,
}

impl CapsuleDigestInput<'_> {
    /// The canonical encoding: the prefix, then big-endian integers, then each string as a
    /// big-endian u32 byte length followed by its UTF-8 bytes, lists as a u32 count followed by
    /// their strings, the previous digest as a presence byte (0 or 1) followed by 32 bytes.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let p = self.payload;
        let mut out = Vec::with_capacity(256 + p.task_state.len());
        out.extend_from_slice(CAPSULE_ENCODING_PREFIX_V1);
        out.extend_from_slice(&self.schema_version.to_be_bytes());
        out.extend_from_slice(&self.profile.get().to_be_bytes());
        out.extend_from_slice(&self.generation.get().to_be_bytes());
        out.extend_from_slice(&self.sequence.to_be_bytes());
        match self.previous {
            Some(d) => {
                out.push(1);
                out.extend_from_slice(d.as_bytes());
            }
            None => out.push(0),
        }
        put_str(&mut out, &p.task_state);
        put_list(&mut out, &p.decisions);
        put_list(&mut out, &p.pending_work);
        put_str(&mut out, &p.repository_revision);
        out.extend_from_slice(&p.mailbox_cursor.to_be_bytes());
        put_str(&mut out, &p.context_ref);
        out
    }

    pub fn digest(&self) -> Digest {
        Digest::from_bytes(Sha256::digest(self.canonical_bytes()).into())
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Lengths are bounded by CAPSULE_PAYLOAD_BYTES_MAX long before u32 overflows.
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_list(out: &mut Vec<u8>, items: &[String]) {
    out.extend_from_slice(&(items.len() as u32).to_be_bytes());
    for item in items {
        put_str(out, item);
    }
}

impl CapsuleDraft {
    /// Checks what can be checked without the chain: schema version and sizes.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.schema_version != CAPSULE_SCHEMA_VERSION_CURRENT {
            return Err(ValidationError::new(
                "capsule.schema_version",
                format!(
                    "unsupported schema version {}; this cluster verifies version {}",
                    self.schema_version, CAPSULE_SCHEMA_VERSION_CURRENT
                ),
            ));
        }
        if self.sequence == 0 {
            return Err(ValidationError::new(
                "capsule.sequence",
                "starts at 1, got 0",
            ));
        }
        let p = &self.payload;
        for (field, list) in [
            ("capsule.payload.decisions", &p.decisions),
            ("capsule.payload.pending_work", &p.pending_work),
        ] {
            if list.len() > CAPSULE_LIST_ITEMS_MAX {
                return Err(ValidationError::new(
                    field,
                    format!(
                        "must have at most {CAPSULE_LIST_ITEMS_MAX} items, got {}",
                        list.len()
                    ),
                ));
            }
        }
        let size = p.task_state.len()
            + p.repository_revision.len()
            + p.context_ref.len()
            + p.decisions.iter().map(String::len).sum::<usize>()
            + p.pending_work.iter().map(String::len).sum::<usize>();
        if size > CAPSULE_PAYLOAD_BYTES_MAX {
            return Err(ValidationError::new(
                "capsule.payload",
                format!("must be at most {CAPSULE_PAYLOAD_BYTES_MAX} bytes, got {size}"),
            ));
        }
        Ok(())
    }
}

impl ContinuityCapsule {
    pub fn digest_input(&self) -> CapsuleDigestInput<'_> {
        CapsuleDigestInput {
            schema_version: self.schema_version,
            profile: self.profile,
            generation: self.generation,
            sequence: self.sequence,
            previous: self.previous.as_ref(),
            payload: &self.payload,
        }
    }

    /// Recomputes the digest from the content; true when the stored digest is honest.
    pub fn verify(&self) -> bool {
        self.digest_input().digest() == self.digest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload() -> CapsulePayload {
        CapsulePayload {
            task_state: "refactoring auth".into(),
            decisions: vec!["use oauth2".into()],
            pending_work: vec!["update tests".into(), "docs".into()],
            repository_revision: "0123abc".into(),
            mailbox_cursor: 7,
            context_ref: "ctx://1".into(),
        }
    }

    fn input<'a>(p: &'a CapsulePayload, prev: Option<&'a Digest>) -> CapsuleDigestInput<'a> {
        CapsuleDigestInput {
            schema_version: 1,
            profile: ProfileId::new(3).unwrap(),
            generation: Generation::new(2),
            sequence: 5,
            previous: prev,
            payload: p,
        }
    }

    /// Pins the canonical encoding: if this vector changes, every capsule ever committed stops
    /// verifying. The same vector is printed in docs/capsule-encoding.md.
    #[test]
    fn canonical_digest_is_pinned() {
        let p = payload();
        let d = input(&p, None).digest();
        assert_eq!(
            d.to_hex(),
            "1aea511406a8ef11627f9dafa62ae653c5b3fd6ab59ee291da3ec8d80d3c34b4",
            "canonical capsule encoding changed; see docs/capsule-encoding.md"
        );
    }

    #[test]
    fn every_field_changes_the_digest() {
        let p = payload();
        let base = input(&p, None).digest();
        let prev = Digest::from_bytes([9; 32]);
        assert_ne!(input(&p, Some(&prev)).digest(), base);
        let mut i = input(&p, None);
        i.sequence = 6;
        assert_ne!(i.digest(), base);
        let mut i = input(&p, None);
        i.generation = Generation::new(3);
        assert_ne!(i.digest(), base);
        let mut i = input(&p, None);
        i.profile = ProfileId::new(4).unwrap();
        assert_ne!(i.digest(), base);
        let mutations: Vec<fn(&mut CapsulePayload)> = vec![
            |p| p.task_state.push('x'),
            |p| p.decisions.push(String::new()),
            |p| p.pending_work.pop().map(drop).unwrap_or(()),
            |p| p.repository_revision.push('d'),
            |p| p.mailbox_cursor += 1,
            |p| p.context_ref.clear(),
        ];
        for m in mutations {
            let mut q = payload();
            m(&mut q);
            assert_ne!(input(&q, None).digest(), base);
        }
    }

    #[test]
    fn length_prefixes_prevent_boundary_shifts() {
        let mut a = payload();
        a.decisions = vec!["ab".into(), "c".into()];
        let mut b = payload();
        b.decisions = vec!["a".into(), "bc".into()];
        assert_ne!(input(&a, None).digest(), input(&b, None).digest());
    }

    #[test]
    fn draft_validation_names_fields() {
        let mut d = CapsuleDraft {
            sequence: 1,
            previous: None,
            schema_version: 2,
            payload: payload(),
            expected_digest: None,
        };
        assert_eq!(d.validate().unwrap_err().field, "capsule.schema_version");
        d.schema_version = 1;
        d.sequence = 0;
        assert_eq!(d.validate().unwrap_err().field, "capsule.sequence");
        d.sequence = 1;
        d.payload.task_state = "x".repeat(CAPSULE_PAYLOAD_BYTES_MAX + 1);
        assert_eq!(d.validate().unwrap_err().field, "capsule.payload");
        d.payload = payload();
        d.payload.decisions = vec![String::new(); CAPSULE_LIST_ITEMS_MAX + 1];
        assert_eq!(d.validate().unwrap_err().field, "capsule.payload.decisions");
    }
}
