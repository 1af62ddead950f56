//! `squadron bench`: closed-loop lease cycles (acquire → renew → release) against a cluster.
//!
//! Client i works on profile i % P through endpoint i % E (then the others, on failure), so a
//! run over several endpoints makes followers forward. A client that shares its profile with
//! others loses compare-and-swaps: a `stale_generation`, `profile_busy` or `capacity_full`
//! answer makes it re-read the profile and try again with the generation it read — it never
//! repeats a refused compare-and-swap blindly.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use squadron_client::{
    AcquireLease, AttachSandbox, ClientError, Consistency, CreateProfile, CreateProject,
    LeaseFence, OutcomeExt, RegisterWorker, RenewLease, SquadronClient,
};
use squadron_core::ids::{Generation, ProfileId, ProfileKey, ProjectId, WorkerId};
use squadron_core::lease::LeaseHolder;
use squadron_core::manifest::RuntimeKind;
use squadron_core::provider::Provider;
use squadron_core::Rejection;

use crate::cli::bench::BenchArgs;
use crate::output::Table;

/// The worker the bench registers and runs its "processes" on.
pub const BENCH_WORKER: &str = "bench-worker";

/// Latency summary of one operation, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyStats {
    pub count: usize,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl LatencyStats {
    /// Summarises samples in microseconds (sorts them).
    pub fn from_micros(samples: &mut [u64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let ms = |us: u64| us as f64 / 1_000.0;
        let sum: u128 = samples.iter().map(|&s| u128::from(s)).sum();
        Self {
            count: samples.len(),
            mean_ms: sum as f64 / samples.len() as f64 / 1_000.0,
            p50_ms: ms(percentile(samples, 0.50)),
            p99_ms: ms(percentile(samples, 0.99)),
            p999_ms: ms(percentile(samples, 0.999)),
            max_ms: ms(samples.last().copied().unwrap_or(0)),
        }
    }
}

/// The nearest-rank percentile of sorted samples: the smallest sample with at least `q` of the
/// samples at or below it.
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

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

#[derive(Debug, Default)]
struct ClientTally {
    acquire: Vec<u64>,
    renew: Vec<u64>,
    release: Vec<u64>,
    cycle: Vec<u64>,
    retries: Retries,
    errors: u64,
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

pub async fn run(client: &SquadronClient, args: &BenchArgs) -> anyhow::Result<BenchReport> {
    anyhow::ensure!(args.clients >= 1, "--clients must be at least 1");
    anyhow::ensure!(args.duration >= 1, "--duration must be at least 1 second");
    let project: ProjectId = match &args.project {
        Some(p) => p.clone(),
        None => format!("bench-{}", random_suffix()).parse()?,
    };
    let tenant = args.tenant.clone();
    let worker = WorkerId::new(BENCH_WORKER)?;
    let p = args.profiles;

    // Set up: a worker, a project with its sandbox on that worker, P profiles.
    client
        .register_worker(
            &RegisterWorker {
                worker: worker.clone(),
                address: "127.0.0.1:0".into(),
                runtimes: vec![RuntimeKind::Process],
                capacity: 1,
                labels: Default::default(),
                heartbeat_interval_ms: Some(10_000),
            },
            None,
        )
        .await
        .context("registering the bench worker")?;
    client
        .create_project(
            &CreateProject {
                tenant: tenant.clone(),
                project: project.clone(),
                max_profiles: Some(p),
                max_active: Some(p.min(64)),
            },
            None,
        )
        .await
        .context("creating the bench project")?;
    client
        .attach_sandbox(
            &tenant,
            &project,
            &AttachSandbox {
                worker: worker.clone(),
                runtime: RuntimeKind::Process,
                sandbox_ref: format!("bench-sandbox-{project}"),
            },
            None,
        )
        .await
        .context("attaching the bench sandbox")?;
    let mut profiles: Vec<ProfileId> = Vec::new();
    for i in 0..p {
        let out = client
            .create_profile(
                &tenant,
                &project,
                &CreateProfile {
                    key: ProfileKey::new(format!("agent-{i}"))?,
                    providers: vec![Provider::Codex, Provider::Claude],
                    context_ref: None,
                },
                None,
            )
            .await
            .with_context(|| format!("creating bench profile {i}"))?;
        profiles.push(
            out.profile_id()
                .with_context(|| format!("unexpected answer to profile creation: {out:?}"))?,
        );
    }
    eprintln!(
        "bench: {tenant}/{project}: {p} profiles, {} clients, {} s, {} endpoint(s)",
        args.clients,
        args.duration,
        client.endpoints().len()
    );

    // Keep the worker alive for longer runs (it is lost after three silent intervals).
    let heartbeat = {
        let client = client.clone();
        let worker = worker.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let _ = client.worker_heartbeat(&worker, None).await;
            }
        })
    };

    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..args.clients {
        let c = client.with_endpoints(endpoints_for(i, client.endpoints()));
        let Some(&profile) = profiles.get(i % profiles.len()) else {
            continue;
        };
        let holder = LeaseHolder {
            worker: worker.clone(),
            process: format!("bench client {i}"),
            cgroup: None,
        };
        let ttl_ms = args.ttl_ms;
        set.spawn(async move { client_loop(c, profile, holder, ttl_ms, deadline).await });
    }
    let mut total = ClientTally::default();
    while let Some(joined) = set.join_next().await {
        let t = joined.context("a bench client panicked")?;
        total.acquire.extend(t.acquire);
        total.renew.extend(t.renew);
        total.release.extend(t.release);
        total.cycle.extend(t.cycle);
        total.retries.stale_generation += t.retries.stale_generation;
        total.retries.profile_busy += t.retries.profile_busy;
        total.retries.capacity_full += t.retries.capacity_full;
        total.errors += t.errors;
    }
    let elapsed = started.elapsed().as_secs_f64();
    heartbeat.abort();

    let cycles = total.cycle.len() as u64;
    let ops = (total.acquire.len() + total.renew.len() + total.release.len()) as u64;
    Ok(BenchReport {
        tenant: tenant.to_string(),
        project: project.to_string(),
        endpoints: client.endpoints().to_vec(),
        clients: args.clients,
        profiles: p,
        duration_s: elapsed,
        cycles,
        ops,
        cycles_per_s: cycles as f64 / elapsed,
        ops_per_s: ops as f64 / elapsed,
        retries: total.retries,
        errors: total.errors,
        latency: OpLatencies {
            acquire: LatencyStats::from_micros(&mut total.acquire),
            renew: LatencyStats::from_micros(&mut total.renew),
            release: LatencyStats::from_micros(&mut total.release),
            cycle: LatencyStats::from_micros(&mut total.cycle),
        },
    })
}

/// Reads the profile's current generation; `None` (counted as an error) when that fails.
async fn reread(
    client: &SquadronClient,
    profile: ProfileId,
    tally: &mut ClientTally,
) -> Option<Generation> {
    match client.get_profile(profile, Consistency::Linearizable).await {
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
            expected = reread(&client, profile, &mut tally).await;
            if expected.is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            continue;
        };
        let cycle_start = Instant::now();
        let request = AcquireLease {
            expected_generation: generation,
            provider: Provider::Codex,
            holder: holder.clone(),
            ttl_ms,
        };
        let t = Instant::now();
        let grant = match client.acquire_lease(profile, &request, None).await {
            Ok(out) => match out.lease_grant() {
                Some(g) => {
                    tally.acquire.push(micros(t.elapsed()));
                    g
                }
                None => {
                    tally.errors += 1;
                    expected = None;
                    continue;
                }
            },
            Err(e) => {
                match e.rejection() {
                    Some(Rejection::StaleGeneration { .. }) => tally.retries.stale_generation += 1,
                    Some(Rejection::ProfileBusy { .. }) => tally.retries.profile_busy += 1,
                    Some(Rejection::CapacityFull { .. }) => tally.retries.capacity_full += 1,
                    _ => {
                        note_error(&mut tally, "acquire", &e);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                if matches!(
                    e.rejection(),
                    Some(Rejection::ProfileBusy { .. } | Rejection::CapacityFull { .. })
                ) {
                    // Someone else holds it: give them a moment before re-reading.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                // Never repeat a refused compare-and-swap: learn the current generation first.
                expected = None;
                continue;
            }
        };
        let t = Instant::now();
        let renew = RenewLease {
            profile,
            generation: grant.generation,
            ttl_ms,
        };
        match client.renew_lease(grant.lease, &renew, None).await {
            Ok(_) => tally.renew.push(micros(t.elapsed())),
            Err(e) => note_error(&mut tally, "renew", &e),
        }
        let t = Instant::now();
        let fence = LeaseFence {
            profile,
            generation: grant.generation,
        };
        match client.release_lease(grant.lease, &fence, None).await {
            Ok(_) => {
                tally.release.push(micros(t.elapsed()));
                tally.cycle.push(micros(cycle_start.elapsed()));
                expected = Some(grant.generation);
            }
            Err(e) => {
                note_error(&mut tally, "release", &e);
                expected = None;
            }
        }
    }
    tally
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

    #[test]
    fn nearest_rank_percentiles() {
        let sorted: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&sorted, 0.5), 500);
        assert_eq!(percentile(&sorted, 0.99), 990);
        assert_eq!(percentile(&sorted, 0.999), 999);
        assert_eq!(percentile(&sorted, 1.0), 1000);
        assert_eq!(percentile(&[7], 0.999), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn stats_are_in_milliseconds() {
        let mut samples = vec![3_000, 1_000, 2_000];
        let s = LatencyStats::from_micros(&mut samples);
        assert_eq!(s.count, 3);
        assert_eq!(s.p50_ms, 2.0);
        assert_eq!(s.max_ms, 3.0);
        assert_eq!(s.mean_ms, 2.0);
        assert_eq!(LatencyStats::from_micros(&mut []), LatencyStats::default());
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
