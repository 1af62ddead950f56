//! The CAS-register client: reads and compare-and-sets a profile's capability manifest.

use std::collections::HashMap;
use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};
use squadron_client::{Consistency, SetCapabilities, SquadronClient};
use squadron_core::ids::{ProfileId, SkillId};
use squadron_core::Outcome;

use crate::driver::Driver;
use crate::event::EventType;
use crate::outcome::{read_failure, write_failure};
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
}

impl CasClient {
    pub fn new(ctx: Arc<WorkloadContext>, client: SquadronClient, driver: Driver) -> Self {
        let reads = ctx.reads;
        Self {
            ctx,
            client,
            reads,
            driver,
            seen: HashMap::new(),
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
            if self.driver.rng.gen_bool(0.5) {
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
        if let Some(v) = out
            .get("version")
            .or_else(|| out.get("current"))
            .and_then(Value::as_u64)
        {
            self.seen.insert(profile, v);
        }
    }
}
