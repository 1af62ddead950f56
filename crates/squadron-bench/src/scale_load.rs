//! Loading a cluster to `squadron bench scale`'s size: projects with their profiles, then task
//! records (submitted, and all but the pending share cancelled at once), by `clients`
//! concurrent clients spread over the nodes, each write's latency kept.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use squadron_client::{CreateProfile, CreateProject, OutcomeExt, SquadronClient};
use squadron_core::ids::{ProfileKey, ProjectId, TenantId};
use squadron_core::provider::Provider;

use crate::error::BenchError;
use crate::histogram::{LatencyHistogram, LatencySummary};
use crate::scale_options::ScaleOptions;
use crate::squadron_load::{client_for, Endpoints, BENCH_TENANT, TASK_MANIFEST};
use crate::Steps;

/// Between two progress lines while loading.
const PROGRESS_INTERVAL_MS: u64 = 5_000;
/// Error messages kept per phase (the count is exact).
const ERRORS_KEPT_MAX: usize = 5;

/// What one phase of the load did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadPhase {
    /// Writes that succeeded.
    pub writes: u64,
    /// Writes that failed (counted, not retried).
    pub errors: u64,
    pub seconds: f64,
    pub writes_per_s: f64,
    /// Each write's latency, as its client saw it.
    pub latency: LatencySummary,
    /// The first few errors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub error_samples: Vec<String>,
}

/// What each write of a unit of work came to: its latency, or why it failed.
type Writes = Vec<Result<Duration, String>>;

/// The phase's shared tallies, filled by its clients.
#[derive(Default)]
struct Tally {
    units: AtomicUsize,
    writes: AtomicU64,
    errors: AtomicU64,
    samples: Mutex<Vec<String>>,
}

impl Tally {
    fn count(&self, writes: Writes, histogram: &mut LatencyHistogram) {
        for write in writes {
            match write {
                Ok(latency) => {
                    histogram.record(latency.as_micros() as u64);
                    self.writes.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => self.failed(e),
            }
        }
        self.units.fetch_add(1, Ordering::Relaxed);
    }

    fn failed(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        if samples.len() < ERRORS_KEPT_MAX {
            samples.push(what);
        }
    }

    fn phase(&self, elapsed: Duration, latency: &LatencyHistogram) -> LoadPhase {
        let writes = self.writes.load(Ordering::Relaxed);
        LoadPhase {
            writes,
            errors: self.errors.load(Ordering::Relaxed),
            seconds: elapsed.as_secs_f64(),
            writes_per_s: writes as f64 / elapsed.as_secs_f64().max(1e-9),
            latency: latency.summary(),
            error_samples: self
                .samples
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }
}

/// Runs units `0..items` of work over `clients` clients (each takes the next unit left),
/// saying how far it got every few seconds.
async fn run_phase<F, Fut>(
    name: &str,
    endpoints: &Endpoints,
    clients: usize,
    items: usize,
    steps: Steps<'_>,
    unit: F,
) -> LoadPhase
where
    F: Fn(SquadronClient, usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Writes> + Send,
{
    let tally = Arc::new(Tally::default());
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for i in 0..clients.min(items) {
        let (client, next, tally, unit) = (
            client_for(endpoints, i),
            next.clone(),
            tally.clone(),
            unit.clone(),
        );
        running.spawn(async move {
            let mut histogram = LatencyHistogram::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= items {
                    return histogram;
                }
                tally.count(unit(client.clone(), n).await, &mut histogram);
            }
        });
    }
    let mut latency = LatencyHistogram::new();
    let mut ticker = tokio::time::interval(Duration::from_millis(PROGRESS_INTERVAL_MS));
    ticker.tick().await;
    loop {
        tokio::select! {
            joined = running.join_next() => match joined {
                Some(Ok(histogram)) => latency.merge(&histogram),
                Some(Err(e)) => tally.failed(format!("a client's task ended: {e}")),
                None => break,
            },
            _ = ticker.tick() => {
                let done = tally.units.load(Ordering::Relaxed);
                let per_s = tally.writes.load(Ordering::Relaxed) as f64
                    / started.elapsed().as_secs_f64().max(1e-9);
                steps(&format!("{name}: {done} of {items} ({per_s:.0} writes/s)"));
            }
        }
    }
    tally.phase(started.elapsed(), &latency)
}

/// One write, timed.
async fn timed<T, E: std::fmt::Display>(
    what: &str,
    write: impl Future<Output = Result<T, E>>,
) -> (Result<Duration, String>, Option<T>) {
    let started = Instant::now();
    match write.await {
        Ok(v) => (Ok(started.elapsed()), Some(v)),
        Err(e) => (Err(format!("{what}: {e}")), None),
    }
}

/// Creates `opts.projects` projects (`scale-{n}`) of `opts.profiles_per_project` profiles.
pub(crate) async fn load_profiles(
    endpoints: &Endpoints,
    opts: &ScaleOptions,
    steps: Steps<'_>,
) -> Result<LoadPhase, BenchError> {
    let tenant =
        TenantId::new(BENCH_TENANT).map_err(|e| BenchError::setup("squadron", "tenant", e))?;
    let profiles = opts.profiles_per_project;
    let unit = move |client: SquadronClient, n: usize| {
        let tenant = tenant.clone();
        async move { project(&client, &tenant, n, profiles).await }
    };
    Ok(run_phase(
        "projects",
        endpoints,
        opts.clients,
        opts.projects,
        steps,
        unit,
    )
    .await)
}

async fn project(client: &SquadronClient, tenant: &TenantId, n: usize, profiles: usize) -> Writes {
    let Ok(project) = ProjectId::new(format!("scale-{n}")) else {
        return vec![Err(format!("project id scale-{n} refused"))];
    };
    let create = CreateProject {
        tenant: tenant.clone(),
        project: project.clone(),
        max_profiles: Some(profiles as u32),
        max_active: None,
    };
    let (created, _) = timed("create project", client.create_project(&create, None)).await;
    let mut writes = vec![created];
    if writes[0].is_err() {
        return writes;
    }
    for i in 0..profiles {
        let Ok(key) = ProfileKey::new(format!("agent-{i}")) else {
            writes.push(Err(format!("profile key agent-{i} refused")));
            continue;
        };
        let req = CreateProfile {
            key,
            providers: vec![Provider::Codex],
            context_ref: None,
        };
        let (made, outcome) = timed(
            "create profile",
            client.create_profile(tenant, &project, &req, None),
        )
        .await;
        writes.push(match outcome {
            Some(o) if o.profile_id().is_none() => Err(format!("create profile: {o:?}")),
            _ => made,
        });
    }
    writes
}

/// Submits `opts.tasks` tasks; every one after the first `opts.pending_tasks` is cancelled as
/// soon as it is accepted, so the pending queue never holds more than the pending share (and
/// the clients' tasks in flight).
pub(crate) async fn load_tasks(
    endpoints: &Endpoints,
    opts: &ScaleOptions,
    steps: Steps<'_>,
) -> LoadPhase {
    let pending = opts.pending_tasks;
    let unit = move |client: SquadronClient, n: usize| async move {
        let (submitted, outcome) =
            timed("submit", client.submit_task_yaml(TASK_MANIFEST, None)).await;
        let id = match outcome.map(|o| o.task_id().ok_or(o)) {
            Some(Ok(id)) => id,
            Some(Err(o)) => return vec![Err(format!("submit answered {o:?}"))],
            None => return vec![submitted],
        };
        if n < pending {
            return vec![submitted];
        }
        let (cancelled, _) =
            timed("cancel", client.cancel_task(id, Some("bench scale"), None)).await;
        vec![submitted, cancelled]
    };
    run_phase("tasks", endpoints, opts.clients, opts.tasks, steps, unit).await
}
