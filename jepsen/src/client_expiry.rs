//! The expiring-lease client: short leases that are released, renewed, or abandoned to expire;
//! a fenced lease (expired and swept) is ended with reap evidence so the profile can move on.
//! Under the clock nemesis the leader's skewed stamps decide when leases expire.

use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};
use squadron_client::{
    now_ms, AcquireLease, Consistency, LeaseFence, OutcomeExt, RecordEvidence, RenewLease,
    SquadronClient,
};
use squadron_core::ids::{Generation, LeaseId, ProfileId};
use squadron_core::provider::Provider;

use crate::driver::Driver;
use crate::event::EventType;
use crate::outcome::{read_failure, write_failure};
use crate::workload_context::WorkloadContext;

/// The TTL of every lease of this workload: a few sweeps long, so leases do expire.
pub const EXPIRY_TTL_MS: u64 = 2_000;

/// A profile as the expiring register sees it.
#[derive(Debug, Clone, Copy)]
enum View {
    Idle(Generation),
    Live(Generation),
    Fenced(Generation, LeaseId),
}

/// One expiring-lease client.
#[derive(Debug)]
pub struct ExpiryClient {
    ctx: Arc<WorkloadContext>,
    client: SquadronClient,
    pub driver: Driver,
    /// How reads are made (see `LeaseClient`).
    pub reads: Consistency,
    holding: Option<(ProfileId, Generation, LeaseId)>,
}

impl ExpiryClient {
    pub fn new(ctx: Arc<WorkloadContext>, client: SquadronClient, driver: Driver) -> Self {
        let reads = ctx.reads;
        Self {
            ctx,
            client,
            driver,
            reads,
            holding: None,
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
    }

    async fn step(&mut self) {
        if let Some((profile, generation, lease)) = self.holding {
            let roll: f64 = self.driver.rng.gen();
            if roll < 0.35 {
                self.holding = None;
                self.fenced_op("release", profile, generation, lease).await;
            } else if roll < 0.7 {
                self.fenced_op("renew", profile, generation, lease).await;
            } else {
                // Abandon it: it expires, is fenced by the sweep, and someone reaps it.
                self.holding = None;
            }
            return;
        }
        let Some(&profile) = self.ctx.profiles.choose(&mut self.driver.rng) else {
            return;
        };
        match self.read(profile, Value::Null).await {
            Some(View::Idle(g)) => self.acquire(profile, g).await,
            Some(View::Fenced(g, lease)) => self.reap(profile, g, lease).await,
            Some(View::Live(_)) | None => {}
        }
    }

    async fn read_view(
        client: &SquadronClient,
        profile: ProfileId,
        reads: Consistency,
    ) -> Result<View, squadron_client::ClientError> {
        let p = client.get_profile(profile, reads).await?;
        Ok(match (p.live_lease, p.fenced_unreaped.last()) {
            (Some(_), _) => View::Live(p.generation),
            (None, Some(l)) => View::Fenced(p.generation, *l),
            (None, None) => View::Idle(p.generation),
        })
    }

    /// A read of the profile's phase, recorded; `None` when it failed.
    async fn read(&mut self, profile: ProfileId, input: Value) -> Option<View> {
        let key = self.ctx.workload.key(profile);
        let client = self.client.clone();
        let reads = self.reads;
        let mut view = None;
        self.driver
            .op("read", &key, input, async {
                match Self::read_view(&client, profile, reads).await {
                    Ok(v) => {
                        view = Some(v);
                        let (g, phase) = match v {
                            View::Idle(g) => (g, "idle"),
                            View::Live(g) => (g, "live"),
                            View::Fenced(g, _) => (g, "fenced"),
                        };
                        Ok(json!({"generation": g.get(), "phase": phase}))
                    }
                    Err(e) => Err(read_failure(&e)),
                }
            })
            .await;
        view
    }

    /// Whether a final read succeeded.
    pub async fn final_read(&mut self, profile: ProfileId) -> bool {
        self.read(profile, crate::workload::final_input())
            .await
            .is_some()
    }

    async fn acquire(&mut self, profile: ProfileId, expected: Generation) {
        let key = self.ctx.workload.key(profile);
        let req = AcquireLease {
            expected_generation: expected,
            provider: Provider::Codex,
            holder: self.ctx.holder(self.driver.process),
            ttl_ms: EXPIRY_TTL_MS,
        };
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
        if let (EventType::Ok, Some(g)) = (kind, grant) {
            self.holding = Some((profile, g.generation, g.lease));
        }
    }

    /// `release` or `renew` with the lease's fencing triple.
    async fn fenced_op(
        &mut self,
        f: &'static str,
        profile: ProfileId,
        generation: Generation,
        lease: LeaseId,
    ) {
        let key = self.ctx.workload.key(profile);
        let client = self.client.clone();
        let input = json!({"generation": generation.get(), "lease": lease.get()});
        let (kind, _) = self
            .driver
            .op(f, &key, input, async {
                let result = if f == "renew" {
                    let req = RenewLease {
                        profile,
                        generation,
                        ttl_ms: EXPIRY_TTL_MS,
                    };
                    client.renew_lease(lease, &req, None).await
                } else {
                    client
                        .release_lease(
                            lease,
                            &LeaseFence {
                                profile,
                                generation,
                            },
                            None,
                        )
                        .await
                };
                match result {
                    Ok(_) => Ok(Value::Null),
                    Err(e) => Err(write_failure(&e)),
                }
            })
            .await;
        if f == "renew" && kind != EventType::Ok {
            // Expired or fenced: the lease is lost; someone reaps it.
            self.holding = None;
        }
    }

    /// Ends a fenced lease with reap evidence (this suite's stand-in for a worker that saw the
    /// lease's cgroup empty).
    async fn reap(&mut self, profile: ProfileId, generation: Generation, lease: LeaseId) {
        let key = self.ctx.workload.key(profile);
        let client = self.client.clone();
        let as_worker = self.ctx.as_worker.clone();
        let input = json!({"generation": generation.get(), "lease": lease.get()});
        self.driver
            .op("reap", &key, input, async {
                // Evidence must not predate the grant, which the leader stamped with its own
                // (possibly skewed) clock.
                let granted = client
                    .get_lease(lease, Consistency::Linearizable)
                    .await
                    .map(|l| l.granted_at_ms)
                    .map_err(|e| read_failure(&e))?;
                let req = RecordEvidence {
                    profile,
                    generation,
                    cgroup: format!("jepsen/lease-{}", lease.get()),
                    populated: false,
                    observed_at_ms: now_ms().max(granted),
                };
                // Evidence is the holder's worker's to post.
                match as_worker.record_evidence(lease, &req, None).await {
                    Ok(_) => Ok(json!({"slot_freed": true})),
                    Err(e) => Err(write_failure(&e)),
                }
            })
            .await;
    }
}
