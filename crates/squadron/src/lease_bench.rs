//! `squadron bench`: closed-loop lease cycles (acquire → renew → release) against a cluster.
//!
//! Client i works on profile i % P through endpoint i % E (then the others, on failure), so a
//! run over several endpoints makes followers forward. A client that shares its profile with
//! others loses compare-and-swaps: a `stale_generation`, `profile_busy` or `capacity_full`
//! answer makes it re-read the profile and try again with the generation it read — it never
//! repeats a refused compare-and-swap blindly.

use std::time::{Duration, Instant};

use anyhow::Context;
use backon::{ConstantBuilder, Retryable};
use serde::{Deserialize, Serialize};
use squadron_bench::{LatencyHistogram, LatencySummary};
use squadron_client::{
    AcquireLease, AttachSandbox, ClientError, Consistency, CreateProfile, CreateProject,
    LeaseFence, OutcomeExt, RegisterWorker, RenewLease, SquadronClient,
};
use squadron_core::ids::{Generation, ProfileId, ProfileKey, ProjectId, TenantId, WorkerId};
use squadron_core::lease::LeaseHolder;
use squadron_core::manifest::RuntimeKind;
use squadron_core::provider::Provider;
use squadron_core::response::LeaseGrant;
use squadron_core::Rejection;

use crate::cli::bench::BenchArgs;
use crate::output::Table;

/// The worker the bench registers and runs its "processes" on.
pub const BENCH_WORKER: &str = "bench-worker";
/// Significant digits of the latency histograms: exact below 2,048 µs (a few clients keep
/// four histograms each, so the memory is small).
pub const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;
/// Pause after a failed call before the next (so a cluster without a leader is not flooded).
const ERROR_PAUSE_MS: u64 = 50;
/// Pause before re-reading a profile someone else holds.
const BUSY_PAUSE_MS: u64 = 1;
/// Between two heartbeats of the bench worker (it is lost after three silent intervals).
const HEARTBEAT_EVERY_MS: u64 = 5_000;
const HEARTBEAT_INTERVAL_MS: u64 = 10_000;

/// Latency summary of one operation, in milliseconds.
pub type LatencyStats = LatencySummary;

/// Rejections and errors a run met.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retries {
    pub stale_generation: u64,
    pub profile_busy: u64,
    pub capacity_full: u64,
}

impl Retries {
    pub fn total(&self) -> u64 {
        self.stale_generation + self.profile_busy + self.capacity_full
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpLatencies {
    pub acquire: LatencyStats,
    pub renew: LatencyStats,
    pub release: LatencyStats,
    pub cycle: LatencyStats,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    pub tenant: String,
    pub project: String,
    pub endpoints: Vec<String>,
    pub clients: usize,
    pub profiles: u32,
    pub duration_s: f64,
    pub cycles: u64,
    /// Successful acquire, renew and release calls.
    pub ops: u64,
    pub cycles_per_s: f64,
    pub ops_per_s: f64,
    /// Refused compare-and-swaps and admissions, each followed by a re-read of the profile.
    pub retries: Retries,
    /// Other failures (transport, unexpected rejections).
    pub errors: u64,
    pub latency: OpLatencies,
}

#[derive(Debug)]
struct ClientTally {
    acquire: LatencyHistogram,
    renew: LatencyHistogram,
    release: LatencyHistogram,
    cycle: LatencyHistogram,
    retries: Retries,
    errors: u64,
}

impl Default for ClientTally {
    fn default() -> Self {
        let h = || LatencyHistogram::with_significant_digits(LATENCY_SIGNIFICANT_DIGITS);
        Self {
            acquire: h(),
            renew: h(),
            release: h(),
            cycle: h(),
            retries: Retries::default(),
            errors: 0,
        }
    }
}

impl ClientTally {
    fn merge(&mut self, t: &ClientTally) {
        self.acquire.merge(&t.acquire);
        self.renew.merge(&t.renew);
        self.release.merge(&t.release);
        self.cycle.merge(&t.cycle);
        self.retries.stale_generation += t.retries.stale_generation;
        self.retries.profile_busy += t.retries.profile_busy;
        self.retries.capacity_full += t.retries.capacity_full;
        self.errors += t.errors;
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Client i's endpoints: its own (i % E) first, then the others in order.
pub fn endpoints_for(i: usize, endpoints: &[String]) -> Vec<String> {
    let n = endpoints.len();
    (0..n)
        .filter_map(|k| endpoints.get((i + k) % n).cloned())
        .collect()
}

fn random_suffix() -> String {
    use rand::Rng;
    format!("{:06x}", rand::thread_rng().gen::<u32>() & 0xff_ffff)
}

/// What the bench works on: a worker, a project with its sandbox on it, P profiles.
struct BenchSetup {
    tenant: TenantId,
    project: ProjectId,
    worker: WorkerId,
    profiles: Vec<ProfileId>,
}

pub async fn run(client: &SquadronClient, args: &BenchArgs) -> anyhow::Result<BenchReport> {
    anyhow::ensure!(args.clients >= 1, "--clients must be at least 1");
    anyhow::ensure!(args.duration >= 1, "--duration must be at least 1 second");
    let as_worker = worker_client(client, args)?;
    let setup = set_up(client, &as_worker, args).await?;
    eprintln!(
        "bench: {}/{}: {} profiles, {} clients, {} s, {} endpoint(s)",
        setup.tenant,
        setup.project,
        args.profiles,
        args.clients,
        args.duration,
        client.endpoints().len()
    );

    // Keep the worker alive for longer runs (it is lost after three silent intervals).
    let heartbeat = {
        let client = as_worker.clone();
        let worker = setup.worker.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(HEARTBEAT_EVERY_MS)).await;
                let _ = client.worker_heartbeat(&worker, None).await;
            }
        })
    };
    let started = Instant::now();
    let total = run_clients(client, args, &setup, started).await;
    let elapsed = started.elapsed().as_secs_f64();
    heartbeat.abort();
    let total = total?;

    let cycles = total.cycle.count();
    let ops = total.acquire.count() + total.renew.count() + total.release.count();
    Ok(BenchReport {
        tenant: setup.tenant.to_string(),
        project: setup.project.to_string(),
        endpoints: client.endpoints().to_vec(),
        clients: args.clients,
        profiles: args.profiles,
        duration_s: elapsed,
        cycles,
        ops,
        cycles_per_s: cycles as f64 / elapsed,
        ops_per_s: ops as f64 / elapsed,
        retries: total.retries,
        errors: total.errors,
        latency: OpLatencies {
            acquire: total.acquire.summary(),
            renew: total.renew.summary(),
            release: total.release.summary(),
            cycle: total.cycle.summary(),
        },
    })
}

/// Runs every client until the deadline and adds up their tallies.
async fn run_clients(
    client: &SquadronClient,
    args: &BenchArgs,
    setup: &BenchSetup,
    started: Instant,
) -> anyhow::Result<ClientTally> {
    let deadline = started + Duration::from_secs(args.duration);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..args.clients {
        let c = client.with_endpoints(endpoints_for(i, client.endpoints()));
        let Some(&profile) = setup.profiles.get(i % setup.profiles.len()) else {
            continue;
        };
        let holder = LeaseHolder {
            worker: setup.worker.clone(),
            process: format!("bench client {i}"),
            cgroup: None,
        };
        let ttl_ms = args.ttl_ms;
        set.spawn(async move { client_loop(c, profile, holder, ttl_ms, deadline).await });
    }
    let mut total = ClientTally::default();
    while let Some(joined) = set.join_next().await {
        total.merge(&joined.context("a bench client panicked")?);
    }
    Ok(total)
}

/// A client of the same endpoints presenting the bench worker's certificate.
fn worker_client(client: &SquadronClient, args: &BenchArgs) -> anyhow::Result<SquadronClient> {
    let dir = args.worker_cert_dir.as_ref().with_context(|| {
        format!(
            "--worker-cert-dir is required: issue the bench worker's certificate with \
             `squadron init <node configs> --worker-cert {BENCH_WORKER}=DIR`"
        )
    })?;
    let credentials =
        squadron_client::Credentials::from_cert_dir(dir, squadron_client::WORKER_CERT_NAME)
            .with_context(|| format!("--worker-cert-dir {}", dir.display()))?;
    Ok(SquadronClient::secured(
        client.endpoints().to_vec(),
        &credentials,
    )?)
}

/// Registers the worker, creates the project with its sandbox and the profiles.
async fn set_up(
    client: &SquadronClient,
    as_worker: &SquadronClient,
    args: &BenchArgs,
) -> anyhow::Result<BenchSetup> {
    let project: ProjectId = match &args.project {
        Some(p) => p.clone(),
        None => format!("bench-{}", random_suffix()).parse()?,
    };
    let tenant = args.tenant.clone();
    let worker = WorkerId::new(BENCH_WORKER)?;
    let p = args.profiles;
    let register = RegisterWorker {
        worker: worker.clone(),
        address: "127.0.0.1:0".into(),
        runtimes: vec![RuntimeKind::Process],
        capacity: 1,
        labels: Default::default(),
        heartbeat_interval_ms: Some(HEARTBEAT_INTERVAL_MS),
        policy: None,
    };
    as_worker
        .register_worker(&register, None)
        .await
        .context("registering the bench worker")?;
    let create = CreateProject {
        tenant: tenant.clone(),
        project: project.clone(),
        max_profiles: Some(p),
        max_active: Some(p.min(64)),
    };
    client
        .create_project(&create, None)
        .await
        .context("creating the bench project")?;
    let sandbox = AttachSandbox {
        worker: worker.clone(),
        runtime: RuntimeKind::Process,
        sandbox_ref: format!("bench-sandbox-{project}"),
    };
    client
        .attach_sandbox(&tenant, &project, &sandbox, None)
        .await
        .context("attaching the bench sandbox")?;
    let mut profiles: Vec<ProfileId> = Vec::new();
    for i in 0..p {
        let req = CreateProfile {
            key: ProfileKey::new(format!("agent-{i}"))?,
            providers: vec![Provider::Codex, Provider::Claude],
            context_ref: None,
        };
        let out = client
            .create_profile(&tenant, &project, &req, None)
            .await
            .with_context(|| format!("creating bench profile {i}"))?;
        profiles.push(
            out.profile_id()
                .with_context(|| format!("unexpected answer to profile creation: {out:?}"))?,
        );
    }
    Ok(BenchSetup {
        tenant,
        project,
        worker,
        profiles,
    })
}

/// Reads the profile's current generation, again after a pause while reads fail, until the
/// deadline; every failed read counts as an error. `None` when the deadline came first.
async fn reread(
    client: &SquadronClient,
    profile: ProfileId,
    deadline: Instant,
    tally: &mut ClientTally,
) -> Option<Generation> {
    let read = || client.get_profile(profile, Consistency::Linearizable);
    let pauses = ConstantBuilder::default()
        .with_delay(Duration::from_millis(ERROR_PAUSE_MS))
        .with_max_times(usize::MAX);
    let answer = read
        .retry(pauses)
        .when(|_| Instant::now() < deadline)
        .notify(|e, _| note_error(tally, "reading the profile", e))
        .await;
    match answer {
        Ok(p) => Some(p.generation),
        Err(e) => {
            note_error(tally, "reading the profile", &e);
            None
        }
    }
}

fn note_error(tally: &mut ClientTally, what: &str, e: &ClientError) {
    tally.errors += 1;
    // The first few are worth seeing; a flood is not.
    if tally.errors <= 3 {
        tracing::warn!("bench: {what}: {}: {}", e.code().as_str(), e.message());
    }
}

async fn client_loop(
    client: SquadronClient,
    profile: ProfileId,
    holder: LeaseHolder,
    ttl_ms: u64,
    deadline: Instant,
) -> ClientTally {
    let mut tally = ClientTally::default();
    let mut expected = None;
    while Instant::now() < deadline {
        let Some(generation) = expected else {
            expected = reread(&client, profile, deadline, &mut tally).await;
            continue;
        };
        let cycle_start = Instant::now();
        let request = AcquireLease {
            expected_generation: generation,
            provider: Provider::Codex,
            holder: holder.clone(),
            ttl_ms,
        };
        // Never repeat a refused compare-and-swap: without a grant, learn the current
        // generation first.
        let Some(grant) = acquire(&client, profile, &request, &mut tally).await else {
            expected = None;
            continue;
        };
        expected = renew_and_release(&client, profile, grant, ttl_ms, &mut tally).await;
        if expected.is_some() {
            tally.cycle.record(micros(cycle_start.elapsed()));
        }
    }
    tally
}

/// One acquire; a refusal is counted by kind (and waited out when someone else holds the
/// profile or the slots).
async fn acquire(
    client: &SquadronClient,
    profile: ProfileId,
    request: &AcquireLease,
    tally: &mut ClientTally,
) -> Option<LeaseGrant> {
    let t = Instant::now();
    match client.acquire_lease(profile, request, None).await {
        Ok(out) => match out.lease_grant() {
            Some(g) => {
                tally.acquire.record(micros(t.elapsed()));
                Some(g)
            }
            None => {
                tally.errors += 1;
                None
            }
        },
        Err(e) => {
            match e.rejection() {
                Some(Rejection::StaleGeneration { .. }) => tally.retries.stale_generation += 1,
                Some(Rejection::ProfileBusy { .. }) => tally.retries.profile_busy += 1,
                Some(Rejection::CapacityFull { .. }) => tally.retries.capacity_full += 1,
                _ => {
                    note_error(tally, "acquire", &e);
                    tokio::time::sleep(Duration::from_millis(ERROR_PAUSE_MS)).await;
                }
            }
            if matches!(
                e.rejection(),
                Some(Rejection::ProfileBusy { .. } | Rejection::CapacityFull { .. })
            ) {
                // Someone else holds it: give them a moment before re-reading.
                tokio::time::sleep(Duration::from_millis(BUSY_PAUSE_MS)).await;
            }
            None
        }
    }
}

/// Renews and releases a granted lease; the generation to expect next, or `None` when the
/// release failed (the profile is read again).
async fn renew_and_release(
    client: &SquadronClient,
    profile: ProfileId,
    grant: LeaseGrant,
    ttl_ms: u64,
    tally: &mut ClientTally,
) -> Option<Generation> {
    let t = Instant::now();
    let renew = RenewLease {
        profile,
        generation: grant.generation,
        ttl_ms,
    };
    match client.renew_lease(grant.lease, &renew, None).await {
        Ok(_) => tally.renew.record(micros(t.elapsed())),
        Err(e) => note_error(tally, "renew", &e),
    }
    let t = Instant::now();
    let fence = LeaseFence {
        profile,
        generation: grant.generation,
    };
    match client.release_lease(grant.lease, &fence, None).await {
        Ok(_) => {
            tally.release.record(micros(t.elapsed()));
            Some(grant.generation)
        }
        Err(e) => {
            note_error(tally, "release", &e);
            None
        }
    }
}

fn fmt_ms(v: f64) -> String {
    format!("{v:.3}")
}

pub fn render(r: &BenchReport) -> String {
    let mut out = format!(
        "bench {}/{}: {} clients, {} profiles, {:.1} s, endpoints {}\n",
        r.tenant,
        r.project,
        r.clients,
        r.profiles,
        r.duration_s,
        r.endpoints.join(",")
    );
    out.push_str(&format!(
        "throughput: {:.1} cycles/s, {:.1} ops/s ({} cycles, {} ops)\n",
        r.cycles_per_s, r.ops_per_s, r.cycles, r.ops
    ));
    out.push_str(&format!(
        "retries: {} (stale_generation {}, profile_busy {}, capacity_full {}); errors: {}\n",
        r.retries.total(),
        r.retries.stale_generation,
        r.retries.profile_busy,
        r.retries.capacity_full,
        r.errors
    ));
    let mut t = Table::new(&[
        "op", "count", "mean_ms", "p50_ms", "p99_ms", "p999_ms", "max_ms",
    ]);
    for (name, s) in [
        ("acquire", &r.latency.acquire),
        ("renew", &r.latency.renew),
        ("release", &r.latency.release),
        ("cycle", &r.latency.cycle),
    ] {
        t.row(vec![
            name.into(),
            s.count.to_string(),
            fmt_ms(s.mean_ms),
            fmt_ms(s.p50_ms),
            fmt_ms(s.p99_ms),
            fmt_ms(s.p999_ms),
            fmt_ms(s.max_ms),
        ]);
    }
    out.push_str(&t.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(samples: &[u64]) -> LatencyHistogram {
        let mut h = LatencyHistogram::with_significant_digits(LATENCY_SIGNIFICANT_DIGITS);
        for &s in samples {
            h.record(s);
        }
        h
    }

    #[test]
    fn nearest_rank_percentiles() {
        let sorted: Vec<u64> = (1..=1000).collect();
        let h = histogram(&sorted);
        assert_eq!(h.percentile_us(0.5), 500);
        assert_eq!(h.percentile_us(0.99), 990);
        assert_eq!(h.percentile_us(0.999), 999);
        assert_eq!(h.percentile_us(1.0), 1000);
        assert_eq!(histogram(&[7]).percentile_us(0.999), 7);
        assert_eq!(histogram(&[]).percentile_us(0.5), 0);
    }

    #[test]
    fn stats_are_in_milliseconds() {
        let s = histogram(&[3_000, 1_000, 2_000]).summary();
        assert_eq!(s.count, 3);
        assert_eq!(s.p50_ms, 2.0);
        assert_eq!(s.max_ms, 3.0);
        assert_eq!(s.mean_ms, 2.0);
        assert_eq!(histogram(&[]).summary(), LatencyStats::default());
    }

    #[test]
    fn clients_spread_over_endpoints() {
        let e: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        assert_eq!(endpoints_for(0, &e), ["a", "b", "c"]);
        assert_eq!(endpoints_for(4, &e), ["b", "c", "a"]);
        assert!(endpoints_for(1, &[]).is_empty());
    }

    #[test]
    fn the_report_table_lists_every_operation() {
        let r = BenchReport {
            tenant: "bench".into(),
            project: "bench-1".into(),
            endpoints: vec!["http://127.0.0.1:8120".into()],
            clients: 2,
            profiles: 8,
            duration_s: 3.0,
            cycles: 30,
            ops: 90,
            cycles_per_s: 10.0,
            ops_per_s: 30.0,
            retries: Retries::default(),
            errors: 0,
            latency: OpLatencies::default(),
        };
        let text = render(&r);
        for op in ["acquire", "renew", "release", "cycle"] {
            assert!(text.lines().any(|l| l.starts_with(op)), "{text}");
        }
        assert!(text.contains("10.0 cycles/s, 30.0 ops/s"));
    }
}
