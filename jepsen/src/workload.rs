//! The workloads: what the clients do, and the setup each needs.
//!
//! - `lease`: the lease register on 4 profiles (acquire with the expected generation, release,
//!   read); 4 profiles never exceed the 4 slots, so every refusal is about the generation.
//! - `capacity`: the same operations on 8 profiles with many clients, so the 4-slot admission
//!   is under constant pressure (INV-5).
//! - `cas`: a CAS register per profile on the capability manifest (`SetCapabilities` with
//!   `expected_version`; the value is the one required skill `v{n}`).
//! - `keyed`: the CAS register with every write under an idempotency key, retried on the next
//!   node after an unknown outcome and replayed later (INV-11, `client_keyed.rs`).
//! - `tasks`: dedicated tasks moved through their lifecycle by the harness's worker's reports
//!   (`client_task.rs`, `model_task.rs`).
//! - `capsule`: capsule appends on 2 profiles, each naming the head it extends (INV-7).
//! - `takeover`: 8 profiles' provider processes on a real worker (`worker_process.rs`):
//!   launches, graceful and crash takeovers, stops, and the replaced generations' commits,
//!   which must be refused (INV-3, INV-6; `client_takeover.rs`, `model_takeover.rs`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use squadron_client::{
    new_idempotency_key, AcquireLease, AttachSandbox, ClientError, Consistency, CreateProfile,
    CreateProject, OutcomeExt, RegisterWorker, RenewLease, SquadronClient,
};
use squadron_core::ids::{
    Generation, IdempotencyKey, ProfileId, ProfileKey, ProjectId, TenantId, WorkerId,
};
use squadron_core::manifest::RuntimeKind;
use squadron_core::provider::Provider;
use squadron_core::Outcome;

use crate::workload_context::{Holdings, WorkloadContext};

/// Every lease the suite takes lives this long (the core's maximum), far beyond a run's
/// fault phases, so no lease expires under the model's feet.
pub const LEASE_TTL_MS: u64 = 600_000;
/// How often the harness heartbeats its worker and renews the capsule writers' leases.
pub const LEASE_RENEW_INTERVAL_MS: u64 = 60_000;
/// Most attempts of one setup step before the run gives up.
pub const SETUP_ATTEMPTS_MAX: u32 = 60;
/// Pause between setup attempts.
pub const SETUP_RETRY_MS: u64 = 500;
/// The one worker every lease is held on (it owns the projects' sandboxes).
pub const WORKER: &str = "jepsen-w1";
pub const TENANT: &str = "jepsen";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    Lease,
    Capacity,
    Cas,
    Capsule,
    /// 2 s leases on 8 profiles, released, renewed or left to expire, then reaped: lease
    /// expiry is decided by the leader's stamps (run it under the clock nemesis).
    Expiry,
    /// Dedicated tasks, assigned to the harness's worker, moved through their lifecycle by
    /// its reports: only legal transitions are recorded, each from the state it names.
    Tasks,
    /// The CAS register's writes under idempotency keys, retried on other nodes after an
    /// unknown outcome and replayed later: one effect and the same answer each time (INV-11).
    Keyed,
    /// Provider processes on the harness's real worker, moved by launches, graceful and crash
    /// takeovers and stops; every replaced generation then tries to commit (dual writers 0).
    Takeover,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Lease => "lease",
            Workload::Capacity => "capacity",
            Workload::Cas => "cas",
            Workload::Capsule => "capsule",
            Workload::Expiry => "expiry",
            Workload::Keyed => "keyed",
            Workload::Tasks => "tasks",
            Workload::Takeover => "takeover",
        }
    }

    pub fn profiles(self) -> usize {
        match self {
            Workload::Lease | Workload::Cas | Workload::Keyed => 4,
            Workload::Capacity | Workload::Expiry | Workload::Takeover => 8,
            Workload::Capsule => 2,
            Workload::Tasks => 0,
        }
    }

    /// Clients by default, for a cluster of `nodes`.
    pub fn default_concurrency(self, nodes: u64) -> usize {
        match self {
            Workload::Capacity | Workload::Expiry => 12,
            // Four drivers of two profiles each (8 profiles for the 4 slots) and a reader.
            Workload::Takeover => 5,
            _ => (2 * nodes as usize).max(6),
        }
    }

    pub fn key(self, profile: ProfileId) -> String {
        format!("{}/{}", self.name(), profile.get())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("setup step {step} failed after {attempts} attempts: {last}")]
    Exhausted {
        step: String,
        attempts: u32,
        last: String,
    },
    #[error("setup step {step}: unexpected answer {answer:?}")]
    Unexpected { step: String, answer: String },
    #[error("invalid name {0}")]
    Name(String),
}

/// Retries one keyed write until it succeeds: the key makes the retry safe (INV-11).
async fn keyed<F, Fut>(step: &str, mut call: F) -> Result<Outcome, SetupError>
where
    F: FnMut(IdempotencyKey) -> Fut,
    Fut: std::future::Future<Output = Result<Outcome, ClientError>>,
{
    let key = new_idempotency_key();
    let mut last = String::new();
    for _ in 0..SETUP_ATTEMPTS_MAX {
        match call(key.clone()).await {
            Ok(o) => return Ok(o),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(SETUP_RETRY_MS)).await;
    }
    Err(SetupError::Exhausted {
        step: step.into(),
        attempts: SETUP_ATTEMPTS_MAX,
        last,
    })
}

fn name<T>(r: Result<T, squadron_core::ValidationError>) -> Result<T, SetupError> {
    r.map_err(|e| SetupError::Name(e.to_string()))
}

/// Creates the worker, project, sandbox and profiles (and the capsule writers' leases).
/// `repository`: the takeover workload's, which its real worker clones its project sandbox
/// from (that worker registers itself).
pub async fn setup(
    workload: Workload,
    client: &SquadronClient,
    as_worker: &SquadronClient,
    repository: Option<&std::path::Path>,
) -> Result<WorkloadContext, SetupError> {
    let tenant = name(TenantId::new(TENANT))?;
    let project = name(ProjectId::new(workload.name()))?;
    let worker = name(WorkerId::new(WORKER))?;
    let register = RegisterWorker {
        worker: worker.clone(),
        address: "127.0.0.1:1".into(),
        runtimes: vec![RuntimeKind::Process],
        capacity: 8,
        labels: BTreeMap::new(),
        heartbeat_interval_ms: Some(600_000),
        policy: None,
    };
    if workload != Workload::Takeover {
        keyed("register worker", |k| {
            let (c, r) = (as_worker.clone(), register.clone());
            async move { c.register_worker(&r, Some(&k)).await }
        })
        .await?;
    }
    let create = CreateProject {
        tenant: tenant.clone(),
        project: project.clone(),
        // The takeover workload's ninth profile only makes the sandbox (below), so the
        // generations of the eight the clients drive start at 0 in the history too.
        max_profiles: Some(if workload == Workload::Takeover { 9 } else { 8 }),
        max_active: Some(4),
    };
    keyed("create project", |k| {
        let (c, r) = (client.clone(), create.clone());
        async move { c.create_project(&r, Some(&k)).await }
    })
    .await?;
    let attach = AttachSandbox {
        worker: worker.clone(),
        runtime: RuntimeKind::Process,
        sandbox_ref: format!("sb-{}", workload.name()),
    };
    if workload != Workload::Takeover {
        keyed("attach sandbox", |k| {
            let (c, r, t, p) = (
                client.clone(),
                attach.clone(),
                tenant.clone(),
                project.clone(),
            );
            async move { c.attach_sandbox(&t, &p, &r, Some(&k)).await }
        })
        .await?;
    }
    let mut profiles = Vec::new();
    for i in 0..workload.profiles() {
        let req = CreateProfile {
            key: name(ProfileKey::new(format!("agent-{i}")))?,
            // A takeover swaps to the profile's other provider when it has one.
            providers: if workload == Workload::Takeover {
                vec![Provider::Codex, Provider::Claude]
            } else {
                vec![Provider::Codex]
            },
            context_ref: None,
        };
        let step = format!("create profile {i}");
        let outcome = keyed(&step, |k| {
            let (c, r, t, p) = (client.clone(), req.clone(), tenant.clone(), project.clone());
            async move { c.create_profile(&t, &p, &r, Some(&k)).await }
        })
        .await?;
        profiles.push(outcome.profile_id().ok_or_else(|| SetupError::Unexpected {
            step,
            answer: format!("{outcome:?}"),
        })?);
    }
    let ctx = WorkloadContext {
        workload,
        tenant,
        project,
        worker,
        profiles,
        writers: BTreeMap::new(),
        holdings: Mutex::new(Holdings::default()),
        reads: Consistency::Linearizable,
        as_worker: as_worker.clone(),
        tasks: Mutex::new(Default::default()),
    };
    let mut writers = BTreeMap::new();
    if workload == Workload::Capsule {
        for p in &ctx.profiles {
            let req = AcquireLease {
                expected_generation: Generation::ZERO,
                provider: Provider::Codex,
                holder: ctx.holder(0),
                ttl_ms: LEASE_TTL_MS,
            };
            let step = format!("acquire writer lease of profile {p}");
            let outcome = keyed(&step, |k| {
                let (c, r, p) = (client.clone(), req.clone(), *p);
                async move { c.acquire_lease(p, &r, Some(&k)).await }
            })
            .await?;
            let grant = outcome
                .lease_grant()
                .ok_or_else(|| SetupError::Unexpected {
                    step,
                    answer: format!("{outcome:?}"),
                })?;
            writers.insert(*p, (grant.lease, grant.generation));
        }
    }
    if let (Workload::Takeover, Some(repository)) = (workload, repository) {
        let maker = create_sandbox_maker(client, &ctx).await?;
        make_sandbox(client, maker, &ctx.worker, repository).await?;
    }
    Ok(WorkloadContext { writers, ..ctx })
}

/// The takeover workload's ninth profile, which only makes the sandbox.
async fn create_sandbox_maker(
    client: &SquadronClient,
    ctx: &WorkloadContext,
) -> Result<ProfileId, SetupError> {
    let req = CreateProfile {
        key: name(ProfileKey::new("sandbox-maker"))?,
        providers: vec![Provider::Codex],
        context_ref: None,
    };
    let step = "create the sandbox maker's profile".to_string();
    let outcome = keyed(&step, |k| {
        let (c, r, t, p) = (
            client.clone(),
            req.clone(),
            ctx.tenant.clone(),
            ctx.project.clone(),
        );
        async move { c.create_profile(&t, &p, &r, Some(&k)).await }
    })
    .await?;
    outcome.profile_id().ok_or_else(|| SetupError::Unexpected {
        step,
        answer: format!("{outcome:?}"),
    })
}

/// The takeover workload's project sandbox, made on the real worker by a first launch (a
/// clone of `repository`), which is then stopped. A launch is not keyed: after an error, the
/// worker's view says whether it ran.
async fn make_sandbox(
    client: &SquadronClient,
    profile: ProfileId,
    worker: &WorkerId,
    repository: &std::path::Path,
) -> Result<(), SetupError> {
    let launch = squadron_api::agents::LaunchAgent {
        worker: Some(worker.clone()),
        repository: Some(squadron_api::agents::SandboxRepository {
            url: repository.display().to_string(),
            branch: None,
        }),
        ..Default::default()
    };
    let mut last = String::new();
    for _ in 0..SETUP_ATTEMPTS_MAX {
        let running = match client.agent_launch(profile, &launch).await {
            Ok(_) => true,
            Err(e) => {
                last = e.to_string();
                client
                    .agent_view(profile)
                    .await
                    .is_ok_and(|v| v.status == squadron_api::agents::AgentStatus::Running)
            }
        };
        if running
            && client
                .agent_stop(profile, &squadron_api::agents::StopAgent::default())
                .await
                .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(SETUP_RETRY_MS)).await;
    }
    Err(SetupError::Exhausted {
        step: "make the project sandbox".into(),
        attempts: SETUP_ATTEMPTS_MAX,
        last,
    })
}

/// Keeps the worker alive and the capsule writers' leases renewed for runs longer than their
/// TTLs; ends with the returned task's abort.
pub fn spawn_renewals(
    ctx: Arc<WorkloadContext>,
    client: SquadronClient,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(LEASE_RENEW_INTERVAL_MS)).await;
            // Heartbeats and renewals are not compare-and-swaps: resending them is harmless.
            // The takeover workload's worker is a real one, which heartbeats for itself: the
            // harness must not keep a lost worker alive.
            if ctx.workload != Workload::Takeover {
                let key = new_idempotency_key();
                let _ = ctx
                    .as_worker
                    .worker_heartbeat(&ctx.worker, Some(&key))
                    .await;
            }
            for (profile, (lease, generation)) in &ctx.writers {
                let req = RenewLease {
                    profile: *profile,
                    generation: *generation,
                    ttl_ms: LEASE_TTL_MS,
                };
                let key = new_idempotency_key();
                let _ = client.renew_lease(*lease, &req, Some(&key)).await;
            }
        }
    })
}

/// The `final` marker on the quiet phase's reads.
pub fn final_input() -> serde_json::Value {
    json!({"final": true})
}
