//! Idempotency records (INV-11): a command with a key is applied once; a retry with the same
//! key and the same command gets the first answer; the same key on another command is refused.

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::{Digest, IdempotencyKey};
use crate::limits::{IDEMPOTENCY_RECORDS_MAX, IDEMPOTENCY_RETENTION_MS};
use crate::response::Response;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IdempotencyRecord {
    /// SHA-256 of the command's log encoding, so a key reused for another command is caught.
    pub fingerprint: Digest,
    pub response: Response,
    pub at_ms: u64,
}

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum IdempotencyLookup<'a> {
    Miss,
    Replay(&'a Response),
    KeyReused,
}

/// Bounded both by count and by age; the oldest records go first, in an order every replica
/// computes alike.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IdempotencyLedger {
    records: BTreeMap<IdempotencyKey, IdempotencyRecord>,
    by_age: BTreeSet<(u64, IdempotencyKey)>,
}

impl IdempotencyLedger {
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn get(&self, key: &IdempotencyKey) -> Option<&IdempotencyRecord> {
        self.records.get(key)
    }

    pub fn lookup(&self, key: &IdempotencyKey, fingerprint: &Digest) -> IdempotencyLookup<'_> {
        match self.records.get(key) {
            None => IdempotencyLookup::Miss,
            Some(r) if &r.fingerprint == fingerprint => IdempotencyLookup::Replay(&r.response),
            Some(_) => IdempotencyLookup::KeyReused,
        }
    }

    pub fn record(
        &mut self,
        key: IdempotencyKey,
        fingerprint: Digest,
        response: Response,
        now_ms: u64,
    ) {
        self.by_age.insert((now_ms, key.clone()));
        let old = self.records.insert(
            key,
            IdempotencyRecord {
                fingerprint,
                response,
                at_ms: now_ms,
            },
        );
        assert!(old.is_none(), "idempotency record overwritten");
        while self.records.len() > IDEMPOTENCY_RECORDS_MAX {
            self.pop_oldest();
        }
    }

    /// When the oldest record was written.
    pub fn oldest_at(&self) -> Option<u64> {
        self.by_age.first().map(|(at, _)| *at)
    }

    /// Drops records older than the retention; returns how many went.
    pub fn prune(&mut self, now_ms: u64) -> u64 {
        let mut pruned = 0;
        while let Some((at, _)) = self.by_age.first() {
            if at.saturating_add(IDEMPOTENCY_RETENTION_MS) > now_ms {
                break;
            }
            self.pop_oldest();
            pruned += 1;
        }
        pruned
    }

    fn pop_oldest(&mut self) {
        if let Some((_, key)) = self.by_age.pop_first() {
            self.records.remove(&key);
        }
    }

    /// The age index and the records name the same keys.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.by_age.len() != self.records.len() {
            return Err(format!(
                "INV-11: idempotency index holds {} keys, records {}",
                self.by_age.len(),
                self.records.len()
            ));
        }
        for (at, key) in &self.by_age {
            match self.records.get(key) {
                Some(r) if r.at_ms == *at => {}
                _ => return Err(format!("INV-11: idempotency index entry {key} is stale")),
            }
        }
        Ok(())
    }
}
