//! `squadron bench sandbox-start`: how long a sandbox takes to start, per runtime. Tasks are
//! submitted one after the other (each waits for the last to end, so no start waits behind
//! another) with a provider that does nothing; the figures are the leader's own stamps on each
//! task — submitted, entered READY, entered RUNNING — so no client clock or poll interval is
//! in them. The stamps of the states between (STAGING, PROVISIONING) split each start into its
//! phases (queued, staging, provisioning, the start itself), so a slow tail shows where it is
//! spent.

use crate::progress::Progress;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use squadron_bench::{LatencyHistogram, LatencySummary};
use squadron_client::{Consistency, SquadronClient};
use squadron_core::ids::TaskId;
use squadron_core::task::{Task, TaskState};

use crate::output::Table;

/// Tasks measured per runtime, at most.
pub const START_BENCH_TASKS_MAX: usize = 1_000;
/// How long one task may take from submission to its end.
const TASK_DEADLINE_MS: u64 = 300_000;
const POLL_MS: u64 = 50;

#[derive(Debug, Clone)]
pub struct StartBenchOptions {
    pub runtimes: Vec<String>,
    pub tasks: usize,
    pub repository: String,
    pub branch: String,
    /// Every task's `network_mode`; `None`: see `manifest`.
    pub network_mode: Option<squadron_core::manifest::NetworkMode>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RuntimeStarts {
    pub runtime: String,
    pub tasks: usize,
    pub failed: usize,
    pub submit_to_ready: LatencySummary,
    pub submit_to_running: LatencySummary,
    /// Each phase of a start, in the order a task passes them (`PHASES`).
    #[serde(default)]
    pub phases: Vec<PhaseStarts>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseStarts {
    pub phase: String,
    pub latency: LatencySummary,
}

/// The phases of a start: from the stamp of the first state (`None`: the submission) to the
/// entry into the second.
const PHASES: [(&str, Option<TaskState>, TaskState); 4] = [
    ("submitted → STAGING", None, TaskState::Staging),
    (
        "STAGING → PROVISIONING",
        Some(TaskState::Staging),
        TaskState::Provisioning,
    ),
    (
        "PROVISIONING → READY",
        Some(TaskState::Provisioning),
        TaskState::Ready,
    ),
    (
        "READY → RUNNING",
        Some(TaskState::Ready),
        TaskState::Running,
    ),
];

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StartBenchReport {
    pub runtimes: Vec<RuntimeStarts>,
}

pub async fn run(
    client: &SquadronClient,
    opts: &StartBenchOptions,
    progress: &Progress,
) -> anyhow::Result<StartBenchReport> {
    anyhow::ensure!(
        (1..=START_BENCH_TASKS_MAX).contains(&opts.tasks),
        "--tasks must be 1..={START_BENCH_TASKS_MAX}, got {}",
        opts.tasks
    );
    let mut runtimes = Vec::new();
    for runtime in &opts.runtimes {
        runtimes.push(one_runtime(client, opts, runtime, progress).await?);
    }
    Ok(StartBenchReport { runtimes })
}

async fn one_runtime(
    client: &SquadronClient,
    opts: &StartBenchOptions,
    runtime: &str,
    progress: &Progress,
) -> anyhow::Result<RuntimeStarts> {
    let (mut ready, mut running) = (LatencyHistogram::new(), LatencyHistogram::new());
    let mut phases: Vec<LatencyHistogram> =
        PHASES.iter().map(|_| LatencyHistogram::new()).collect();
    let mut failed = 0;
    for i in 0..opts.tasks {
        progress.say(format!(
            "sandbox starts: {runtime} task {}/{}",
            i + 1,
            opts.tasks
        ));
        let manifest = manifest(opts, runtime, i);
        let outcome = client
            .submit_task_yaml(&manifest, None)
            .await
            .with_context(|| format!("submit a {runtime} task"))?;
        let squadron_core::Outcome::TaskSubmitted { task } = outcome else {
            anyhow::bail!("unexpected answer to a submission: {outcome:?}");
        };
        let t = wait_end(client, task).await?;
        let at = |s: TaskState| t.entered_at_ms.get(&s).copied();
        match (at(TaskState::Ready), at(TaskState::Running), t.state) {
            (Some(r), Some(g), TaskState::Completed) => {
                ready.record(r.saturating_sub(t.submitted_at_ms) * 1_000);
                running.record(g.saturating_sub(t.submitted_at_ms) * 1_000);
                for (ms, h) in phase_ms(t.submitted_at_ms, at).into_iter().zip(&mut phases) {
                    if let Some(ms) = ms {
                        h.record(ms * 1_000);
                    }
                }
            }
            _ => {
                failed += 1;
                eprintln!(
                    "task {task} ({runtime}) ended {}: {}",
                    t.state,
                    t.error.unwrap_or_default()
                );
            }
        }
    }
    Ok(RuntimeStarts {
        runtime: runtime.to_string(),
        tasks: opts.tasks,
        failed,
        submit_to_ready: ready.summary(),
        submit_to_running: running.summary(),
        phases: PHASES
            .iter()
            .zip(phases)
            .map(|((phase, _, _), h)| PhaseStarts {
                phase: (*phase).to_string(),
                latency: h.summary(),
            })
            .collect(),
    })
}

/// Each phase's length in ms (`PHASES`'s order), from the submission stamp and the stamp of
/// each state a task entered; `None` for a phase whose ends were not both stamped.
fn phase_ms(submitted_ms: u64, at: impl Fn(TaskState) -> Option<u64>) -> Vec<Option<u64>> {
    PHASES
        .iter()
        .map(|(_, from, to)| {
            let from = from.map_or(Some(submitted_ms), &at)?;
            Some(at(*to)?.saturating_sub(from))
        })
        .collect()
}

/// `--network-mode`, refused naming the flag when it is not a mode.
pub fn network_mode(
    flag: Option<&str>,
) -> anyhow::Result<Option<squadron_core::manifest::NetworkMode>> {
    flag.map(str::parse)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--network-mode: {e}"))
}

fn manifest(opts: &StartBenchOptions, runtime: &str, i: usize) -> String {
    // Unset: a VM without a NIC, as docs/performance.md's first figures were measured (the
    // process and Docker tasks take the default `outbound`).
    let mode = match (opts.network_mode, runtime) {
        (Some(mode), _) => Some(mode.to_string()),
        (None, "kvm") => Some("isolated".to_owned()),
        (None, _) => None,
    };
    let mut network = mode
        .map(|m| format!("  network_mode: {m}\n"))
        .unwrap_or_default();
    if runtime == "kvm" {
        network.push_str("  memory: 512Mi\n");
    }
    format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: start-bench-{i}\nrepository:\n  url: {}\n  \
         branch: {}\nagent:\n  prompt: start and stop\n  provider: script\n  script: \"true\"\n\
         vm:\n  runtime: {runtime}\n{network}",
        opts.repository, opts.branch
    )
}

async fn wait_end(client: &SquadronClient, task: TaskId) -> anyhow::Result<Task> {
    let start = Instant::now();
    loop {
        let t = client.get_task(task, Consistency::Stale).await?;
        if t.state.is_terminal() {
            return Ok(t);
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_millis(TASK_DEADLINE_MS),
            "task {task} did not end within {TASK_DEADLINE_MS} ms (it is {})",
            t.state
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

pub fn render(r: &StartBenchReport) -> String {
    let mut t = Table::new(&[
        "runtime", "span", "tasks", "failed", "p50_ms", "p99_ms", "max_ms",
    ]);
    for rt in &r.runtimes {
        let spans = [
            ("submit → READY", &rt.submit_to_ready),
            ("submit → RUNNING", &rt.submit_to_running),
        ];
        let phases = rt.phases.iter().map(|p| (p.phase.as_str(), &p.latency));
        for (span, s) in spans.into_iter().chain(phases) {
            t.row(vec![
                rt.runtime.clone(),
                span.into(),
                s.count.to_string(),
                rt.failed.to_string(),
                format!("{:.0}", s.p50_ms),
                format!("{:.0}", s.p99_ms),
                format!("{:.0}", s.max_ms),
            ]);
        }
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use squadron_core::manifest::NetworkMode;

    fn opts(network_mode: Option<NetworkMode>) -> StartBenchOptions {
        StartBenchOptions {
            runtimes: vec!["process".into(), "kvm".into()],
            tasks: 1,
            repository: "/srv/repo".into(),
            branch: "main".into(),
            network_mode,
        }
    }

    #[test]
    fn the_network_mode_applies_to_every_runtime_and_kvm_defaults_to_isolated() {
        assert!(!manifest(&opts(None), "process", 0).contains("network_mode"));
        assert!(manifest(&opts(None), "kvm", 0).contains("network_mode: isolated"));
        let outbound = opts(Some(NetworkMode::Outbound));
        for runtime in ["process", "docker", "kvm"] {
            let yaml = manifest(&outbound, runtime, 3);
            assert!(yaml.contains("  network_mode: outbound\n"), "{yaml}");
            let parsed = squadron_core::manifest::parse_manifest_yaml(&yaml);
            assert!(parsed.is_ok(), "{yaml}: {parsed:?}");
        }
    }

    #[test]
    fn a_bad_network_mode_is_refused_naming_the_flag() {
        assert_eq!(
            network_mode(Some("gateway")).unwrap(),
            Some(NetworkMode::Gateway)
        );
        assert_eq!(network_mode(None).unwrap(), None);
        let e = network_mode(Some("bridged\nx: 1")).unwrap_err().to_string();
        assert!(e.contains("--network-mode"), "{e}");
    }

    #[test]
    fn a_start_splits_into_its_phases_by_the_leader_s_stamps() {
        let stamps = std::collections::BTreeMap::from([
            (TaskState::Staging, 1_010),
            (TaskState::Provisioning, 1_060),
            (TaskState::Ready, 1_100),
            (TaskState::Running, 1_130),
        ]);
        let at = |s: TaskState| stamps.get(&s).copied();
        assert_eq!(
            phase_ms(1_000, at),
            vec![Some(10), Some(50), Some(40), Some(30)]
        );
        // A phase whose end was never stamped is left out, not counted as zero.
        let partial = |s: TaskState| (s == TaskState::Staging).then_some(1_010);
        assert_eq!(phase_ms(1_000, partial), vec![Some(10), None, None, None]);
    }
}
