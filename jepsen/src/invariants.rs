//! Checks of the design's invariants that need no search: INV-3 (generations), INV-5 (slot
//! holders at any instant, computed conservatively), INV-7 (one chain), acknowledged writes
//! present at the end, and equal replica digests (INV-12).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::anomaly::{Anomaly, AnomalyKind};
use crate::node_final::NodeFinal;
use crate::operation::{Completion, Operation};

/// The slot limit of the projects the workloads create (the core's default).
pub const MAX_ACTIVE_DEFAULT: u32 = 4;

/// The part of a key before its `/`: the workload (and project) it belongs to.
pub fn key_family(key: &str) -> &str {
    key.split('/').next().unwrap_or(key)
}

fn u64_of(v: &Value, name: &str) -> Option<u64> {
    v.get(name).and_then(Value::as_u64)
}

fn str_of<'a>(v: &'a Value, name: &str) -> Option<&'a str> {
    v.get(name).and_then(Value::as_str)
}

/// An acknowledged append: digest, previous digest, invoke index, completion time.
type AckedCapsule<'a> = (&'a str, Option<&'a str>, u64, f64);

fn is_final_read(op: &Operation) -> bool {
    op.input.get("final").and_then(Value::as_bool) == Some(true)
}

/// The invariant checks, configured with the projects' slot limit.
#[derive(Debug, Clone, Copy)]
pub struct InvariantChecker {
    pub max_active: u32,
}

impl Default for InvariantChecker {
    fn default() -> Self {
        Self {
            max_active: MAX_ACTIVE_DEFAULT,
        }
    }
}

impl InvariantChecker {
    /// Runs every check on the operations (and the nodes' final views, when known).
    pub fn check(&self, ops: &[Operation], nodes: Option<&[NodeFinal]>) -> Vec<Anomaly> {
        let mut out = Vec::new();
        out.extend(self.inv3_generations(ops));
        out.extend(self.inv5_capacity(ops));
        out.extend(self.inv6_dual_writers(ops));
        out.extend(self.inv7_chain(ops));
        out.extend(self.lost_writes(ops));
        out.extend(self.inv11_replays(ops));
        if let Some(nodes) = nodes {
            out.extend(self.replica_digests(nodes));
        }
        out
    }

    fn is_lease_key(key: &str) -> bool {
        matches!(key_family(key), "lease" | "capacity" | "expiry")
    }

    /// INV-3: each successful acquisition is exactly one above the generation it expected,
    /// and no two share a generation.
    pub fn inv3_generations(&self, ops: &[Operation]) -> Vec<Anomaly> {
        let mut out = Vec::new();
        let mut granted: BTreeMap<(&str, u64), Vec<u64>> = BTreeMap::new();
        for op in ops.iter().filter(|o| o.f == "acquire" && o.is_ok()) {
            let Some(key) = op.key.as_deref().filter(|k| Self::is_lease_key(k)) else {
                continue;
            };
            let (Some(expected), Some(generation)) = (
                u64_of(&op.input, "expected"),
                u64_of(&op.output, "generation"),
            ) else {
                continue;
            };
            if expected.checked_add(1) != Some(generation) {
                out.push(Anomaly::new(
                    AnomalyKind::Inv3GenerationJump,
                    Some(key),
                    format!("acquire expecting generation {expected} was granted {generation}"),
                    vec![op.invoke_index],
                ));
            }
            granted
                .entry((key, generation))
                .or_default()
                .push(op.invoke_index);
        }
        for ((key, generation), idx) in granted {
            if idx.len() > 1 {
                out.push(Anomaly::new(
                    AnomalyKind::Inv3DuplicateGeneration,
                    Some(key),
                    format!(
                        "{} successful acquisitions were granted generation {generation}",
                        idx.len()
                    ),
                    idx,
                ));
            }
        }
        out
    }

    /// INV-5, conservatively: a lease surely holds its slot from the acknowledgement of its
    /// acquisition to the invocation of the first release of it that may have worked (or the
    /// end). More than `max_active` such intervals of one project overlapping is a violation
    /// whatever the unknown outcomes were.
    pub fn inv5_capacity(&self, ops: &[Operation]) -> Vec<Anomaly> {
        let mut releases: BTreeMap<(&str, u64), f64> = BTreeMap::new();
        // A release or reap evidence ends a slot; an expiry alone never does (a fenced lease
        // holds its slot until reaped).
        for op in ops
            .iter()
            .filter(|o| (o.f == "release" || o.f == "reap") && o.completion != Completion::Fail)
        {
            let (Some(key), Some(g)) = (op.key.as_deref(), u64_of(&op.input, "generation")) else {
                continue;
            };
            let end = releases.entry((key, g)).or_insert(op.invoke_ms);
            *end = end.min(op.invoke_ms);
        }
        // Per project: (time, +1 start / -1 end, op).
        let mut points: BTreeMap<&str, Vec<(f64, i32, u64)>> = BTreeMap::new();
        for op in ops.iter().filter(|o| o.f == "acquire" && o.is_ok()) {
            let (Some(key), Some(g), Some(start)) = (
                op.key.as_deref(),
                u64_of(&op.output, "generation"),
                op.complete_ms,
            ) else {
                continue;
            };
            if !Self::is_lease_key(key) {
                continue;
            }
            let end = releases.get(&(key, g)).copied().unwrap_or(f64::INFINITY);
            if end <= start {
                continue;
            }
            let p = points.entry(key_family(key)).or_default();
            p.push((start, 1, op.invoke_index));
            p.push((end, -1, op.invoke_index));
        }
        let mut out = Vec::new();
        for (project, mut p) in points {
            // Ends before starts at one instant: the conservative reading.
            p.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let mut holders: BTreeSet<u64> = BTreeSet::new();
            for (t, delta, op) in p {
                if delta > 0 {
                    holders.insert(op);
                } else {
                    holders.remove(&op);
                }
                if holders.len() > self.max_active as usize {
                    out.push(Anomaly::new(
                        AnomalyKind::Inv5OverCapacity,
                        Some(project),
                        format!(
                            "{} leases surely held slots at {t:.1} ms; the limit is {}",
                            holders.len(),
                            self.max_active
                        ),
                        holders.iter().copied().collect(),
                    ));
                    break;
                }
            }
        }
        out
    }

    /// INV-7: one chain per profile. Successful appends never share a sequence with different
    /// digests, each extends the digest of the successful append before it, and the final
    /// chain read links up and holds every acknowledged capsule it still keeps.
    pub fn inv7_chain(&self, ops: &[Operation]) -> Vec<Anomaly> {
        let mut out = Vec::new();
        let mut by_seq: BTreeMap<&str, BTreeMap<u64, Vec<AckedCapsule>>> = BTreeMap::new();
        for op in ops.iter().filter(|o| o.f == "append" && o.is_ok()) {
            let (Some(key), Some(seq), Some(digest)) = (
                op.key.as_deref(),
                u64_of(&op.output, "sequence"),
                str_of(&op.output, "digest"),
            ) else {
                continue;
            };
            by_seq
                .entry(key)
                .or_default()
                .entry(seq)
                .or_default()
                .push((
                    digest,
                    str_of(&op.input, "previous"),
                    op.invoke_index,
                    op.complete_ms.unwrap_or(f64::INFINITY),
                ));
        }
        for (key, seqs) in &by_seq {
            for (seq, commits) in seqs {
                let digests: BTreeSet<&str> = commits.iter().map(|c| c.0).collect();
                if digests.len() > 1 {
                    out.push(Anomaly::new(
                        AnomalyKind::Inv7Fork,
                        Some(key),
                        format!(
                            "{} different capsules were acknowledged at sequence {seq}",
                            digests.len()
                        ),
                        commits.iter().map(|c| c.2).collect(),
                    ));
                }
                let Some(before) = seq.checked_sub(1).and_then(|s| seqs.get(&s)) else {
                    continue;
                };
                for (_, previous, idx, _) in commits {
                    if let Some(prev_commit) = before.iter().find(|b| Some(b.0) != *previous) {
                        out.push(Anomaly::new(
                            AnomalyKind::Inv7Fork,
                            Some(key),
                            format!(
                                "capsule {seq} extends {previous:?}, not the acknowledged capsule {} ({})",
                                seq - 1,
                                prev_commit.0
                            ),
                            vec![prev_commit.2, *idx],
                        ));
                    }
                }
            }
        }
        for op in ops.iter().filter(|o| o.f == "chain" && o.is_ok()) {
            let Some(key) = op.key.as_deref() else {
                continue;
            };
            let Some(list) = op.output.get("capsules").and_then(Value::as_array) else {
                continue;
            };
            for pair in list.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                let linked = u64_of(a, "sequence").and_then(|s| s.checked_add(1))
                    == u64_of(b, "sequence")
                    && str_of(a, "digest").is_some()
                    && str_of(a, "digest") == str_of(b, "previous");
                if !linked {
                    out.push(Anomaly::new(
                        AnomalyKind::Inv7Fork,
                        Some(key),
                        format!("the final chain does not link: {a} then {b}"),
                        vec![op.invoke_index],
                    ));
                }
            }
            let kept: BTreeMap<u64, &str> = list
                .iter()
                .filter_map(|c| Some((u64_of(c, "sequence")?, str_of(c, "digest")?)))
                .collect();
            let first_kept = kept.keys().next().copied().unwrap_or(u64::MAX);
            for (seq, commits) in by_seq.get(key).into_iter().flatten() {
                for (digest, _, idx, done_ms) in commits {
                    // Only capsules acknowledged before the read began must be in it.
                    if *seq < first_kept || *done_ms > op.invoke_ms {
                        continue;
                    }
                    if kept.get(seq) != Some(digest) {
                        out.push(Anomaly::new(
                            AnomalyKind::LostWrite,
                            Some(key),
                            format!(
                                "acknowledged capsule {seq} ({digest}) is not in the final chain (found {:?})",
                                kept.get(seq)
                            ),
                            vec![*idx, op.invoke_index],
                        ));
                    }
                }
            }
        }
        out
    }

    /// INV-11: a keyed write sent again (`replay`) gets its first answer back, and no keyed
    /// write is refused as a reused key (each key is only ever sent with its own request).
    pub fn inv11_replays(&self, ops: &[Operation]) -> Vec<Anomaly> {
        let mut out = Vec::new();
        for op in ops {
            let Some(key) = op.key.as_deref().filter(|k| key_family(k) == "keyed") else {
                continue;
            };
            if op.output["error"] == "idempotency_key_reused" {
                out.push(Anomaly::new(
                    AnomalyKind::Inv11ReplayDiffers,
                    Some(key),
                    format!(
                        "a resend of the same request was refused as a reused key: {}",
                        op.output
                    ),
                    vec![op.invoke_index],
                ));
            }
            if op.f != "replay" || !op.is_ok() {
                continue;
            }
            let (first, again) = (&op.input["answer"], &op.output["answer"]);
            if first != again {
                out.push(Anomaly::new(
                    AnomalyKind::Inv11ReplayDiffers,
                    Some(key),
                    format!(
                        "write {} answered {first} the first time and {again} when sent again",
                        op.input["idempotency_key"]
                    ),
                    vec![op.invoke_index],
                ));
            }
        }
        out
    }

    /// INV-6: a commit under a fence that is no longer the profile's writer — the generation
    /// a takeover replaced (`stale-commit`), or one whose lease ran out while its worker was
    /// paused (`late-commit` to the control plane, `late-git-commit` through the worker's
    /// broker) — never gets past the fence: it neither succeeds nor meets a refusal that only
    /// comes after the fence check (`chain_broken`; the broker's `head_moved`,
    /// `nothing_to_commit`). An unknown outcome is no evidence either way.
    pub fn inv6_dual_writers(&self, ops: &[Operation]) -> Vec<Anomaly> {
        const PAST_THE_FENCE: [&str; 3] = ["chain_broken", "head_moved", "nothing_to_commit"];
        ops.iter()
            .filter(|o| {
                matches!(
                    o.f.as_str(),
                    "stale-commit" | "late-commit" | "late-git-commit"
                )
            })
            .filter(|o| {
                o.is_ok()
                    || (o.completion == Completion::Fail
                        && o.error().is_some_and(|e| PAST_THE_FENCE.contains(&e)))
            })
            .map(|op| {
                Anomaly::new(
                    AnomalyKind::Inv6DualWriter,
                    op.key.as_deref(),
                    format!(
                        "{} under generation {} (lease {}) got past the fence: {}",
                        op.f,
                        u64_of(&op.input, "generation").unwrap_or(0),
                        u64_of(&op.input, "lease").unwrap_or(0),
                        op.output
                    ),
                    vec![op.invoke_index],
                )
            })
            .collect()
    }

    /// Every acknowledged write is visible to the final read of its key: the final generation,
    /// version or sequence is at least the highest acknowledged one.
    pub fn lost_writes(&self, ops: &[Operation]) -> Vec<Anomaly> {
        let mut highest: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for op in ops.iter().filter(|o| o.is_ok()) {
            let Some(key) = op.key.as_deref() else {
                continue;
            };
            let field = match (key_family(key), op.f.as_str()) {
                ("lease" | "capacity" | "expiry", "acquire") => "generation",
                ("takeover", "launch" | "takeover") => "generation",
                ("cas" | "keyed", "cas") => "version",
                ("capsule", "append") => "sequence",
                _ => continue,
            };
            if let Some(v) = u64_of(&op.output, field) {
                let h = highest.entry(key).or_insert((v, op.invoke_index));
                if v > h.0 {
                    *h = (v, op.invoke_index);
                }
            }
        }
        let mut out = Vec::new();
        for op in ops
            .iter()
            .filter(|o| o.f == "read" && o.is_ok() && is_final_read(o))
        {
            let Some(key) = op.key.as_deref() else {
                continue;
            };
            let field = match key_family(key) {
                "lease" | "capacity" | "expiry" | "takeover" => "generation",
                "cas" | "keyed" => "version",
                "capsule" => "sequence",
                _ => continue,
            };
            let (Some(seen), Some((high, idx))) = (u64_of(&op.output, field), highest.get(key))
            else {
                continue;
            };
            if seen < *high {
                out.push(Anomaly::new(
                    AnomalyKind::LostWrite,
                    Some(key),
                    format!(
                        "the final read saw {field} {seen}, but {field} {high} was acknowledged"
                    ),
                    vec![*idx, op.invoke_index],
                ));
            }
        }
        out
    }

    /// INV-12: nodes at the same applied index hold the same digest, and all reached one index.
    pub fn replica_digests(&self, nodes: &[NodeFinal]) -> Vec<Anomaly> {
        let mut out = Vec::new();
        let answered: Vec<&NodeFinal> = nodes.iter().filter(|n| n.applied.is_some()).collect();
        let applied: BTreeSet<Option<u64>> = answered.iter().map(|n| n.applied).collect();
        if answered.len() < nodes.len() || applied.len() > 1 {
            out.push(Anomaly::new(
                AnomalyKind::ReplicasNotConverged,
                None,
                format!(
                    "nodes did not reach one applied index: {}",
                    nodes
                        .iter()
                        .map(|n| format!(
                            "n{}={:?}{}",
                            n.id,
                            n.applied,
                            n.error
                                .as_deref()
                                .map(|e| format!(" ({e})"))
                                .unwrap_or_default()
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Vec::new(),
            ));
        }
        out.extend(digest_divergence(nodes, "at the end"));
        out
    }
}

/// INV-12 over any set of samples (the end of a run, or polls during it): samples at the same
/// applied index must carry the same digest. Each divergent index is named once.
pub fn digest_divergence(samples: &[NodeFinal], when: &str) -> Vec<Anomaly> {
    let mut by_index: BTreeMap<u64, BTreeMap<&str, BTreeSet<u64>>> = BTreeMap::new();
    for n in samples {
        if let (Some(a), Some(d)) = (n.applied, n.digest.as_deref()) {
            by_index
                .entry(a)
                .or_default()
                .entry(d)
                .or_default()
                .insert(n.id);
        }
    }
    by_index
        .into_iter()
        .filter(|(_, digests)| digests.len() > 1)
        .map(|(index, digests)| {
            Anomaly::new(
                AnomalyKind::DigestDivergence,
                None,
                format!("{when}, at applied index {index} the nodes disagree: {digests:?}"),
                Vec::new(),
            )
        })
        .collect()
}
