//! The CAS-register client: reads and compare-and-sets a profile's capability manifest; in
//! the `keyed` workload every write carries an idempotency key and is retried and replayed
//! (`client_keyed.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};
use squadron_client::{Consistency, SetCapabilities, SquadronClient};
use squadron_core::ids::{ProfileId, SkillId};
use squadron_core::Outcome;

use crate::client_keyed::{self, KeyedWrite, Replay, REPLAYS_PENDING_MAX};
use crate::driver::Driver;
use crate::event::EventType;
use crate::outcome::{read_failure, write_failure};
use crate::workload::Workload;
use crate::workload_context::WorkloadContext;

/// Values written are `1..=CAS_VALUE_MAX`.
pub const CAS_VALUE_MAX: u64 = 1_000;

/// One CAS client; it remembers the last version it saw per key.
#[derive(Debug)]
pub struct CasClient {
    ctx: Arc<WorkloadContext>,
    client: SquadronClient,
    pub driver: Driver,
    /// How reads are made: linearizable, or stale to show the checker catching stale reads.
    pub reads: Consistency,
    seen: HashMap<ProfileId, u64>,
    /// Writes carry idempotency keys and are retried on other nodes (`keyed` workload).
    keyed: bool,
    /// Answered keyed writes waiting to be replayed.
    replays: Vec<Replay>,
}

impl CasClient {
    pub fn new(ctx: Arc<WorkloadContext>, client: SquadronClient, driver: Driver) -> Self {
        let reads = ctx.reads;
        let keyed = ctx.workload == Workload::Keyed;
        Self {
            ctx,
            client,
            reads,
            driver,
            seen: HashMap::new(),
            keyed,
            replays: Vec::new(),
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
            let due = self.replays.iter().position(Replay::is_due);
            if let Some(i) = due.filter(|_| self.driver.rng.gen_bool(0.3)) {
                let replay = self.replays.swap_remove(i);
                self.replay(replay).await;
            } else if self.driver.rng.gen_bool(0.5) {
                self.read(profile, Value::Null).await;
            } else {
                self.cas(profile).await;
            }
        }
    }

    pub async fn read(&mut self, profile: ProfileId, input: Value) -> EventType {
        let key = self.ctx.workload.key(profile);
        let client = self.client.clone();
        let reads = self.reads;
        let mut version = None;
        let (kind, _) = self
            .driver
            .op("read", &key, input, async {
                match client.get_profile(profile, reads).await {
                    Ok(p) => {
                        let caps = &p.capabilities;
                        let value = caps.required_skills.iter().next().and_then(|s| {
                            s.as_str()
                                .strip_prefix('v')
                                .and_then(|n| n.parse::<u64>().ok())
                        });
                        version = Some(caps.version);
                        Ok(json!({"version": caps.version, "value": value}))
                    }
                    Err(e) => Err(read_failure(&e)),
                }
            })
            .await;
        if let Some(v) = version {
            self.seen.insert(profile, v);
        }
        kind
    }

    async fn cas(&mut self, profile: ProfileId) {
        let key = self.ctx.workload.key(profile);
        let expected = self.seen.get(&profile).copied().unwrap_or(0);
        let value = self.driver.rng.gen_range(1..=CAS_VALUE_MAX);
        let Ok(skill) = SkillId::new(format!("v{value}")) else {
            return;
        };
        let req = SetCapabilities {
            expected_version: expected,
            required_skills: vec![skill],
            mcp_servers: Vec::new(),
        };
        if self.keyed {
            return self.keyed_cas(profile, req, expected, value).await;
        }
        let client = self.client.clone();
        let (_, out) = self
            .driver
            .op(
                "cas",
                &key,
                json!({"expected": expected, "value": value}),
                async {
                    match client.set_capabilities(profile, &req, None).await {
                        Ok(Outcome::CapabilityManifestSet { version }) => {
                            Ok(json!({"version": version}))
                        }
                        Ok(other) => Err((
                            EventType::Info,
                            json!({"error": "unexpected", "message": format!("{other:?}")}),
                        )),
                        Err(e) => Err(write_failure(&e)),
                    }
                },
            )
            .await;
        self.saw(profile, &out);
    }

    fn saw(&mut self, profile: ProfileId, out: &Value) {
        if let Some(v) = out
            .get("version")
            .or_else(|| out.get("current"))
            .and_then(Value::as_u64)
        {
            self.seen.insert(profile, v);
        }
    }

    /// The CAS under an idempotency key, sent node after node until one answers; an answer
    /// the node's idempotency record keeps may be replayed later.
    async fn keyed_cas(
        &mut self,
        profile: ProfileId,
        req: SetCapabilities,
        expected: u64,
        value: u64,
    ) {
        let key = self.ctx.workload.key(profile);
        let write = KeyedWrite {
            profile,
            request: req,
            key: squadron_client::new_idempotency_key(),
        };
        let nodes = self.client.endpoints().to_vec();
        if nodes.is_empty() {
            return;
        }
        let first = self.driver.rng.gen_range(0..nodes.len());
        let client = self.client.clone();
        let input = json!({"expected": expected, "value": value,
                           "idempotency_key": write.key.as_str()});
        let (kind, out) = self
            .driver
            .op(
                "cas",
                &key,
                input,
                client_keyed::send(&client, &nodes, first, &write),
            )
            .await;
        self.saw(profile, &out);
        if client_keyed::is_recorded(kind, &out) {
            if self.replays.len() >= REPLAYS_PENDING_MAX {
                self.replays.remove(0);
            }
            self.replays.push(Replay {
                write,
                answer: client_keyed::answer_of(&out),
                answered_at: tokio::time::Instant::now(),
            });
        }
    }

    /// Sends an answered write again, same request and key, starting at a random node: the
    /// answer must be the first one (checked by `invariants::inv11_replays`). The register
    /// must not change (the model ignores replays, so a second effect is non-linearizable).
    async fn replay(&mut self, replay: Replay) {
        let key = self.ctx.workload.key(replay.write.profile);
        let nodes = self.client.endpoints().to_vec();
        if nodes.is_empty() {
            return;
        }
        let first = self.driver.rng.gen_range(0..nodes.len());
        let client = self.client.clone();
        let input = json!({"idempotency_key": replay.write.key.as_str(), "answer": replay.answer});
        self.driver
            .op("replay", &key, input, async {
                match client_keyed::send(&client, &nodes, first, &replay.write).await {
                    Ok(out) => Ok(json!({"answer": client_keyed::answer_of(&out)})),
                    Err((EventType::Fail, out)) if out["error"] != "unreachable" => {
                        Ok(json!({"answer": client_keyed::answer_of(&out)}))
                    }
                    // No node answered: nothing to compare.
                    Err((_, out)) => Err((EventType::Fail, out)),
                }
            })
            .await;
    }
}
