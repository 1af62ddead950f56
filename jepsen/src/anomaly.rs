//! One thing a checker found wrong.

use serde::{Deserialize, Serialize};

/// What kind of violation an anomaly is; the names are those of `results.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnomalyKind {
    /// No linearization of a key's operations satisfies its sequential model.
    NonLinearizable,
    /// INV-3: an acquisition granted a generation other than the expected one plus one.
    Inv3GenerationJump,
    /// INV-3: two successful acquisitions of one profile got the same generation.
    Inv3DuplicateGeneration,
    /// INV-5: more slot holders than `max_active` at one instant of real time.
    Inv5OverCapacity,
    /// INV-6: a generation that was replaced, or whose lease ran out while its worker was
    /// paused, committed a capsule: two writers.
    Inv6DualWriter,
    /// INV-7: two capsules at one sequence, or a capsule that does not extend its predecessor.
    Inv7Fork,
    /// INV-11: a keyed write sent again got another answer than its first, or its key was
    /// refused as reused by the very same request.
    Inv11ReplayDiffers,
    /// An acknowledged write missing from the final state.
    LostWrite,
    /// INV-12: nodes that applied the same index report different state digests.
    DigestDivergence,
    /// The nodes' applied indexes never became equal in the quiet phase.
    ReplicasNotConverged,
    /// After the last heal, no write succeeded within the stated bound.
    UnavailableAfterHeal,
    /// The replicated clock ran further ahead of real time than the cluster clock's slew
    /// allows: a skewed wall clock reached the stamps.
    ClockJump,
    /// Evidence a verdict needs (the worker's broker counters) could not be read.
    EvidenceMissing,
    /// The history itself could not be read as the model expects.
    MalformedHistory,
}

/// One violation, with the operations (invoke indexes) that show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomaly {
    pub kind: AnomalyKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub message: String,
    #[serde(default)]
    pub ops: Vec<u64>,
}

impl Anomaly {
    pub fn new(
        kind: AnomalyKind,
        key: Option<&str>,
        message: impl Into<String>,
        ops: Vec<u64>,
    ) -> Self {
        Self {
            kind,
            key: key.map(str::to_string),
            message: message.into(),
            ops,
        }
    }
}
