//! The soak's report: every cycle, every sample, the bounds and the verdict — written as JSON
//! (`--report FILE`, and what `squadron evidence --soak-report` embeds) and as a table.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use squadron_core::manifest::Keyword as _;

use super::cycle::CycleReport;
use super::sample::Sample;
use super::verdict::{judge, Bounds, SoakVerdict};

/// What a soak report says it is.
pub const REPORT_FORMAT: &str = "squadron-soak/1";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakReport {
    pub format: String,
    pub tenant: String,
    pub project: String,
    pub started_at_ms: u64,
    pub duration_ms: u64,
    pub bounds: Bounds,
    pub cycles: Vec<CycleReport>,
    /// `samples[0]` is the baseline, then one per cycle.
    pub samples: Vec<Sample>,
    pub verdict: SoakVerdict,
}

impl SoakReport {
    /// The verdict as its figures decide it (a report whose verdict differs was edited).
    pub fn decided(&self) -> SoakVerdict {
        judge(&self.samples, failed_cycles(&self.cycles), &self.bounds)
    }
}

pub fn failed_cycles(cycles: &[CycleReport]) -> Vec<u32> {
    cycles
        .iter()
        .filter(|c| !c.errors.is_empty())
        .map(|c| c.cycle)
        .collect()
}

/// The cycle's progress line.
pub fn progress_line(c: &CycleReport, s: &Sample, elapsed_s: u64, total_s: u64) -> String {
    let counts: Vec<String> = s
        .counts
        .iter()
        .map(|(k, v)| format!("{k} {}", v.n))
        .collect();
    let rss_max = s.processes.iter().map(|p| p.rss_bytes).max().unwrap_or(0);
    let tasks: Vec<String> = c
        .tasks
        .iter()
        .map(|t| {
            let state = t.state.map_or("none".into(), |s| format!("{s:?}"));
            format!("{}={state}", t.runtime.as_str())
        })
        .collect();
    format!(
        "cycle {} · {elapsed_s}/{total_s} s · launched {}/{} · takeovers {}+{} · stale commits refused {} · tasks {} · {} · rss max {} MiB{}",
        c.cycle,
        c.launched,
        super::cycle::PROFILES,
        c.takeovers_graceful,
        c.takeovers_crash,
        c.stale_commits_refused,
        if tasks.is_empty() { "none".into() } else { tasks.join(" ") },
        counts.join(", "),
        rss_max >> 20,
        if c.errors.is_empty() {
            String::new()
        } else {
            format!(" · {} error(s): {}", c.errors.len(), c.errors.join("; "))
        }
    )
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// The report for people: the verdict, then what decided it.
pub fn table(r: &SoakReport) -> String {
    let v = &r.verdict;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "soak of {}/{}: {} cycles in {} s — {}",
        r.tenant,
        r.project,
        r.cycles.len(),
        r.duration_ms / 1000,
        if v.leak_free { "LEAK-FREE" } else { "FAILED" }
    );
    for l in &v.leaks {
        let _ = writeln!(
            out,
            "  leak: {} at {} (baseline {}) after {} cycle(s) from cycle {}: {}",
            l.series,
            l.found_max,
            l.baseline,
            l.cycles,
            l.first_cycle,
            l.items.join(", ")
        );
    }
    for g in &v.growth {
        let _ = writeln!(
            out,
            "  growth: {} pid {} {} {} → {} (bound {})",
            g.role, g.pid, g.figure, g.from, g.to, g.bound
        );
    }
    for c in r.cycles.iter().filter(|c| !c.errors.is_empty()) {
        let _ = writeln!(out, "  cycle {} failed: {}", c.cycle, c.errors.join("; "));
    }
    for s in r.samples.iter().filter(|s| !s.errors.is_empty()) {
        let _ = writeln!(
            out,
            "  sample of cycle {} incomplete: {}",
            s.cycle,
            s.errors.join("; ")
        );
    }
    if let (Some(first), Some(last)) = (r.samples.first(), r.samples.last()) {
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::NOTHING).set_header([
            "process",
            "pid",
            "rss MiB (start → end)",
            "fds (start → end)",
        ]);
        for p in &last.processes {
            let before = first.processes.iter().find(|q| q.pid == p.pid);
            t.add_row([
                p.role.clone(),
                p.pid.to_string(),
                format!(
                    "{} → {}",
                    before.map_or("-".into(), |q| (q.rss_bytes >> 20).to_string()),
                    p.rss_bytes >> 20
                ),
                format!(
                    "{} → {}",
                    before.map_or("-".into(), |q| q.open_fds.to_string()),
                    p.open_fds
                ),
            ]);
        }
        let _ = writeln!(out, "{t}");
        for d in &last.dirs {
            let start = first
                .dirs
                .iter()
                .find(|e| e.path == d.path)
                .map_or(0, |e| e.bytes);
            let _ = writeln!(out, "  {}: {} → {}", d.path, mib(start), mib(d.bytes));
        }
    }
    out
}
