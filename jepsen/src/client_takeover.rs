//! The takeover client (`takeover` workload): drives its profiles' provider processes on the
//! harness's real worker through the operator's agent API — launches, graceful takeovers,
//! crash takeovers after a `kill -9` of the generation's cgroup, stops — and after each
//! takeover has the replaced generation try to commit a capsule: a stale writer the control
//! plane must refuse (INV-6, dual writers 0). `model_takeover.rs` judges the generations.

use std::time::Duration;

use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};
use squadron_api::agents::{
    AgentStatus, AgentView, LaunchAgent, StopAgent, TakeoverAgent, TakeoverKind,
};
use squadron_client::{ClientError, CommitCapsule, Consistency, SquadronClient};
use squadron_core::capsule::{CapsuleDigestInput, CapsuleDraft, CapsulePayload};
use squadron_core::ids::{Generation, LeaseId, ProfileId};
use squadron_core::limits::CAPSULE_SCHEMA_VERSION_CURRENT;
use squadron_core::profile::CapsuleHead;
use squadron_core::{Outcome, Rejection};

use crate::driver::Driver;
use crate::event::EventType;
use crate::outcome::{read_failure, write_failure};
use crate::worker_process::AGENT_LEASE_TTL_MS;

/// How long the worker may take to see a killed generation as crashed.
const CRASH_SEEN_MS_MAX: u64 = 15_000;
/// How often that wait looks again.
const CRASH_POLL_MS: u64 = 250;

/// The one key of a profile's operations.
pub fn takeover_key(profile: ProfileId) -> String {
    format!("takeover/{}", profile.get())
}

/// The completion of a launch or takeover that failed. Only a refusal of the acquisition
/// itself says nothing happened; anything else may have come after the worker's grant (the
/// worker acquires the lease itself, and an error later in its launch or takeover does not
/// say whether that grant was applied), so it is unknown.
pub fn agent_failure(e: &ClientError) -> (EventType, Value) {
    let (kind, value) = write_failure(e);
    let refused_before_grant = matches!(e, ClientError::Api { status: 429, .. })
        || matches!(
            e,
            ClientError::Api { body, .. } if matches!(
                body.rejection,
                Some(Rejection::StaleGeneration { .. }
                    | Rejection::ProfileBusy { .. }
                    | Rejection::CapacityFull { .. })
            )
        )
        || matches!(e, ClientError::Unreachable { .. });
    if kind == EventType::Fail && !refused_before_grant {
        return (EventType::Info, value);
    }
    (kind, value)
}

/// One takeover client: it drives the profiles it owns (no other client drives them), or,
/// owning none, reads them all — so reads go on while every driver waits on a slow takeover
/// or a paused worker, and each heal's read recovery is measured.
#[derive(Debug)]
pub struct TakeoverClient {
    client: SquadronClient,
    pub driver: Driver,
    owned: Vec<ProfileId>,
    all: Vec<ProfileId>,
}

impl TakeoverClient {
    pub fn new(
        client: SquadronClient,
        driver: Driver,
        owned: Vec<ProfileId>,
        all: Vec<ProfileId>,
    ) -> Self {
        Self {
            client,
            driver,
            owned,
            all,
        }
    }

    pub async fn run(mut self) {
        while !self.driver.done() {
            self.driver.pace().await;
            if self.driver.done() {
                break;
            }
            if self.owned.is_empty() {
                if let Some(&profile) = self.all.choose(&mut self.driver.rng) {
                    self.read(profile, Value::Null).await;
                }
                continue;
            }
            let Some(&profile) = self.owned.choose(&mut self.driver.rng) else {
                return;
            };
            if self.driver.rng.gen_bool(0.25) {
                self.read(profile, Value::Null).await;
                continue;
            }
            // Not recorded: the worker's view decides what to try next.
            match self.client.agent_view(profile).await {
                Ok(v) if v.status == AgentStatus::Running => {
                    let roll: f64 = self.driver.rng.gen();
                    if roll < 0.5 {
                        self.takeover(profile, TakeoverKind::Graceful).await;
                    } else if roll < 0.75 {
                        self.crash(profile, &v).await;
                    } else {
                        self.stop(profile).await;
                    }
                }
                Ok(v) if matches!(v.status, AgentStatus::Crashed | AgentStatus::SelfFenced) => {
                    self.takeover(profile, TakeoverKind::Crash).await;
                }
                Ok(v) if v.status == AgentStatus::Stopping => {}
                Ok(_) => self.launch(profile).await,
                Err(e) if e.code().http_status() == 404 => self.launch(profile).await,
                Err(_) => {
                    self.read(profile, Value::Null).await;
                }
            }
        }
    }

    /// Reads the profile's generation from the replicated state; `Some` when it answered.
    pub async fn read(&mut self, profile: ProfileId, input: Value) -> Option<u64> {
        let client = self.client.clone();
        let (_, out) = self
            .driver
            .op("read", &takeover_key(profile), input, async {
                match client.get_profile(profile, Consistency::Linearizable).await {
                    Ok(p) => Ok(json!({
                        "generation": p.generation.get(),
                        "live": p.live_lease.is_some(),
                    })),
                    Err(e) => Err(read_failure(&e)),
                }
            })
            .await;
        out["generation"].as_u64()
    }

    async fn launch(&mut self, profile: ProfileId) {
        let client = self.client.clone();
        let req = LaunchAgent::default();
        self.driver
            .op("launch", &takeover_key(profile), Value::Null, async {
                match client.agent_launch(profile, &req).await {
                    Ok(v) => Ok(granted(&v)),
                    Err(e) => Err(agent_failure(&e)),
                }
            })
            .await;
    }

    /// A takeover; after one that names the generation it replaced, that generation tries to
    /// commit.
    async fn takeover(&mut self, profile: ProfileId, kind: TakeoverKind) {
        let client = self.client.clone();
        let req = TakeoverAgent {
            kind,
            provider: None,
            wait_for_expiry_ms: (kind == TakeoverKind::Crash).then_some(AGENT_LEASE_TTL_MS * 4),
            prompt: None,
        };
        let input = json!({"kind": kind_name(kind)});
        let mut replaced = None;
        self.driver
            .op("takeover", &takeover_key(profile), input, async {
                match client.agent_takeover(profile, &req).await {
                    Ok(v) => {
                        replaced = v.replaced.as_ref().map(|r| (r.lease, r.generation));
                        Ok(granted(&v))
                    }
                    Err(e) => Err(agent_failure(&e)),
                }
            })
            .await;
        if let Some((lease, generation)) = replaced {
            self.stale_commit("stale-commit", profile, lease, generation)
                .await;
        }
    }

    /// `kill -9` of the generation's processes, the worker seeing the crash, then a crash
    /// takeover.
    async fn crash(&mut self, profile: ProfileId, view: &AgentView) {
        kill_cgroup(&view.cgroup);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(CRASH_SEEN_MS_MAX);
        while tokio::time::Instant::now() < deadline {
            let seen =
                self.client.agent_view(profile).await.is_ok_and(|v| {
                    v.generation != view.generation || v.status != AgentStatus::Running
                });
            if seen {
                break;
            }
            tokio::time::sleep(Duration::from_millis(CRASH_POLL_MS)).await;
        }
        self.takeover(profile, TakeoverKind::Crash).await;
    }

    async fn stop(&mut self, profile: ProfileId) {
        let client = self.client.clone();
        self.driver
            .op("stop", &takeover_key(profile), Value::Null, async {
                match client.agent_stop(profile, &StopAgent::default()).await {
                    Ok(v) => Ok(json!({"generation": v.generation.get()})),
                    Err(e) => Err(write_failure(&e)),
                }
            })
            .await;
    }

    /// A capsule commit under a generation that is no longer the profile's writer: `f` is
    /// `stale-commit` (after a takeover) or `late-commit` (a paused worker's, past its lease).
    /// The capsule extends the chain's head as just read, so the fence is the only reason left
    /// to refuse it: any success is a dual writer, and so is a `chain_broken` refusal (the
    /// fence let it through). Nothing is sent when the head cannot be read.
    pub async fn stale_commit(
        &mut self,
        f: &str,
        profile: ProfileId,
        lease: LeaseId,
        generation: Generation,
    ) -> Option<EventType> {
        let head = self
            .client
            .get_profile(profile, Consistency::Linearizable)
            .await
            .ok()?
            .capsule_head;
        let client = self.client.clone();
        let capsule = stale_draft(profile, generation, head.as_ref());
        let input = json!({
            "lease": lease.get(),
            "generation": generation.get(),
            "sequence": capsule.sequence,
        });
        let req = CommitCapsule {
            lease,
            generation,
            capsule,
        };
        let (kind, _) = self
            .driver
            .op(f, &takeover_key(profile), input, async {
                match client.commit_capsule(profile, &req, None).await {
                    Ok(Outcome::CapsuleCommitted { sequence, .. }) => {
                        Ok(json!({"sequence": sequence}))
                    }
                    Ok(other) => Err((
                        EventType::Info,
                        json!({"error": "unexpected", "message": format!("{other:?}")}),
                    )),
                    Err(e) => Err(write_failure(&e)),
                }
            })
            .await;
        Some(kind)
    }
}

fn granted(v: &AgentView) -> Value {
    json!({
        "generation": v.generation.get(),
        "lease": v.lease.get(),
        "replaced": v.replaced.as_ref().map(|r| r.generation.get()),
    })
}

fn kind_name(kind: TakeoverKind) -> &'static str {
    match kind {
        TakeoverKind::Graceful => "graceful",
        TakeoverKind::Crash => "crash",
    }
}

/// What a fenced writer would write: the capsule after `head`, well formed and with its
/// digest, so that only the fence can refuse it.
fn stale_draft(
    profile: ProfileId,
    generation: Generation,
    head: Option<&CapsuleHead>,
) -> CapsuleDraft {
    let payload = CapsulePayload {
        task_state: format!("written by replaced generation {}", generation.get()),
        ..CapsulePayload::default()
    };
    let sequence = head.map_or(0, |h| h.sequence) + 1;
    let previous = head.map(|h| h.digest);
    let digest = CapsuleDigestInput {
        schema_version: CAPSULE_SCHEMA_VERSION_CURRENT,
        profile,
        generation,
        sequence,
        previous: previous.as_ref(),
        payload: &payload,
    }
    .digest();
    CapsuleDraft {
        sequence,
        previous,
        schema_version: CAPSULE_SCHEMA_VERSION_CURRENT,
        payload,
        expected_digest: Some(digest),
    }
}

/// Kills every process of a generation's cgroup leaf at once (`cgroup.kill`: none forked
/// meanwhile escapes). The path comes from the worker's answer; only a leaf of the worker's
/// own cgroup tree is touched.
fn kill_cgroup(cgroup: &str) {
    let leaf = std::path::Path::new(cgroup);
    let ours = crate::worker_process::cgroup_roots()
        .iter()
        .any(|root| leaf.starts_with(root) && leaf != root.as_path());
    let plain = leaf.components().all(|c| {
        matches!(
            c,
            std::path::Component::RootDir | std::path::Component::Normal(_)
        )
    });
    if ours && plain {
        let _ = std::fs::write(leaf.join("cgroup.kill"), "1");
    }
}
