//! `squadron bench scale`: a cluster loaded to DESIGN §7's size — 100,000 profiles over 12,500
//! projects and a million task records, mixed pending and terminal — and what that costs it:
//! load rate and write latency, each node's apply times, snapshot builds (time, size, the
//! lock they hold) and memory, a follower's restart from its disk, and a new follower's
//! catch-up from the leader's snapshot. Targets (DESIGN §7): apply p99 ≤ 1 ms, RSS ≤ 1.5 GiB
//! per node, no write waiting more than 50 ms while a snapshot is built.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use squadron_client::{AddLearner, Consistency, SquadronClient};

use crate::error::BenchError;
use crate::machine::MachineInfo;
use crate::scale_load::{load_profiles, load_tasks};
use crate::scale_options::ScaleOptions;
use crate::scale_report::{CatchUp, NodeFigures, ScaleReport};
use crate::squadron_cluster::{SquadronCluster, POLL_INTERVAL_MS, STARTUP_TIMEOUT_MS};
use crate::{metrics_http, metrics_text, version_line, Steps};

/// Longest wait for a restarted or added node to catch up (a million tasks' snapshot is
/// hundreds of megabytes to send, check and decode on two shared cores).
const CATCH_UP_WAIT_MS_MAX: u64 = 900_000;
/// The request adding the learner: the leader answers once the learner caught up.
const ADD_LEARNER_TIMEOUT_MS: u64 = CATCH_UP_WAIT_MS_MAX;

/// Runs the scale benchmark under a temporary directory, removed at the end (and every node
/// killed), also on error.
pub async fn scale(opts: &ScaleOptions) -> Result<ScaleReport, BenchError> {
    scale_with(opts, &|_| {}).await
}

/// [`scale`], saying each step and the load's progress to `steps`.
pub async fn scale_with(opts: &ScaleOptions, steps: Steps<'_>) -> Result<ScaleReport, BenchError> {
    opts.validate()?;
    if !opts.squadron_bin.is_file() {
        return Err(BenchError::MissingBinary {
            what: "the squadron binary",
            path: opts.squadron_bin.clone(),
            hint: "build it (cargo build --release -p squadron) or pass its path",
        });
    }
    let dir = crate::run_dir(opts.work_dir.as_deref(), "squadron-bench-scale-")?;
    steps(&format!("starting {} nodes", opts.nodes));
    let mut cluster = SquadronCluster::start_with(
        &opts.squadron_bin,
        dir.path(),
        opts.nodes,
        &opts.node_config(),
    )
    .await?;
    let endpoints = cluster.endpoints();
    let profiles = load_profiles(&endpoints, opts, steps).await?;
    let tasks = load_tasks(&endpoints, opts, steps).await;
    steps("waiting for every node to apply the load");
    let (_, target) = leader_applied(&mut cluster).await?;
    for (id, _) in cluster.node_urls() {
        let caught = catch_up(&cluster, id, target, Instant::now(), None).await?;
        if caught.caught_up_ms.is_none() {
            return Err(BenchError::setup(
                "squadron",
                "waiting for the nodes",
                format!("node {id} did not apply index {target}"),
            ));
        }
    }
    steps("reading every node's figures");
    let mut nodes = Vec::new();
    for (id, _) in cluster.node_urls() {
        nodes.push(figures(&cluster, id).await?);
    }
    steps("restarting a follower from its disk");
    let restart = restart_follower(&mut cluster).await?;
    steps("adding a new follower");
    let install = add_follower(&mut cluster).await?;
    drop(cluster);
    Ok(ScaleReport {
        machine: MachineInfo::probe(dir.path()),
        squadron_version: version_line(&opts.squadron_bin),
        options: opts.clone(),
        profiles,
        tasks,
        nodes,
        restart,
        install,
        work_dir: opts.keep_work_dir.then(|| dir.keep().display().to_string()),
    })
}

/// Node `id`'s `/metrics` figures (timed) and its RSS.
async fn figures(cluster: &SquadronCluster, id: u64) -> Result<NodeFigures, BenchError> {
    let failed = |what: &str| BenchError::setup("squadron", format!("node {id}'s /metrics"), what);
    let endpoints = cluster.endpoints();
    let http = metrics_http(&endpoints.credentials).ok_or_else(|| failed("no HTTP client"))?;
    let url = cluster
        .node_urls()
        .into_iter()
        .find_map(|(n, url)| (n == id).then_some(url))
        .ok_or_else(|| failed("no such node"))?;
    let started = Instant::now();
    let text = metrics_text(&http, &url, &endpoints.credentials)
        .await
        .ok_or_else(|| failed("no answer"))?;
    let mut figures = NodeFigures::from_metrics(id, &text);
    figures.metrics_ms = started.elapsed().as_secs_f64() * 1_000.0;
    figures.rss_kib = cluster.rss_kib(id);
    Ok(figures)
}

/// The applied index of node `id`, as it says itself; `None` if it does not answer.
async fn applied(client: &SquadronClient) -> Option<u64> {
    let status = client
        .cluster_status_without_digest(Consistency::Stale)
        .await
        .ok()?;
    Some(status.applied.unwrap_or(0))
}

/// The leader's applied index: what a catching-up node must reach.
async fn leader_applied(cluster: &mut SquadronCluster) -> Result<(u64, u64), BenchError> {
    let leader = cluster
        .wait_for_leader(Duration::from_millis(STARTUP_TIMEOUT_MS))
        .await?;
    let client = cluster.node_client(leader)?;
    let index = applied(&client)
        .await
        .ok_or_else(|| BenchError::setup("squadron", "the leader's status", "no answer"))?;
    Ok((leader, index))
}

/// Polls node `id` from `started` until it has applied `target`, the wait runs out, or
/// `gave_up` (the request that brings it in, if any) has ended in an error.
async fn catch_up(
    cluster: &SquadronCluster,
    id: u64,
    target: u64,
    started: Instant,
    gave_up: Option<&dyn Fn() -> bool>,
) -> Result<CatchUp, BenchError> {
    let client = cluster.node_client(id)?;
    let mut answered = None;
    let mut caught_up = None;
    while started.elapsed() < Duration::from_millis(CATCH_UP_WAIT_MS_MAX)
        && !gave_up.is_some_and(|f| f())
    {
        if let Some(index) = applied(&client).await {
            let at = started.elapsed().as_secs_f64() * 1_000.0;
            answered.get_or_insert(at);
            if index >= target {
                caught_up = Some(at);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
    }
    Ok(CatchUp {
        node: id,
        target_index: target,
        answered_ms: answered,
        caught_up_ms: caught_up,
        figures: figures(cluster, id).await.unwrap_or_default(),
    })
}

/// SIGKILL of a follower (the only node of a one-node cluster), then a start from its disk:
/// its snapshot loaded and its log after it applied again.
async fn restart_follower(cluster: &mut SquadronCluster) -> Result<CatchUp, BenchError> {
    let (leader, target) = leader_applied(cluster).await?;
    let victim = cluster
        .node_urls()
        .into_iter()
        .map(|(id, _)| id)
        .find(|id| *id != leader)
        .unwrap_or(leader);
    cluster.kill(victim);
    cluster.restart(victim)?;
    catch_up(cluster, victim, target, Instant::now(), None).await
}

/// A node with an empty disk added as a learner: the leader sends it its snapshot (its log
/// was purged behind the last one) and the log after it.
async fn add_follower(cluster: &mut SquadronCluster) -> Result<CatchUp, BenchError> {
    let (leader, target) = leader_applied(cluster).await?;
    let (id, [rest, grpc, peer]) = cluster.start_new_node()?;
    let leader_url = cluster
        .node_urls()
        .into_iter()
        .find_map(|(n, url)| (n == leader).then_some(url))
        .unwrap_or_default();
    let endpoints = cluster.endpoints();
    let client = SquadronClient::secured_with_timeouts(
        vec![leader_url],
        &endpoints.credentials,
        Duration::from_millis(ADD_LEARNER_TIMEOUT_MS),
        Duration::from_millis(crate::squadron_load::CONNECT_TIMEOUT_MS),
    )
    .map_err(|e| BenchError::setup("squadron", "the leader's client", e))?;
    let started = Instant::now();
    let request = AddLearner {
        id,
        rest,
        grpc,
        peer,
    };
    let failed = Arc::new(AtomicBool::new(false));
    let failed_in_task = failed.clone();
    let add = tokio::spawn(async move {
        let answer = client.add_learner(&request).await;
        failed_in_task.store(answer.is_err(), Ordering::Relaxed);
        answer
    });
    // A refusal ends the wait at once (and is reported below).
    let refused = || failed.load(Ordering::Relaxed);
    let caught = catch_up(cluster, id, target, started, Some(&refused)).await?;
    match add.await {
        Ok(Ok(_)) => Ok(caught),
        Ok(Err(e)) => Err(BenchError::setup(
            "squadron",
            format!("adding node {id}"),
            e,
        )),
        Err(e) => Err(BenchError::setup(
            "squadron",
            format!("adding node {id}"),
            e,
        )),
    }
}
