//! The takeover workload's end: every agent stopped, then the project's release evidence read
//! and judged — the worker's broker accepted no commit from a generation that was not the
//! current writer (dual writers 0, INV-6), and no more than `max_active` slots or provider
//! processes were held at once (INV-5).

use std::time::Duration;

use serde_json::{json, Value};
use squadron_api::agents::{ProjectEvidence, StopAgent};
use squadron_client::SquadronClient;

use crate::anomaly::{Anomaly, AnomalyKind};
use crate::workload_context::WorkloadContext;

/// Tries of one stop or of the evidence read.
const ATTEMPTS_MAX: u32 = 20;
/// Pause between those tries.
const RETRY_MS: u64 = 500;

/// Stops every agent, reads the evidence and judges it: what it read, and what is wrong.
pub async fn check(admin: &SquadronClient, ctx: &WorkloadContext) -> (Value, Vec<Anomaly>) {
    for profile in &ctx.profiles {
        for _ in 0..ATTEMPTS_MAX {
            match admin.agent_stop(*profile, &StopAgent::default()).await {
                Ok(_) => break,
                // Nothing to stop (never launched, or already ended): a refusal, not an outage.
                Err(e) if e.code().http_status() < 500 => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(RETRY_MS)).await,
            }
        }
    }
    let mut last = String::new();
    for _ in 0..ATTEMPTS_MAX {
        match admin.project_evidence(&ctx.tenant, &ctx.project).await {
            Ok(e) if e.worker.is_some() => {
                let found = judge(&e);
                return (json!(e), found);
            }
            Ok(e) => last = e.worker_error.unwrap_or_default(),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(RETRY_MS)).await;
    }
    let missing = Anomaly::new(
        AnomalyKind::EvidenceMissing,
        None,
        format!("the worker's evidence could not be read, so dual writers are unproven: {last}"),
        Vec::new(),
    );
    (json!({"error": last}), vec![missing])
}

/// The anomalies the evidence shows.
pub fn judge(e: &ProjectEvidence) -> Vec<Anomaly> {
    let mut out = Vec::new();
    let Some(w) = &e.worker else {
        return out;
    };
    if w.broker.accepted_from_non_current > 0 {
        out.push(Anomaly::new(
            AnomalyKind::Inv6DualWriter,
            None,
            format!(
                "the worker's broker accepted {} commits from generations that were not the \
                 profile's current writer",
                w.broker.accepted_from_non_current
            ),
            Vec::new(),
        ));
    }
    for (what, seen) in [
        ("slot-holding leases", e.peak_slots_held),
        ("provider processes", w.peak_concurrent_processes),
    ] {
        if seen > e.max_active {
            out.push(Anomaly::new(
                AnomalyKind::Inv5OverCapacity,
                None,
                format!(
                    "{seen} {what} at once, more than max_active {}",
                    e.max_active
                ),
                Vec::new(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use squadron_api::agents::WorkerEvidence;

    fn evidence(peak_slots: u32, peak_processes: u32, non_current: u64) -> ProjectEvidence {
        let mut worker = WorkerEvidence {
            peak_concurrent_processes: peak_processes,
            ..WorkerEvidence::default()
        };
        worker.broker.accepted_from_non_current = non_current;
        ProjectEvidence {
            tenant: "jepsen".parse().expect("tenant"),
            project: "takeover".parse().expect("project"),
            profiles: 8,
            max_active: 4,
            peak_slots_held: peak_slots,
            slots_held_now: 0,
            leases_granted: 20,
            takeovers_graceful: 5,
            takeovers_crash: 5,
            roster_deltas_posted: 0,
            leases_not_terminal: Vec::new(),
            unauthorized_mcp_denied: 0,
            sandbox_worker: None,
            worker: Some(worker),
            worker_error: None,
            build_digests: Vec::new(),
        }
    }

    fn kinds(e: &ProjectEvidence) -> Vec<AnomalyKind> {
        judge(e).iter().map(|a| a.kind).collect()
    }

    #[test]
    fn the_evidence_of_one_writer_at_four_slots_passes() {
        assert!(judge(&evidence(4, 4, 0)).is_empty());
    }

    #[test]
    fn a_commit_the_broker_accepted_from_a_non_current_generation_is_a_dual_writer() {
        assert_eq!(kinds(&evidence(4, 4, 1)), vec![AnomalyKind::Inv6DualWriter]);
    }

    #[test]
    fn five_slots_or_five_processes_at_once_are_over_capacity() {
        assert_eq!(
            kinds(&evidence(5, 4, 0)),
            vec![AnomalyKind::Inv5OverCapacity]
        );
        assert_eq!(
            kinds(&evidence(4, 5, 0)),
            vec![AnomalyKind::Inv5OverCapacity]
        );
    }
}
