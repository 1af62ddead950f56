//! The workloads on Squadron, through `squadron-client` over REST, clients spread over the
//! nodes (a write sent to a follower is forwarded to the leader by the server).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ConstantBuilder, Retryable};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use squadron_client::{
    AcquireLease, AttachSandbox, ClientError, Consistency, CreateProfile, CreateProject,
    LeaseFence, OutcomeExt, RegisterWorker, RenewLease, SquadronClient, TaskListQuery,
};
use squadron_core::ids::{
    Generation, LeaseId, ProfileId, ProfileKey, ProjectId, TenantId, WorkerId,
};
use squadron_core::lease::LeaseHolder;
use squadron_core::limits::{ACTIVE_LEASES_PER_PROJECT_MAX, PROFILES_PER_PROJECT_MAX};
use squadron_core::manifest::RuntimeKind;
use squadron_core::provider::Provider;
use squadron_core::response::LeaseGrant;
use squadron_core::task::TaskState;
use squadron_core::Rejection;

use crate::error::BenchError;
use crate::load::{FailoverProbe, OpResult, Recorder};
use crate::options::ClientRoute;

const SYSTEM: &str = "squadron";
pub(crate) const BENCH_TENANT: &str = "bench";
/// The worker the benchmark registers; it offers only the `kvm` runtime, so the submitted
/// tasks (which ask for `process`) stay queued and nothing is ever launched.
pub(crate) const BENCH_WORKER: &str = "bench-worker";
const WORKER_HEARTBEAT_INTERVAL_MS: u64 = 600_000;
/// TTL of every benchmark lease (leases are released within milliseconds; the TTL only
/// matters if a client fails between acquire and release).
pub(crate) const LEASE_TTL_MS: u64 = 60_000;
/// Profiles of the capacity workload, and the slots they share.
pub(crate) const CAPACITY_PROFILES: usize = 8;
pub(crate) const CAPACITY_SLOTS: u32 = 4;
/// Attempts of one admission decision: a lost compare-and-swap on a stale cached view is
/// retried with the current view, up to this many times (etcd's slot count is one key all
/// clients write, so there many attempts may be needed under contention).
pub(crate) const ADMISSION_ATTEMPTS_MAX: usize = 64;
/// Attempts to release a granted capacity slot.
pub(crate) const RELEASE_ATTEMPTS_MAX: usize = 3;
/// Pause between two of those attempts.
pub(crate) const RELEASE_RETRY_DELAY_MS: u64 = 0;
/// Request timeout of the benchmark clients (above the server's 5 s forward timeout).
pub(crate) const REQUEST_TIMEOUT_MS: u64 = 10_000;
pub(crate) const CONNECT_TIMEOUT_MS: u64 = 2_000;

/// A small valid manifest (docs/manifest.md): runtime `process`, which no benchmark worker
/// offers, so the task stays PENDING.
pub(crate) const TASK_MANIFEST: &str = "version: \"1\"\nkind: Task\nmetadata:\n  name: bench\n\
repository:\n  url: https://git.example/bench/repo\n  branch: main\nagent:\n  prompt: |\n    \
Benchmark task: nothing runs it.\n  provider: codex\nvm:\n  runtime: process\n";

/// What the workloads work on, created once per run.
#[derive(Debug)]
pub(crate) struct SquadronData {
    /// One profile per client of the lease cycle (client i owns profile i).
    lease_profiles: Vec<ProfileId>,
    /// The last generation seen of each lease profile, kept across points.
    lease_generations: Arc<Vec<AtomicU64>>,
    capacity_profiles: Arc<Vec<ProfileId>>,
    worker: WorkerId,
}

fn err(step: &str, e: impl ToString) -> BenchError {
    BenchError::setup(SYSTEM, step, e)
}

fn valid<T, E: ToString>(step: &str, r: Result<T, E>) -> Result<T, BenchError> {
    r.map_err(|e| err(step, e))
}

fn holder(worker: &WorkerId, client: usize) -> LeaseHolder {
    LeaseHolder {
        worker: worker.clone(),
        process: format!("bench client {client}"),
        cgroup: None,
    }
}

/// Creates the worker, projects, sandboxes and profiles for `clients_max` clients.
pub(crate) async fn setup(
    client: &SquadronClient,
    as_worker: &SquadronClient,
    clients_max: usize,
) -> Result<SquadronData, BenchError> {
    let tenant = valid("tenant", TenantId::new(BENCH_TENANT))?;
    let worker = valid("worker id", WorkerId::new(BENCH_WORKER))?;
    valid(
        "register worker",
        as_worker
            .register_worker(
                &RegisterWorker {
                    worker: worker.clone(),
                    address: "127.0.0.1:1".into(),
                    runtimes: vec![RuntimeKind::Kvm],
                    capacity: 1,
                    labels: Default::default(),
                    heartbeat_interval_ms: Some(WORKER_HEARTBEAT_INTERVAL_MS),
                    policy: None,
                },
                None,
            )
            .await,
    )?;
    let per_project = PROFILES_PER_PROJECT_MAX.min(ACTIVE_LEASES_PER_PROJECT_MAX) as usize;
    let lease_projects = clients_max.div_ceil(per_project);
    let mut lease_profiles = Vec::with_capacity(clients_max);
    for p in 0..lease_projects {
        let count = per_project.min(clients_max - p * per_project);
        let ids = project(
            client,
            &tenant,
            &worker,
            &format!("leases-{p}"),
            count,
            count as u32,
        )
        .await?;
        lease_profiles.extend(ids);
    }
    let capacity_profiles = project(
        client,
        &tenant,
        &worker,
        "capacity",
        CAPACITY_PROFILES,
        CAPACITY_SLOTS,
    )
    .await?;
    Ok(SquadronData {
        lease_generations: Arc::new(lease_profiles.iter().map(|_| AtomicU64::new(0)).collect()),
        lease_profiles,
        capacity_profiles: Arc::new(capacity_profiles),
        worker,
    })
}

async fn project(
    client: &SquadronClient,
    tenant: &TenantId,
    worker: &WorkerId,
    name: &str,
    profiles: usize,
    max_active: u32,
) -> Result<Vec<ProfileId>, BenchError> {
    let project = valid("project id", ProjectId::new(name))?;
    let step = format!("create project {name}");
    valid(
        &step,
        client
            .create_project(
                &CreateProject {
                    tenant: tenant.clone(),
                    project: project.clone(),
                    max_profiles: Some(profiles as u32),
                    max_active: Some(max_active),
                },
                None,
            )
            .await,
    )?;
    valid(
        &format!("attach sandbox to {name}"),
        client
            .attach_sandbox(
                tenant,
                &project,
                &AttachSandbox {
                    worker: worker.clone(),
                    runtime: RuntimeKind::Kvm,
                    sandbox_ref: format!("sb-{name}"),
                },
                None,
            )
            .await,
    )?;
    let mut ids = Vec::with_capacity(profiles);
    for i in 0..profiles {
        let step = format!("create profile {i} of {name}");
        let outcome = valid(
            &step,
            client
                .create_profile(
                    tenant,
                    &project,
                    &CreateProfile {
                        key: valid(&step, ProfileKey::new(format!("agent-{i}")))?,
                        providers: vec![Provider::Codex],
                        context_ref: None,
                    },
                    None,
                )
                .await,
        )?;
        ids.push(
            outcome
                .profile_id()
                .ok_or_else(|| err(&step, format!("unexpected outcome {outcome:?}")))?,
        );
    }
    Ok(ids)
}

/// A Squadron cluster's REST endpoints (`https://host:port`) and the credentials its
/// clients present (the run's CA and admin token).
#[derive(Debug, Clone)]
pub(crate) struct Endpoints {
    /// The leader first (`SquadronCluster::endpoints`).
    pub(crate) urls: Vec<String>,
    pub(crate) credentials: squadron_client::Credentials,
    /// The bench worker's certificate.
    pub(crate) worker_credentials: squadron_client::Credentials,
    /// Which node each client sends to first.
    pub(crate) route: ClientRoute,
}

impl Endpoints {
    pub(crate) fn routed(self, route: ClientRoute) -> Self {
        Self { route, ..self }
    }
}

/// A client presenting the bench worker's certificate.
pub(crate) fn worker_client(endpoints: &Endpoints) -> Result<SquadronClient, BenchError> {
    SquadronClient::secured(endpoints.urls.clone(), &endpoints.worker_credentials)
        .map_err(|e| BenchError::setup(SYSTEM, "the bench worker's client", e))
}

/// A client of its own (own connection pool) whose first endpoint is node `i % n`.
pub(crate) fn client_for(endpoints: &Endpoints, i: usize) -> SquadronClient {
    let mut rotated = endpoints.urls.clone();
    if endpoints.route == ClientRoute::Spread && !rotated.is_empty() {
        rotated.rotate_left(i % endpoints.urls.len());
    }
    let (request, connect) = (
        Duration::from_millis(REQUEST_TIMEOUT_MS),
        Duration::from_millis(CONNECT_TIMEOUT_MS),
    );
    SquadronClient::secured_with_timeouts(rotated.clone(), &endpoints.credentials, request, connect)
        .unwrap_or_else(|_| SquadronClient::with_timeouts(rotated, request, connect))
}

/// Tasks listed per page when the submitted tasks are cancelled after a point.
pub(crate) const DRAIN_PAGE_TASKS: usize = 1_000;
/// Cancellations in flight at once during that clean-up.
pub(crate) const DRAIN_CONCURRENCY: usize = 32;
/// Pages at most (bounds the clean-up: 1,000,000 tasks).
pub(crate) const DRAIN_PAGES_MAX: usize = 1_000;

/// Cancels every task the submit workload left `PENDING` (not timed), so each submit point
/// starts with an empty queue: Squadron bounds its pending queue (100,000 tasks), and without
/// this the later points would measure that bound rather than submission. The cancelled
/// tasks stay in the state as terminal records, as etcd keeps the keys it was given.
pub(crate) async fn drain_submitted(endpoints: &Endpoints) -> Result<u64, BenchError> {
    let client = client_for(endpoints, 0);
    let mut cancelled = 0u64;
    for _ in 0..DRAIN_PAGES_MAX {
        let page = valid(
            "listing pending tasks",
            client
                .list_tasks(&TaskListQuery {
                    state: Some(TaskState::Pending.as_str().to_string()),
                    limit: Some(DRAIN_PAGE_TASKS),
                    ..TaskListQuery::default()
                })
                .await,
        )?;
        if page.tasks.is_empty() {
            return Ok(cancelled);
        }
        let mut ids = page
            .tasks
            .iter()
            .map(|t| t.id)
            .collect::<Vec<_>>()
            .into_iter();
        let mut running = tokio::task::JoinSet::new();
        loop {
            while running.len() < DRAIN_CONCURRENCY {
                let Some(id) = ids.next() else { break };
                let c = client.clone();
                running.spawn(async move { c.cancel_task(id, Some("bench clean-up"), None).await });
            }
            let Some(done) = running.join_next().await else {
                break;
            };
            match done {
                Ok(Ok(_)) => cancelled += 1,
                Ok(Err(e)) => return Err(err("cancelling a submitted task", e)),
                Err(e) => return Err(err("cancelling a submitted task", e)),
            }
        }
    }
    Err(err(
        "cancelling submitted tasks",
        format!("still tasks pending after {DRAIN_PAGES_MAX} pages"),
    ))
}

/// The core's refusal inside an error, if a server answered with one.
fn rejection(e: &ClientError) -> Option<&Rejection> {
    e.rejection()
}

fn probe_ok(probe: &Option<Arc<FailoverProbe>>, started: Instant) {
    if let Some(p) = probe {
        p.write_ok(started);
    }
}

/// Lease cycle: acquire on the expected generation → renew → release, one cycle per
/// operation, on the client's own profile.
pub(crate) fn lease_cycle(
    data: &SquadronData,
    endpoints: &Endpoints,
    i: usize,
    mut rec: Recorder,
    probe: Option<Arc<FailoverProbe>>,
) -> impl std::future::Future<Output = Recorder> + Send + 'static {
    let client = client_for(endpoints, i);
    let profile = data.lease_profiles.get(i).copied();
    let generations = data.lease_generations.clone();
    let holder = holder(&data.worker, i);
    async move {
        let (Some(profile), Some(generation)) = (profile, generations.get(i)) else {
            rec.note_error(format!("no lease profile for client {i}"));
            return rec;
        };
        while rec.running() {
            let started = Instant::now();
            match cycle(&client, profile, generation, &holder, &probe).await {
                Ok(()) => rec.record(started, OpResult::Ok),
                Err(e) => {
                    rec.record(started, OpResult::Error);
                    rec.note_error(e.to_string());
                    rec.back_off().await;
                }
            }
        }
        rec
    }
}

async fn cycle(
    client: &SquadronClient,
    profile: ProfileId,
    generation: &AtomicU64,
    holder: &LeaseHolder,
    probe: &Option<Arc<FailoverProbe>>,
) -> Result<(), ClientError> {
    let t = Instant::now();
    let acquired = client
        .acquire_lease(
            profile,
            &AcquireLease {
                expected_generation: Generation::new(generation.load(Ordering::Relaxed)),
                provider: Provider::Codex,
                holder: holder.clone(),
                ttl_ms: LEASE_TTL_MS,
            },
            None,
        )
        .await;
    let grant = match acquired {
        Ok(outcome) => outcome.lease_grant().ok_or_else(|| ClientError::Decode {
            endpoint: String::new(),
            message: format!("acquire answered {outcome:?}"),
        })?,
        Err(e) => {
            // Resynchronise after an earlier failure: learn the generation, and release a
            // lease this client still holds, so the next cycle can go on.
            match rejection(&e) {
                Some(Rejection::StaleGeneration { current, .. }) => {
                    generation.store(current.get(), Ordering::Relaxed);
                }
                Some(Rejection::ProfileBusy {
                    lease,
                    generation: g,
                    ..
                }) => {
                    generation.store(g.get(), Ordering::Relaxed);
                    let _ = release(client, *lease, profile, *g).await;
                }
                _ => {}
            }
            return Err(e);
        }
    };
    probe_ok(probe, t);
    generation.store(grant.generation.get(), Ordering::Relaxed);
    let t = Instant::now();
    client
        .renew_lease(
            grant.lease,
            &RenewLease {
                profile,
                generation: grant.generation,
                ttl_ms: LEASE_TTL_MS,
            },
            None,
        )
        .await?;
    probe_ok(probe, t);
    let t = Instant::now();
    release(client, grant.lease, profile, grant.generation).await?;
    probe_ok(probe, t);
    Ok(())
}

async fn release(
    client: &SquadronClient,
    lease: LeaseId,
    profile: ProfileId,
    generation: Generation,
) -> Result<(), ClientError> {
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
        .map(|_| ())
}

/// How an admission attempt ended.
enum Admission {
    Granted(LeaseGrant),
    Refused,
    Failed(String),
}

/// Capacity admission: acquire a random one of 8 profiles under the 4-slot rule; the
/// decision (granted, capacity full, profile busy) is the operation; a granted slot is
/// released at once.
pub(crate) fn capacity(
    data: &SquadronData,
    endpoints: &Endpoints,
    i: usize,
    seed: u64,
    mut rec: Recorder,
) -> impl std::future::Future<Output = Recorder> + Send + 'static {
    let client = client_for(endpoints, i);
    let profiles = data.capacity_profiles.clone();
    let holder = holder(&data.worker, i);
    let mut rng = StdRng::seed_from_u64(client_seed(seed, i));
    async move {
        let mut generations = vec![Generation::ZERO; profiles.len()];
        while rec.running() {
            let r = rng.gen_range(0..profiles.len());
            let profile = profiles[r];
            let started = Instant::now();
            let admission = admit(&client, profile, &mut generations[r], &holder).await;
            match admission {
                Admission::Granted(grant) => {
                    rec.record(started, OpResult::Ok);
                    let again = ConstantBuilder::default()
                        .with_delay(Duration::from_millis(RELEASE_RETRY_DELAY_MS))
                        .with_max_times(RELEASE_ATTEMPTS_MAX - 1);
                    let released = (|| release(&client, grant.lease, profile, grant.generation))
                        .retry(again)
                        // A refusal is the server's decision (the release is fenced by the
                        // generation, so a repeat can never release anything else).
                        .when(|e| e.rejection().is_none())
                        .await
                        .is_ok();
                    if !released {
                        rec.note_error(format!("release of lease {} failed", grant.lease));
                    }
                }
                Admission::Refused => rec.record(started, OpResult::Refused),
                Admission::Failed(message) => {
                    rec.record(started, OpResult::Error);
                    rec.note_error(message);
                    rec.back_off().await;
                }
            }
        }
        rec
    }
}

async fn admit(
    client: &SquadronClient,
    profile: ProfileId,
    generation: &mut Generation,
    holder: &LeaseHolder,
) -> Admission {
    for _ in 0..ADMISSION_ATTEMPTS_MAX {
        let answer = client
            .acquire_lease(
                profile,
                &AcquireLease {
                    expected_generation: *generation,
                    provider: Provider::Codex,
                    holder: holder.clone(),
                    ttl_ms: LEASE_TTL_MS,
                },
                None,
            )
            .await;
        match answer {
            Ok(outcome) => {
                return match outcome.lease_grant() {
                    Some(grant) => {
                        *generation = grant.generation;
                        Admission::Granted(grant)
                    }
                    None => Admission::Failed(format!("acquire answered {outcome:?}")),
                }
            }
            Err(e) => match rejection(&e) {
                Some(Rejection::StaleGeneration { current, .. }) => *generation = *current,
                Some(Rejection::CapacityFull { .. }) => return Admission::Refused,
                Some(Rejection::ProfileBusy { generation: g, .. }) => {
                    *generation = *g;
                    return Admission::Refused;
                }
                _ => return Admission::Failed(e.to_string()),
            },
        }
    }
    Admission::Failed(format!(
        "no decision after {ADMISSION_ATTEMPTS_MAX} compare-and-swap attempts"
    ))
}

/// Linearizable read of a random capacity profile.
pub(crate) fn read(
    data: &SquadronData,
    endpoints: &Endpoints,
    i: usize,
    seed: u64,
    mut rec: Recorder,
) -> impl std::future::Future<Output = Recorder> + Send + 'static {
    let client = client_for(endpoints, i);
    let profiles = data.capacity_profiles.clone();
    let mut rng = StdRng::seed_from_u64(client_seed(seed, i));
    async move {
        while rec.running() {
            let profile = profiles[rng.gen_range(0..profiles.len())];
            let started = Instant::now();
            match client.get_profile(profile, Consistency::Linearizable).await {
                Ok(_) => rec.record(started, OpResult::Ok),
                Err(e) => {
                    rec.record(started, OpResult::Error);
                    rec.note_error(e.to_string());
                    rec.back_off().await;
                }
            }
        }
        rec
    }
}

/// Task submission of a small manifest.
pub(crate) fn submit(
    endpoints: &Endpoints,
    i: usize,
    mut rec: Recorder,
) -> impl std::future::Future<Output = Recorder> + Send + 'static {
    let client = client_for(endpoints, i);
    async move {
        while rec.running() {
            let started = Instant::now();
            match client.submit_task_yaml(TASK_MANIFEST, None).await {
                Ok(outcome) if outcome.task_id().is_some() => rec.record(started, OpResult::Ok),
                Ok(outcome) => {
                    rec.record(started, OpResult::Error);
                    rec.note_error(format!("submit answered {outcome:?}"));
                }
                Err(e) => {
                    rec.record(started, OpResult::Error);
                    rec.note_error(e.to_string());
                    rec.back_off().await;
                }
            }
        }
        rec
    }
}

/// Client i's random stream, different per client and reproducible per seed.
pub(crate) fn client_seed(seed: u64, i: usize) -> u64 {
    seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
