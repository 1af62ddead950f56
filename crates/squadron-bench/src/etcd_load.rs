//! The same workloads on etcd, as an operator would model them with the v3 API:
//!
//! - lease cycle: a transaction that puts the client's key with a lease attached if the key's
//!   mod revision is the one last seen (a compare-and-swap on a "generation") → a keep-alive of
//!   the lease → a transaction that deletes the key if its mod revision is still the one the
//!   acquire wrote. Each client grants one session lease when it starts and reuses it, as
//!   etcd's own `concurrency` package does.
//! - capacity admission: one transaction that checks the slot-count key (unchanged since last
//!   read, and below 4) and the profile key (absent) together, then writes both; its failure
//!   branch reads both back, so a refusal costs one round trip as on Squadron. Release is the
//!   reverse transaction.
//! - linearizable read: a range of a profile key (etcd's default is linearizable).
//! - task submit: a transaction that creates a new task key only if it does not exist.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::BenchError;
use crate::etcd_client::{
    compare_created, compare_mod, compare_value_less, compare_version, op_delete, op_put, op_range,
    EtcdClient, EtcdError, KeyValue,
};
use crate::load::{FailoverProbe, OpResult, Recorder};
use crate::options::{ClientRoute, EtcdProtocol};
use crate::squadron_load::{
    client_seed, ADMISSION_ATTEMPTS_MAX, CAPACITY_PROFILES, CAPACITY_SLOTS, CONNECT_TIMEOUT_MS,
    LEASE_TTL_MS, REQUEST_TIMEOUT_MS, TASK_MANIFEST,
};

const SYSTEM: &str = "etcd";
const SLOTS_KEY: &str = "bench/capacity/slots";
/// Attempts to give a slot back: the slot count is one key every client writes, so under
/// contention a release may lose many compare-and-swaps in a row, and a release given up
/// would leak the slot for the rest of the run.
const SLOT_RELEASE_ATTEMPTS_MAX: usize = 256;
/// Bytes of the profile value a read returns (about what Squadron's profile JSON weighs).
const PROFILE_VALUE_BYTES: usize = 400;

fn profile_key(r: usize) -> String {
    format!("bench/capacity/profile/{r}")
}

fn lease_key(i: usize) -> String {
    format!("bench/lease/{i}")
}

/// What the workloads share across points.
#[derive(Debug)]
pub(crate) struct EtcdData {
    /// The mod revision each lease-cycle client last saw of its key (0: absent).
    lease_revisions: Arc<Vec<AtomicI64>>,
    /// Numbers the submitted task keys across the whole run.
    task_sequence: Arc<AtomicU64>,
}

/// The cluster's client URLs and the protocol the load speaks to them.
#[derive(Debug, Clone)]
pub(crate) struct EtcdEndpoints {
    /// The leader first (`EtcdCluster::endpoints`).
    pub(crate) urls: Vec<String>,
    pub(crate) protocol: EtcdProtocol,
    pub(crate) route: ClientRoute,
}

pub(crate) fn client_for(endpoints: &EtcdEndpoints, i: usize) -> EtcdClient {
    let mut rotated = endpoints.urls.clone();
    if endpoints.route == ClientRoute::Spread && !rotated.is_empty() {
        rotated.rotate_left(i % endpoints.urls.len());
    }
    EtcdClient::new(
        endpoints.protocol,
        rotated,
        Duration::from_millis(REQUEST_TIMEOUT_MS),
        Duration::from_millis(CONNECT_TIMEOUT_MS),
    )
}

/// Writes the slot count and the profiles the reads and admissions use.
pub(crate) async fn setup(client: &EtcdClient, clients_max: usize) -> Result<EtcdData, BenchError> {
    client
        .put(SLOTS_KEY, b"0")
        .await
        .map_err(|e| BenchError::setup(SYSTEM, "put the slot count", e))?;
    for r in 0..CAPACITY_PROFILES {
        let mut value = format!(
            "{{\"id\":{r},\"tenant\":\"bench\",\"project\":\"capacity\",\"key\":\"agent-{r}\",\
             \"providers\":[\"codex\"],\"generation\":0,\"live_lease\":null,\"context_ref\":null,\
             \"required_skills\":[],\"mcp_servers\":[],\"padding\":\""
        );
        while value.len() < PROFILE_VALUE_BYTES - 2 {
            value.push('x');
        }
        value.push_str("\"}");
        client
            .put(&format!("bench/profile/{r}"), value.as_bytes())
            .await
            .map_err(|e| BenchError::setup(SYSTEM, format!("put profile {r}"), e))?;
    }
    Ok(EtcdData {
        lease_revisions: Arc::new((0..clients_max).map(|_| AtomicI64::new(0)).collect()),
        task_sequence: Arc::new(AtomicU64::new(0)),
    })
}

fn lease_ttl_s() -> i64 {
    (LEASE_TTL_MS / 1_000) as i64
}

fn probe_ok(probe: &Option<Arc<FailoverProbe>>, started: Instant) {
    if let Some(p) = probe {
        p.write_ok(started);
    }
}

/// Lease cycle: CAS acquire with a lease → keep-alive → CAS release.
pub(crate) fn lease_cycle(
    data: &EtcdData,
    endpoints: &EtcdEndpoints,
    i: usize,
    mut rec: Recorder,
    probe: Option<Arc<FailoverProbe>>,
) -> impl std::future::Future<Output = Recorder> + Send + 'static {
    let client = client_for(endpoints, i);
    let revisions = data.lease_revisions.clone();
    async move {
        let Some(last) = revisions.get(i) else {
            rec.note_error(format!("no lease key for client {i}"));
            return rec;
        };
        let mut session = None;
        while rec.running() {
            let started = Instant::now();
            let lease = match session {
                Some(l) => l,
                None => match client.lease_grant(lease_ttl_s()).await {
                    Ok(l) => {
                        session = Some(l);
                        l
                    }
                    Err(e) => {
                        rec.record(started, OpResult::Error);
                        rec.note_error(e.to_string());
                        rec.back_off().await;
                        continue;
                    }
                },
            };
            match cycle(&client, &lease_key(i), lease, last, &probe).await {
                Ok(()) => rec.record(started, OpResult::Ok),
                Err(e) => {
                    rec.record(started, OpResult::Error);
                    rec.note_error(e.to_string());
                    // The session lease may be gone (expired during an outage): take a new
                    // one rather than fail every following keep-alive.
                    session = None;
                    rec.back_off().await;
                }
            }
        }
        rec
    }
}

async fn cycle(
    client: &EtcdClient,
    key: &str,
    lease: i64,
    last: &AtomicI64,
    probe: &Option<Arc<FailoverProbe>>,
) -> Result<(), EtcdError> {
    let t = Instant::now();
    let acquired = client
        .txn(
            vec![compare_mod(key, last.load(Ordering::Relaxed))],
            vec![op_put(key, b"held", Some(lease))],
            vec![op_range(key)],
        )
        .await?;
    if !acquired.succeeded {
        // Resynchronise after an earlier failure: drop a key this client still holds.
        let current = acquired.ranges.first().cloned().flatten();
        let mut message = format!("acquire lost its compare-and-swap on {key}");
        match current {
            Some(kv) => {
                let released = client
                    .txn(
                        vec![compare_mod(key, kv.mod_revision)],
                        vec![op_delete(key)],
                        vec![],
                    )
                    .await;
                match released {
                    Ok(a) if a.succeeded => last.store(0, Ordering::Relaxed),
                    Ok(_) => last.store(kv.mod_revision, Ordering::Relaxed),
                    Err(e) => message.push_str(&format!("; then {e}")),
                }
            }
            None => last.store(0, Ordering::Relaxed),
        }
        return Err(EtcdError::Decode {
            path: "/v3/kv/txn",
            message,
        });
    }
    probe_ok(probe, t);
    let mine = acquired.revision;
    last.store(mine, Ordering::Relaxed);
    client.lease_keepalive(lease).await?;
    let t = Instant::now();
    let released = client
        .txn(
            vec![compare_mod(key, mine)],
            vec![op_delete(key)],
            vec![op_range(key)],
        )
        .await?;
    if !released.succeeded {
        return Err(EtcdError::Decode {
            path: "/v3/kv/txn",
            message: format!("release lost its compare-and-swap on {key}"),
        });
    }
    probe_ok(probe, t);
    last.store(0, Ordering::Relaxed);
    Ok(())
}

/// The client's view of the slot count key.
#[derive(Debug, Clone, Copy, Default)]
struct Slots {
    revision: i64,
    held: u32,
}

impl Slots {
    fn learn(&mut self, kv: Option<&KeyValue>) -> Result<(), String> {
        let kv = kv.ok_or_else(|| format!("{SLOTS_KEY} is missing"))?;
        let text = String::from_utf8_lossy(&kv.value);
        self.held = text
            .parse()
            .map_err(|_| format!("{SLOTS_KEY} holds {text:?}, not a count"))?;
        self.revision = kv.mod_revision;
        Ok(())
    }
}

enum Admission {
    Granted { profile_revision: i64 },
    Refused,
    Failed(String),
}

/// Capacity admission under the 4-slot rule, over 8 profile keys.
pub(crate) fn capacity(
    endpoints: &EtcdEndpoints,
    i: usize,
    seed: u64,
    mut rec: Recorder,
) -> impl std::future::Future<Output = Recorder> + Send + 'static {
    let client = client_for(endpoints, i);
    let mut rng = StdRng::seed_from_u64(client_seed(seed, i));
    async move {
        let mut slots = Slots::default();
        let mut session = None;
        while rec.running() {
            let started = Instant::now();
            let lease = match session {
                Some(l) => l,
                None => match client.lease_grant(lease_ttl_s()).await {
                    Ok(l) => {
                        session = Some(l);
                        l
                    }
                    Err(e) => {
                        rec.record(started, OpResult::Error);
                        rec.note_error(e.to_string());
                        rec.back_off().await;
                        continue;
                    }
                },
            };
            let key = profile_key(rng.gen_range(0..CAPACITY_PROFILES));
            match admit(&client, &key, lease, &mut slots).await {
                Admission::Granted { profile_revision } => {
                    rec.record(started, OpResult::Ok);
                    if let Err(message) = release(&client, &key, profile_revision, &mut slots).await
                    {
                        rec.note_error(message);
                    }
                }
                Admission::Refused => rec.record(started, OpResult::Refused),
                Admission::Failed(message) => {
                    rec.record(started, OpResult::Error);
                    rec.note_error(message);
                    session = None;
                    rec.back_off().await;
                }
            }
        }
        rec
    }
}

async fn admit(client: &EtcdClient, key: &str, lease: i64, slots: &mut Slots) -> Admission {
    let limit = CAPACITY_SLOTS.to_string();
    for _ in 0..ADMISSION_ATTEMPTS_MAX {
        let answer = client
            .txn(
                vec![
                    compare_mod(SLOTS_KEY, slots.revision),
                    compare_value_less(SLOTS_KEY, &limit),
                    compare_version(key, 0),
                ],
                vec![
                    op_put(SLOTS_KEY, (slots.held + 1).to_string().as_bytes(), None),
                    op_put(key, b"held", Some(lease)),
                ],
                vec![op_range(SLOTS_KEY), op_range(key)],
            )
            .await;
        let answer = match answer {
            Ok(a) => a,
            Err(e) => return Admission::Failed(e.to_string()),
        };
        if answer.succeeded {
            slots.revision = answer.revision;
            slots.held += 1;
            return Admission::Granted {
                profile_revision: answer.revision,
            };
        }
        if let Err(message) = slots.learn(answer.ranges.first().and_then(Option::as_ref)) {
            return Admission::Failed(message);
        }
        if slots.held >= CAPACITY_SLOTS {
            return Admission::Refused;
        }
        if answer.ranges.get(1).is_some_and(Option::is_some) {
            return Admission::Refused;
        }
        // Only the cached slot count was stale: try again with the current one.
    }
    Admission::Failed(format!(
        "no decision after {ADMISSION_ATTEMPTS_MAX} compare-and-swap attempts"
    ))
}

async fn release(
    client: &EtcdClient,
    key: &str,
    profile_revision: i64,
    slots: &mut Slots,
) -> Result<(), String> {
    for _ in 0..SLOT_RELEASE_ATTEMPTS_MAX {
        let answer = client
            .txn(
                vec![
                    compare_mod(SLOTS_KEY, slots.revision),
                    compare_mod(key, profile_revision),
                ],
                vec![
                    op_put(
                        SLOTS_KEY,
                        slots.held.saturating_sub(1).to_string().as_bytes(),
                        None,
                    ),
                    op_delete(key),
                ],
                vec![op_range(SLOTS_KEY), op_range(key)],
            )
            .await
            .map_err(|e| e.to_string())?;
        if answer.succeeded {
            slots.revision = answer.revision;
            slots.held = slots.held.saturating_sub(1);
            return Ok(());
        }
        slots.learn(answer.ranges.first().and_then(Option::as_ref))?;
        let still_mine = answer
            .ranges
            .get(1)
            .and_then(Option::as_ref)
            .is_some_and(|kv| kv.mod_revision == profile_revision);
        if !still_mine {
            return Err(format!("{key} changed under its holder; slot not released"));
        }
    }
    Err(format!(
        "release of {key} lost {SLOT_RELEASE_ATTEMPTS_MAX} compare-and-swaps on the slot count"
    ))
}

/// Linearizable range of a random profile key.
pub(crate) fn read(
    endpoints: &EtcdEndpoints,
    i: usize,
    seed: u64,
    mut rec: Recorder,
) -> impl std::future::Future<Output = Recorder> + Send + 'static {
    let client = client_for(endpoints, i);
    let mut rng = StdRng::seed_from_u64(client_seed(seed, i));
    async move {
        while rec.running() {
            let key = format!("bench/profile/{}", rng.gen_range(0..CAPACITY_PROFILES));
            let started = Instant::now();
            match client.get(&key).await {
                Ok(Some(_)) => rec.record(started, OpResult::Ok),
                Ok(None) => {
                    rec.record(started, OpResult::Error);
                    rec.note_error(format!("{key} is missing"));
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

/// Task submission: create a new task key (the manifest as its value) if it does not exist.
pub(crate) fn submit(
    data: &EtcdData,
    endpoints: &EtcdEndpoints,
    i: usize,
    mut rec: Recorder,
) -> impl std::future::Future<Output = Recorder> + Send + 'static {
    let client = client_for(endpoints, i);
    let sequence = data.task_sequence.clone();
    async move {
        while rec.running() {
            let key = format!(
                "bench/tasks/{:016}",
                sequence.fetch_add(1, Ordering::Relaxed)
            );
            let started = Instant::now();
            let answer = client
                .txn(
                    vec![compare_created(&key, 0)],
                    vec![op_put(&key, TASK_MANIFEST.as_bytes(), None)],
                    vec![],
                )
                .await;
            match answer {
                Ok(a) if a.succeeded => rec.record(started, OpResult::Ok),
                Ok(_) => {
                    rec.record(started, OpResult::Error);
                    rec.note_error(format!("{key} already existed"));
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
