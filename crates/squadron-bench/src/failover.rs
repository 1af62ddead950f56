//! `squadron bench failover`: kill -9 of the leader under a lease-cycle load, `trials` times
//! on one cluster (the killed node restarted and back in agreement before the next trial),
//! reporting the time from each kill to the first successful write that started after it,
//! and to a new leader every survivor names, as p50 / p99 / max (DESIGN §7: first write
//! ≤ 1 s p50, ≤ 2 s p99).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::machine::MachineInfo;
use crate::squadron_cluster::{SquadronCluster, STARTUP_TIMEOUT_MS};
use crate::{squadron_failover, squadron_load, version_line};

/// Most trials one run may ask for.
pub const TRIALS_MAX: usize = 1_000;
/// Most clients of the load around each kill.
pub const FAILOVER_CLIENTS_MAX: usize = 256;

#[derive(Debug, Clone)]
pub struct FailoverOptions {
    pub squadron_bin: PathBuf,
    pub nodes: usize,
    pub trials: usize,
    pub clients: usize,
    /// A line per trial on stderr (off for `--output json`).
    pub progress: bool,
    /// Keep the nodes' directories (configs, data, `node.log`) and name them in the report.
    pub keep_work_dir: bool,
}

impl FailoverOptions {
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |field: &'static str, reason: String| BenchError::Options { field, reason };
        if !(3..=crate::NODES_MAX).contains(&self.nodes) {
            return Err(bad(
                "nodes",
                format!(
                    "must be 3..={} (a leader to kill and a majority left)",
                    crate::NODES_MAX
                ),
            ));
        }
        if !(1..=TRIALS_MAX).contains(&self.trials) {
            return Err(bad("trials", format!("must be 1..={TRIALS_MAX}")));
        }
        if !(1..=FAILOVER_CLIENTS_MAX).contains(&self.clients) {
            return Err(bad(
                "clients",
                format!("must be 1..={FAILOVER_CLIENTS_MAX}"),
            ));
        }
        Ok(())
    }
}

/// One kill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailoverTrial {
    pub trial: usize,
    pub killed: String,
    /// Kill → first successful write started after it; `None`: none within the wait.
    pub first_write_ms: Option<f64>,
    /// Kill → every survivor names one new leader (polled every 100 ms).
    pub leader_elected_ms: Option<f64>,
}

/// p50, p99 and max of what the trials measured, and how many measured nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TrialSummary {
    pub measured: usize,
    pub missing: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl TrialSummary {
    /// Nearest-rank percentiles of a handful of samples (an HDR histogram buys nothing here).
    fn of(samples: impl Iterator<Item = Option<f64>>) -> TrialSummary {
        let mut missing = 0;
        let mut values: Vec<f64> = samples
            .filter_map(|s| {
                missing += usize::from(s.is_none());
                s
            })
            .collect();
        values.sort_by(f64::total_cmp);
        let rank = |q: f64| -> f64 {
            let n = values.len();
            if n == 0 {
                return 0.0;
            }
            let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
            values[i]
        };
        TrialSummary {
            measured: values.len(),
            missing,
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            max_ms: values.last().copied().unwrap_or(0.0),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailoverReport {
    pub machine: MachineInfo,
    pub squadron_version: String,
    pub nodes: usize,
    pub clients: usize,
    pub first_write: TrialSummary,
    pub leader_elected: TrialSummary,
    pub trials: Vec<FailoverTrial>,
    /// Where the nodes' directories were kept (`keep_work_dir`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_dir: Option<String>,
}

/// Runs the trials on one cluster under a temporary directory, removed at the end (and the
/// nodes killed), also on error.
pub async fn failover(opts: &FailoverOptions) -> Result<FailoverReport, BenchError> {
    opts.validate()?;
    let dir = tempfile::Builder::new()
        .prefix("squadron-bench-failover")
        .tempdir()
        .map_err(|e| BenchError::io("create a directory in", std::env::temp_dir(), e))?;
    let machine = MachineInfo::probe(dir.path());
    let mut cluster = SquadronCluster::start(&opts.squadron_bin, dir.path(), opts.nodes).await?;
    let endpoints = cluster.endpoints();
    let setup_client = squadron_load::client_for(&endpoints, 0);
    let as_worker = squadron_load::worker_client(&endpoints)?;
    let data = squadron_load::setup(&setup_client, &as_worker, opts.clients).await?;
    let mut trials = Vec::with_capacity(opts.trials);
    for trial in 1..=opts.trials {
        let result = squadron_failover(opts.clients, &mut cluster, &data, &endpoints).await?;
        if opts.progress {
            eprintln!(
                "trial {trial}/{}: {} killed, first write after {}, leader after {}",
                opts.trials,
                result.killed,
                shown(result.recovery_ms),
                shown(result.leader_elected_ms)
            );
        }
        trials.push(FailoverTrial {
            trial,
            killed: result.killed.clone(),
            first_write_ms: result.recovery_ms,
            leader_elected_ms: result.leader_elected_ms,
        });
        let id = result
            .killed
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        cluster.restart(id)?;
        // Every node, the restarted one too, names one leader before the next kill.
        cluster
            .wait_for_leader(Duration::from_millis(STARTUP_TIMEOUT_MS))
            .await?;
    }
    drop(cluster);
    let work_dir = opts.keep_work_dir.then(|| dir.keep().display().to_string());
    Ok(FailoverReport {
        work_dir,
        machine,
        squadron_version: version_line(&opts.squadron_bin),
        nodes: opts.nodes,
        clients: opts.clients,
        first_write: TrialSummary::of(trials.iter().map(|t| t.first_write_ms)),
        leader_elected: TrialSummary::of(trials.iter().map(|t| t.leader_elected_ms)),
        trials,
    })
}

fn shown(ms: Option<f64>) -> String {
    ms.map_or_else(|| "never".to_string(), |ms| format!("{ms:.0} ms"))
}

/// The report as a terminal table.
pub fn render_failover(r: &FailoverReport) -> String {
    let row = |what: &str, s: &TrialSummary| {
        format!(
            "{what:<24} {:>8.0} {:>8.0} {:>8.0} {:>9}\n",
            s.p50_ms,
            s.p99_ms,
            s.max_ms,
            format!("{}/{}", s.measured, s.measured + s.missing)
        )
    };
    let mut out = format!(
        "squadron bench failover — {} nodes, {} clients, {} trials; {} ({} CPUs)\n{}\n\n",
        r.nodes,
        r.clients,
        r.trials.len(),
        r.machine.cpu_model,
        r.machine.cpus,
        r.squadron_version
    );
    out.push_str(&format!(
        "{:<24} {:>8} {:>8} {:>8} {:>9}\n",
        "kill -9 of the leader →", "p50 ms", "p99 ms", "max ms", "measured"
    ));
    out.push_str(&row("first successful write", &r.first_write));
    out.push_str(&row("new leader agreed", &r.leader_elected));
    if let Some(dir) = &r.work_dir {
        out.push_str(&format!("nodes' directories kept in {dir}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_and_missing_trials_are_counted() {
        let s = TrialSummary::of(
            [Some(300.0), None, Some(100.0), Some(200.0), Some(900.0)].into_iter(),
        );
        assert_eq!((s.measured, s.missing), (4, 1));
        assert_eq!((s.p50_ms, s.p99_ms, s.max_ms), (200.0, 900.0, 900.0));
        let none = TrialSummary::of(std::iter::empty());
        assert_eq!((none.measured, none.p50_ms), (0, 0.0));
    }

    #[test]
    fn bad_options_are_refused_naming_the_field() {
        let ok = FailoverOptions {
            squadron_bin: "/bin/true".into(),
            nodes: 3,
            trials: 20,
            clients: 8,
            progress: false,
            keep_work_dir: false,
        };
        ok.validate().unwrap();
        for (field, opts) in [
            (
                "nodes",
                FailoverOptions {
                    nodes: 1,
                    ..ok.clone()
                },
            ),
            (
                "trials",
                FailoverOptions {
                    trials: 0,
                    ..ok.clone()
                },
            ),
            (
                "clients",
                FailoverOptions {
                    clients: 0,
                    ..ok.clone()
                },
            ),
        ] {
            let e = opts.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }
}
