//! The ADR-0011 release gate's claims, each decided by a figure of the evidence: "eight
//! profiles, four-process peak, one sandbox, both takeover kinds, zero dual writers,
//! unauthorized MCP HTTP 403, full roster delivery" and nothing left behind. Pure: `verify`
//! decides them again from a bundle's figures.

use serde::{Deserialize, Serialize};
use squadron_api::agents::{ProjectEvidence, WorkerEvidence};

use crate::cli::soak::report::SoakReport;

/// The ADR's profile count and process cap.
pub const PROFILES_REQUIRED: u32 = 8;
pub const PROCESS_PEAK_REQUIRED: u32 = 4;

/// One claim, whether the evidence proves it, and the figure that decides it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub claim: String,
    pub pass: bool,
    pub figure: String,
}

fn verdict(claim: &str, pass: bool, figure: String) -> Verdict {
    Verdict {
        claim: claim.to_string(),
        pass,
        figure,
    }
}

/// The soak the ADR's gate asks for.
pub const SOAK_HOURS_REQUIRED: u64 = 24;

/// Every claim of the gate, with the soak's when a soak report is embedded.
pub fn all_verdicts(e: &ProjectEvidence, soak: Option<&SoakReport>) -> Vec<Verdict> {
    let mut out = verdicts(e);
    out.extend(soak.map(soak_verdict));
    out
}

/// The soak's claim, decided again from the report's samples (a verdict edited into the
/// report does not count).
pub fn soak_verdict(r: &SoakReport) -> Verdict {
    let v = r.decided();
    let hours = r.duration_ms as f64 / 3_600_000.0;
    verdict(
        "leak-free 24-hour soak",
        v.leak_free && r.duration_ms >= SOAK_HOURS_REQUIRED * 3_600_000,
        format!(
            "duration = {hours:.2} h, cycles = {}, leaks = {}, growth = {}, failed cycles = {}, incomplete samples = {}",
            r.cycles.len(),
            v.leaks.len(),
            v.growth.len(),
            v.cycles_failed.len(),
            v.samples_incomplete.len()
        ),
    )
}

/// Every claim of the gate, in the ADR's order.
pub fn verdicts(e: &ProjectEvidence) -> Vec<Verdict> {
    let mut out = vec![
        verdict(
            "eight profiles",
            e.profiles >= PROFILES_REQUIRED,
            format!("profiles = {}", e.profiles),
        ),
        four_process_peak(e),
        one_build(e),
    ];
    out.extend(worker_claims(e));
    out.push(verdict(
        "both takeover kinds",
        e.takeovers_graceful >= 1 && e.takeovers_crash >= 1,
        format!(
            "graceful = {}, crash = {}",
            e.takeovers_graceful, e.takeovers_crash
        ),
    ));
    out.push(verdict(
        "unauthorized MCP 403",
        e.unauthorized_mcp_denied >= 1,
        format!("denied = {}", e.unauthorized_mcp_denied),
    ));
    out.push(verdict(
        "no lease left open",
        e.leases_not_terminal.is_empty() && e.slots_held_now == 0,
        format!(
            "leases not terminal = {}, slots held now = {}",
            e.leases_not_terminal.len(),
            e.slots_held_now
        ),
    ));
    out
}

fn four_process_peak(e: &ProjectEvidence) -> Verdict {
    let processes = e.worker.as_ref().map(|w| w.peak_concurrent_processes);
    verdict(
        "four-process peak",
        e.max_active == PROCESS_PEAK_REQUIRED
            && e.peak_slots_held == PROCESS_PEAK_REQUIRED
            // Some provider seen running (the worker samples, so it may miss the moment all
            // four ran: the slots are the exact figure), and never more than four.
            && processes.is_some_and(|p| (1..=PROCESS_PEAK_REQUIRED).contains(&p)),
        format!(
            "max_active = {}, peak slots held = {}, peak processes = {}",
            e.max_active,
            e.peak_slots_held,
            processes.map_or("unknown".into(), |p| p.to_string())
        ),
    )
}

/// The claims only the sandbox's worker can prove; each fails without its evidence.
fn worker_claims(e: &ProjectEvidence) -> Vec<Verdict> {
    let claims = [
        "one sandbox",
        "zero dual writers",
        "full roster delivery",
        "nothing left on the host",
    ];
    let Some(w) = &e.worker else {
        let why = format!(
            "no worker evidence: {}",
            e.worker_error
                .as_deref()
                .unwrap_or("the project has no sandbox")
        );
        return claims
            .iter()
            .map(|c| verdict(c, false, why.clone()))
            .collect();
    };
    vec![
        verdict(
            claims[0],
            w.sandboxes == 1,
            format!("sandboxes = {}", w.sandboxes),
        ),
        verdict(
            claims[1],
            w.broker.accepted_from_non_current == 0 && w.broker.commits_accepted >= 1,
            format!(
                "commits accepted from a non-current writer = {} (of {}; {} raced their own \
                 lease's end with no newer generation)",
                w.broker.accepted_from_non_current,
                w.broker.commits_accepted,
                w.broker.ended_during_commit
            ),
        ),
        roster_delivery(e, w),
        verdict(
            claims[3],
            w.cgroup_leaves_left.is_empty()
                && w.credential_files_left.is_empty()
                && w.processes_now == 0,
            format!(
                "cgroup leaves = {}, credential files = {}, processes = {}",
                w.cgroup_leaves_left.len(),
                w.credential_files_left.len(),
                w.processes_now
            ),
        ),
    ]
}

/// The member name of the binary that gathered the evidence (`squadron evidence` itself).
pub const GATHERER: &str = "evidence binary";

/// "Immutable build/deploy digest equality": every node, every live worker and the binary that
/// gathered the evidence reported the same SHA-256 of its running binary. A member that
/// reported none fails the claim.
fn one_build(e: &ProjectEvidence) -> Verdict {
    let d = &e.build_digests;
    let nodes = d.iter().filter(|b| b.member.starts_with("node ")).count();
    let workers = d.iter().filter(|b| b.member.starts_with("worker ")).count();
    let gatherer = d.iter().any(|b| b.member == GATHERER);
    let missing: Vec<&str> = d
        .iter()
        .filter(|b| b.sha256.is_empty())
        .map(|b| b.member.as_str())
        .collect();
    let mut distinct: Vec<&str> = d
        .iter()
        .filter(|b| !b.sha256.is_empty())
        .map(|b| b.sha256.as_str())
        .collect();
    distinct.sort_unstable();
    distinct.dedup();
    let figure = if !missing.is_empty() {
        format!("no digest from {}", missing.join(", "))
    } else if distinct.len() > 1 {
        let each: Vec<String> = d
            .iter()
            .map(|b| format!("{} {}", b.member, short(&b.sha256)))
            .collect();
        format!("{} builds: {}", distinct.len(), each.join(", "))
    } else {
        format!(
            "{nodes} nodes, {workers} workers and the {} run {}",
            if gatherer {
                GATHERER
            } else {
                "unrecorded evidence binary"
            },
            distinct.first().map_or("nothing", |s| short(s))
        )
    };
    verdict(
        "one build",
        nodes >= 1 && workers >= 1 && gatherer && missing.is_empty() && distinct.len() == 1,
        figure,
    )
}

fn short(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}

fn roster_delivery(e: &ProjectEvidence, w: &WorkerEvidence) -> Verdict {
    verdict(
        "full roster delivery",
        e.roster_deltas_posted >= 1 && w.roster_deltas_delivered >= 1,
        format!(
            "roster deltas posted = {}, delivered into mailboxes = {}",
            e.roster_deltas_posted, w.roster_deltas_delivered
        ),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use squadron_api::agents::{BrokerEvidence, BuildDigest};

    pub(crate) fn passing() -> ProjectEvidence {
        ProjectEvidence {
            tenant: "acme".parse().unwrap(),
            project: "canary".parse().unwrap(),
            profiles: 8,
            max_active: 4,
            peak_slots_held: 4,
            slots_held_now: 0,
            leases_granted: 12,
            takeovers_graceful: 1,
            takeovers_crash: 1,
            roster_deltas_posted: 20,
            leases_not_terminal: vec![],
            unauthorized_mcp_denied: 1,
            sandbox_worker: None,
            worker: Some(WorkerEvidence {
                worker: "w1".into(),
                sandboxes: 1,
                peak_concurrent_processes: 4,
                roster_deltas_delivered: 20,
                broker: BrokerEvidence {
                    commits_accepted: 5,
                    ..BrokerEvidence::default()
                },
                ..WorkerEvidence::default()
            }),
            worker_error: None,
            build_digests: ["node 1", "node 2", "worker w1", GATHERER]
                .map(|member| BuildDigest {
                    member: member.into(),
                    sha256: "ab".repeat(32),
                })
                .to_vec(),
        }
    }

    fn failed(e: &ProjectEvidence) -> Vec<String> {
        verdicts(e)
            .into_iter()
            .filter(|v| !v.pass)
            .map(|v| v.claim)
            .collect()
    }

    #[test]
    fn the_canary_figures_pass_every_claim() {
        let v = verdicts(&passing());
        assert_eq!(v.len(), 10);
        assert!(v.iter().all(|v| v.pass), "{v:#?}");
    }

    #[test]
    fn each_claim_fails_on_its_own_figure() {
        let mut e = passing();
        e.profiles = 7;
        assert_eq!(failed(&e), ["eight profiles"]);
        let mut e = passing();
        e.peak_slots_held = 5;
        assert_eq!(failed(&e), ["four-process peak"]);
        for processes in [0, 5] {
            let mut e = passing();
            e.worker.as_mut().unwrap().peak_concurrent_processes = processes;
            assert_eq!(failed(&e), ["four-process peak"], "{processes} processes");
        }
        let mut e = passing();
        e.takeovers_crash = 0;
        assert_eq!(failed(&e), ["both takeover kinds"]);
        let mut e = passing();
        e.worker.as_mut().unwrap().broker.accepted_from_non_current = 1;
        assert_eq!(failed(&e), ["zero dual writers"]);
        let mut e = passing();
        e.worker.as_mut().unwrap().cgroup_leaves_left = vec!["/sys/fs/cgroup/x".into()];
        assert_eq!(failed(&e), ["nothing left on the host"]);
        let mut e = passing();
        e.unauthorized_mcp_denied = 0;
        assert_eq!(failed(&e), ["unauthorized MCP 403"]);
        let mut e = passing();
        e.build_digests[1].sha256 = "cd".repeat(32);
        assert_eq!(failed(&e), ["one build"]);
        let v = verdicts(&e);
        let build = v.iter().find(|v| v.claim == "one build").unwrap();
        assert!(build.figure.contains("2 builds") && build.figure.contains("node 2 cdcd"));
        let mut e = passing();
        e.build_digests[0].sha256.clear();
        assert_eq!(failed(&e), ["one build"]);
        let mut e = passing();
        e.build_digests.remove(2);
        assert_eq!(failed(&e), ["one build"], "no worker reported");
        let mut e = passing();
        e.build_digests.pop();
        assert_eq!(failed(&e), ["one build"], "the gatherer's own is missing");
        let mut e = passing();
        e.build_digests[3].sha256 = "ef".repeat(32);
        let v = verdicts(&e);
        let build = v.iter().find(|v| v.claim == "one build").unwrap();
        assert!(
            !build.pass && build.figure.contains("evidence binary efef"),
            "another build gathered it: {build:?}"
        );
        // Without the worker's half, every claim only it proves fails, saying why.
        let mut e = passing();
        e.worker = None;
        e.worker_error = Some("worker w1 did not answer".into());
        let v = verdicts(&e);
        let sandbox = v.iter().find(|v| v.claim == "one sandbox").unwrap();
        assert!(!sandbox.pass && sandbox.figure.contains("did not answer"));
        assert_eq!(failed(&e).len(), 5, "{v:#?}");
    }

    fn soak(hours: u64, leaked: bool) -> SoakReport {
        use crate::cli::soak::report::REPORT_FORMAT;
        use crate::cli::soak::sample::{Count, Sample};
        use crate::cli::soak::verdict::{judge, Bounds};
        let mut after = Sample {
            cycle: 1,
            ..Sample::default()
        };
        if leaked {
            after
                .counts
                .insert("cgroup_leaves".into(), Count::of(["g9".to_string()]));
        }
        // The baseline saw the series (a leaf there is judged from it, not from its first
        // sample).
        let mut base = Sample::default();
        base.counts
            .insert("cgroup_leaves".into(), Count::of(Vec::<String>::new()));
        let samples = vec![base, after];
        let bounds = Bounds {
            rss_growth_bytes_max: 1 << 26,
            fd_growth_max: 16,
        };
        SoakReport {
            format: REPORT_FORMAT.into(),
            tenant: "acme".into(),
            project: "soak".into(),
            started_at_ms: 0,
            duration_ms: hours * 3_600_000,
            bounds,
            cycles: vec![],
            verdict: judge(&samples, vec![], &bounds),
            samples,
        }
    }

    #[test]
    fn the_soak_claim_needs_a_full_day_without_leaks_decided_from_the_samples() {
        let claim = |r: &SoakReport| soak_verdict(r);
        assert!(claim(&soak(24, false)).pass);
        let short = claim(&soak(1, false));
        assert!(
            !short.pass && short.figure.contains("duration = 1.00 h"),
            "{short:?}"
        );
        let leaky = claim(&soak(25, true));
        assert!(
            !leaky.pass && leaky.figure.contains("leaks = 1"),
            "{leaky:?}"
        );
        // A verdict edited to pass changes nothing: the claim is decided from the samples.
        let mut edited = soak(25, true);
        edited.verdict.leak_free = true;
        edited.verdict.leaks.clear();
        assert!(!claim(&edited).pass);
        assert_eq!(
            all_verdicts(&passing(), None).len(),
            verdicts(&passing()).len()
        );
        let with = all_verdicts(&passing(), Some(&soak(24, false)));
        assert_eq!(
            with.last().map(|v| v.claim.as_str()),
            Some("leak-free 24-hour soak")
        );
    }
}
