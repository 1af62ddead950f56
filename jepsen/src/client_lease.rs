//! The lease-register and capacity clients: read a profile, acquire it with the generation
//! read, hold it a while, release it; release orphans of unknown outcomes.

use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};
use squadron_client::{AcquireLease, Consistency, LeaseFence, OutcomeExt, SquadronClient};
use squadron_core::ids::{Generation, LeaseId, ProfileId};
use squadron_core::provider::Provider;

use crate::driver::Driver;
use crate::event::EventType;
use crate::outcome::{read_failure, write_failure};
use crate::workload::{Workload, LEASE_TTL_MS};
use crate::workload_context::{Holdings, WorkloadContext};

/// A profile as the lease register sees it.
#[derive(Debug, Clone, Copy)]
pub struct LeaseView {
    pub generation: Generation,
    pub live: Option<LeaseId>,
}

/// One lease client.
#[derive(Debug)]
pub struct LeaseClient {
    ctx: Arc<WorkloadContext>,
    client: SquadronClient,
    pub driver: Driver,
    /// How reads are made: linearizable, or stale to show the checker catching stale reads.
    pub reads: Consistency,
    holding: Option<(ProfileId, Generation, LeaseId)>,
}

impl LeaseClient {
    pub fn new(ctx: Arc<WorkloadContext>, client: SquadronClient, driver: Driver) -> Self {
        let reads = ctx.reads;
        Self {
            ctx,
            client,
            reads,
            driver,
            holding: None,
        }
    }

    fn release_chance(&self) -> f64 {
        match self.ctx.workload {
            Workload::Capacity => 0.3,
            _ => 0.5,
        }
    }

    pub async fn run(mut self) {
        while !self.driver.done() {
            self.driver.pace().await;
            if self.driver.done() {
                break;
            }
            self.step().await;
        }
        // A lease still held at the end stays held: the final reads see it live.
    }

    async fn step(&mut self) {
        if let Some((profile, generation, lease)) = self.holding {
            if self.driver.rng.gen_bool(self.release_chance()) {
                self.holding = None;
                self.release(profile, generation, lease).await;
                self.holdings_mut(|h| {
                    h.held.remove(&profile);
                });
            } else {
                self.read(profile, Value::Null).await;
            }
            return;
        }
        let Some(&profile) = self.ctx.profiles.choose(&mut self.driver.rng) else {
            return;
        };
        let Some(view) = self.read(profile, Value::Null).await else {
            return;
        };
        match view.live {
            Some(lease) => {
                let orphan = self.holdings_mut(|h| {
                    h.held.get(&profile) != Some(&view.generation)
                        && !h.in_flight.contains_key(&profile)
                });
                if orphan {
                    self.release(profile, view.generation, lease).await;
                }
            }
            None => self.acquire(profile, view.generation).await,
        }
    }

    fn holdings_mut<T>(&self, f: impl FnOnce(&mut Holdings) -> T) -> T {
        let mut h = self.ctx.holdings.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut h)
    }

    /// A linearizable read of the profile, recorded; `None` when it failed.
    pub async fn read(&mut self, profile: ProfileId, input: Value) -> Option<LeaseView> {
        let key = self.ctx.workload.key(profile);
        let client = self.client.clone();
        let reads = self.reads;
        let mut view = None;
        let (kind, _) = self
            .driver
            .op("read", &key, input, async {
                match client.get_profile(profile, reads).await {
                    Ok(p) => {
                        view = Some(LeaseView {
                            generation: p.generation,
                            live: p.live_lease,
                        });
                        Ok(json!({
                            "generation": p.generation.get(),
                            "live": p.live_lease.is_some(),
                            "lease": p.live_lease.map(|l| l.get()),
                        }))
                    }
                    Err(e) => Err(read_failure(&e)),
                }
            })
            .await;
        if kind == EventType::Ok {
            view
        } else {
            None
        }
    }

    async fn acquire(&mut self, profile: ProfileId, expected: Generation) {
        let key = self.ctx.workload.key(profile);
        let req = AcquireLease {
            expected_generation: expected,
            provider: Provider::Codex,
            holder: self.ctx.holder(self.driver.process),
            ttl_ms: LEASE_TTL_MS,
        };
        self.holdings_mut(|h| *h.in_flight.entry(profile).or_default() += 1);
        let client = self.client.clone();
        let mut grant = None;
        let (kind, _) = self
            .driver
            .op("acquire", &key, json!({"expected": expected.get()}), async {
                match client.acquire_lease(profile, &req, None).await {
                    Ok(outcome) => match outcome.lease_grant() {
                        Some(g) => {
                            grant = Some(g);
                            Ok(json!({"generation": g.generation.get(), "lease": g.lease.get()}))
                        }
                        None => Err((EventType::Info, json!({"error": "unexpected", "message": format!("{outcome:?}")}))),
                    },
                    Err(e) => Err(write_failure(&e)),
                }
            })
            .await;
        // Held is recorded before in-flight is cleared, under one lock, so an observer never
        // sees this lease as neither.
        self.holdings_mut(|h| {
            if let (EventType::Ok, Some(g)) = (kind, grant) {
                h.held.insert(profile, g.generation);
            }
            if let Some(n) = h.in_flight.get_mut(&profile) {
                *n -= 1;
                if *n == 0 {
                    h.in_flight.remove(&profile);
                }
            }
        });
        if let (EventType::Ok, Some(g)) = (kind, grant) {
            self.holding = Some((profile, g.generation, g.lease));
        }
    }

    async fn release(&mut self, profile: ProfileId, generation: Generation, lease: LeaseId) {
        let key = self.ctx.workload.key(profile);
        let req = LeaseFence {
            profile,
            generation,
        };
        let client = self.client.clone();
        self.driver
            .op(
                "release",
                &key,
                json!({"generation": generation.get(), "lease": lease.get()}),
                async {
                    match client.release_lease(lease, &req, None).await {
                        Ok(_) => Ok(Value::Null),
                        Err(e) => Err(write_failure(&e)),
                    }
                },
            )
            .await;
    }
}
