//! Polls every node's applied index and state digest while the workload runs, so INV-12 is
//! checked mid-run too: two nodes (or one node before and after a restart) at the same
//! applied index must hold the same state, whatever the faults did in between.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use squadron_client::{Consistency, SquadronClient};

use crate::node_final::NodeFinal;

/// How often every node is asked.
pub const DIGEST_SAMPLE_INTERVAL_MS: u64 = 2_000;
/// Samples kept at most (a 1-hour run at 5 nodes needs 9,000).
pub const DIGEST_SAMPLES_MAX: usize = 20_000;

/// A running sampler; `finish` stops it and returns what it saw.
#[derive(Debug)]
pub struct DigestSampler {
    samples: Arc<Mutex<Vec<NodeFinal>>>,
    task: tokio::task::JoinHandle<()>,
}

impl DigestSampler {
    /// Starts polling `nodes` (id, REST URL) through `client`'s credentials.
    pub fn start(client: SquadronClient, nodes: Vec<(u64, String)>) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let sink = samples.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(DIGEST_SAMPLE_INTERVAL_MS));
            loop {
                tick.tick().await;
                for (id, url) in &nodes {
                    // A down, paused or partitioned node simply yields no sample.
                    let Ok(s) = client
                        .with_endpoints(vec![url.clone()])
                        .cluster_status(Consistency::Stale)
                        .await
                    else {
                        continue;
                    };
                    let mut all = sink.lock().unwrap_or_else(|p| p.into_inner());
                    if all.len() < DIGEST_SAMPLES_MAX {
                        all.push(NodeFinal::answered(*id, s));
                    }
                }
            }
        });
        Self { samples, task }
    }

    pub fn finish(self) -> Vec<NodeFinal> {
        self.task.abort();
        let mut all = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *all)
    }
}

#[cfg(test)]
mod tests {
    use crate::anomaly::AnomalyKind;
    use crate::invariants::digest_divergence;
    use crate::node_final::NodeFinal;

    fn sample(id: u64, applied: Option<u64>, digest: &str) -> NodeFinal {
        NodeFinal {
            id,
            applied,
            digest: Some(digest.into()),
            snapshot: None,
            purged: None,
            error: None,
        }
    }

    #[test]
    fn samples_at_one_index_must_agree_across_nodes_and_restarts() {
        let agreeing = [
            sample(1, Some(10), "a"),
            sample(2, Some(10), "a"),
            sample(3, Some(12), "b"),
            sample(3, None, "ignored"),
        ];
        assert!(digest_divergence(&agreeing, "mid-run").is_empty());
        // Node 2 seen twice at index 10 with two states: after a restart it rebuilt another.
        let restarted = [
            sample(2, Some(10), "a"),
            sample(1, Some(11), "c"),
            sample(2, Some(10), "z"),
        ];
        let found = digest_divergence(&restarted, "mid-run");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].kind, AnomalyKind::DigestDivergence);
        assert!(
            found[0].message.contains("mid-run, at applied index 10"),
            "{found:?}"
        );
    }
}
