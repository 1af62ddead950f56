//! The capsule client: reads a profile's chain head and appends a capsule that extends it,
//! under the profile's writer lease. It computes each draft's digest itself, so the history
//! knows the digest even of an append whose outcome is unknown.

use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};
use squadron_client::{CommitCapsule, Consistency, SquadronClient};
use squadron_core::capsule::{CapsuleDigestInput, CapsuleDraft, CapsulePayload};
use squadron_core::ids::{Digest, ProfileId};
use squadron_core::limits::CAPSULE_SCHEMA_VERSION_CURRENT;
use squadron_core::Outcome;

use crate::driver::Driver;
use crate::event::EventType;
use crate::outcome::{read_failure, write_failure};
use crate::workload_context::WorkloadContext;

/// One capsule client.
#[derive(Debug)]
pub struct CapsuleClient {
    ctx: Arc<WorkloadContext>,
    client: SquadronClient,
    pub driver: Driver,
    /// How reads are made: linearizable, or stale to show the checker catching stale reads.
    pub reads: Consistency,
    appended: u64,
}

impl CapsuleClient {
    pub fn new(ctx: Arc<WorkloadContext>, client: SquadronClient, driver: Driver) -> Self {
        let reads = ctx.reads;
        Self {
            ctx,
            client,
            reads,
            driver,
            appended: 0,
        }
    }

    pub async fn run(mut self) {
        while !self.driver.done() {
            self.driver.pace().await;
            if self.driver.done() {
                break;
            }
            let Some(&profile) = self.ctx.profiles.choose(&mut self.driver.rng) else {
                return;
            };
            let Some(head) = self.read(profile, Value::Null).await else {
                continue;
            };
            if self.driver.rng.gen_bool(0.8) {
                self.append(profile, head).await;
            }
        }
    }

    /// Reads the head; `None` when the read failed.
    pub async fn read(
        &mut self,
        profile: ProfileId,
        input: Value,
    ) -> Option<(u64, Option<Digest>)> {
        let key = self.ctx.workload.key(profile);
        let client = self.client.clone();
        let reads = self.reads;
        let mut head = None;
        self.driver
            .op("read", &key, input, async {
                match client.get_profile(profile, reads).await {
                    Ok(p) => {
                        let h = p
                            .capsule_head
                            .map(|h| (h.sequence, Some(h.digest)))
                            .unwrap_or((0, None));
                        head = Some(h);
                        Ok(json!({"sequence": h.0, "digest": h.1.map(|d| d.to_string())}))
                    }
                    Err(e) => Err(read_failure(&e)),
                }
            })
            .await;
        head
    }

    /// Reads the kept tail of the chain (`chain`, for the INV-7 checker).
    pub async fn chain(&mut self, profile: ProfileId) -> EventType {
        let key = self.ctx.workload.key(profile);
        let client = self.client.clone();
        let reads = self.reads;
        self.driver
            .op("chain", &key, Value::Null, async {
                match client.list_capsules(profile, reads).await {
                    Ok(list) => Ok(json!({"capsules": list.iter().map(|c| json!({
                        "sequence": c.sequence,
                        "previous": c.previous.map(|d| d.to_string()),
                        "digest": c.digest.to_string(),
                    })).collect::<Vec<_>>()})),
                    Err(e) => Err(read_failure(&e)),
                }
            })
            .await
            .0
    }

    async fn append(&mut self, profile: ProfileId, head: (u64, Option<Digest>)) {
        let Some(&(lease, generation)) = self.ctx.writers.get(&profile) else {
            return;
        };
        let key = self.ctx.workload.key(profile);
        self.appended += 1;
        let payload = CapsulePayload {
            task_state: format!(
                "process {} append {} nonce {}",
                self.driver.process,
                self.appended,
                self.driver.rng.gen::<u32>()
            ),
            ..CapsulePayload::default()
        };
        let sequence = head.0 + 1;
        let digest = CapsuleDigestInput {
            schema_version: CAPSULE_SCHEMA_VERSION_CURRENT,
            profile,
            generation,
            sequence,
            previous: head.1.as_ref(),
            payload: &payload,
        }
        .digest();
        let req = CommitCapsule {
            lease,
            generation,
            capsule: CapsuleDraft {
                sequence,
                previous: head.1,
                schema_version: CAPSULE_SCHEMA_VERSION_CURRENT,
                payload,
                expected_digest: Some(digest),
            },
        };
        let client = self.client.clone();
        let input = json!({
            "sequence": sequence,
            "previous": head.1.map(|d| d.to_string()),
            "digest": digest.to_string(),
        });
        self.driver
            .op("append", &key, input, async {
                match client.commit_capsule(profile, &req, None).await {
                    Ok(Outcome::CapsuleCommitted { sequence, digest }) => {
                        Ok(json!({"sequence": sequence, "digest": digest.to_string()}))
                    }
                    Ok(other) => Err((
                        EventType::Info,
                        json!({"error": "unexpected", "message": format!("{other:?}")}),
                    )),
                    Err(e) => Err(write_failure(&e)),
                }
            })
            .await;
    }
}
