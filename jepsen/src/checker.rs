//! The whole judgement of a history: per-key linearizability (P-compositionality: a history
//! of independent keys is linearizable iff each key's sub-history is) plus the invariants.

use std::collections::BTreeMap;

use crate::anomaly::{Anomaly, AnomalyKind};
use crate::history::History;
use crate::invariants::{key_family, InvariantChecker};
use crate::model::Model;
use crate::model_capsule::CapsuleChain;
use crate::model_cas::CasRegister;
use crate::model_expiry::ExpiringLease;
use crate::model_lease::LeaseRegister;
use crate::model_project::{ProjectCapacity, PROJECT_KEY};
use crate::model_takeover::TakeoverRegister;
use crate::model_task::TaskLifecycle;
use crate::node_final::NodeFinal;
use crate::operation::{Completion, Operation};
use crate::results::{KeyVerdict, OutcomeCounts, Results, Validity};
use crate::wgl::{TimedStep, Verdict, WglSearch};

/// Runs every checker over a history.
#[derive(Debug, Clone, Copy, Default)]
pub struct Checker {
    pub invariants: InvariantChecker,
    pub search: WglSearch,
}

fn count(c: &mut OutcomeCounts, completion: Completion) {
    c.total += 1;
    match completion {
        Completion::Ok => c.ok += 1,
        Completion::Fail => c.fail += 1,
        Completion::Info => c.info += 1,
    }
}

impl Checker {
    /// Judges a history. `nodes` are the nodes' final views (INV-12), `harness` anomalies the
    /// harness itself observed (writes failing after the heal).
    pub fn check(
        &self,
        history: &History,
        nodes: Option<&[NodeFinal]>,
        harness: Vec<Anomaly>,
    ) -> Results {
        let mut anomalies = harness;
        let ops = match history.operations() {
            Ok(ops) => ops,
            Err(e) => {
                anomalies.push(Anomaly::new(
                    AnomalyKind::MalformedHistory,
                    None,
                    e.to_string(),
                    Vec::new(),
                ));
                Vec::new()
            }
        };
        let mut operations = OutcomeCounts::default();
        let mut by_f: BTreeMap<String, OutcomeCounts> = BTreeMap::new();
        for op in &ops {
            count(&mut operations, op.completion);
            count(by_f.entry(op.f.clone()).or_default(), op.completion);
        }
        let mut keys: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
        for op in &ops {
            if let Some(k) = op.key.as_deref() {
                keys.entry(k).or_default().push(op);
            }
        }
        let mut linearizability = Vec::new();
        let mut unknowns = Vec::new();
        for key in keys_without_final_read(&keys) {
            unknowns.push(format!(
                "{key} has no successful final read: its acknowledged writes cannot be checked"
            ));
        }
        // The capacity workload's profiles share one project's slots: all of them together,
        // as one object, judge the admission and the `held` counts (`model_project.rs`).
        let project_ops: Vec<&Operation> = ops
            .iter()
            .filter(|o| {
                o.key
                    .as_deref()
                    .is_some_and(|k| key_family(k) == "capacity")
            })
            .collect();
        if !project_ops.is_empty() {
            keys.insert(PROJECT_KEY, project_ops);
        }
        let project = ProjectCapacity {
            max_active: u64::from(self.invariants.max_active),
        };
        for (key, key_ops) in keys {
            let verdict = match key_family(key) {
                _ if key == PROJECT_KEY => self.check_key(&project, key, &key_ops, &mut anomalies),
                "lease" | "capacity" => {
                    self.check_key(&LeaseRegister, key, &key_ops, &mut anomalies)
                }
                "cas" | "keyed" => self.check_key(&CasRegister, key, &key_ops, &mut anomalies),
                "expiry" => self.check_key(&ExpiringLease, key, &key_ops, &mut anomalies),
                "capsule" => self.check_key(&CapsuleChain, key, &key_ops, &mut anomalies),
                "tasks" => self.check_key(&TaskLifecycle, key, &key_ops, &mut anomalies),
                "takeover" => self.check_key(&TakeoverRegister, key, &key_ops, &mut anomalies),
                _ => continue,
            };
            if verdict.verdict == "unknown" {
                unknowns.push(format!(
                    "{key}: the linearizability search reached its bound ({} states)",
                    verdict.states
                ));
            }
            linearizability.push(verdict);
        }
        anomalies.extend(self.invariants.check(&ops, nodes));
        anomalies.extend(crate::clock_check::check(history));
        let valid = if !anomalies.is_empty() {
            Validity::Invalid
        } else if !unknowns.is_empty() {
            Validity::Unknown
        } else {
            Validity::Valid
        };
        Results {
            valid,
            operations,
            by_f,
            linearizability,
            anomalies,
            unknowns,
            run: BTreeMap::new(),
        }
    }

    fn check_key<M: Model>(
        &self,
        model: &M,
        key: &str,
        ops: &[&Operation],
        anomalies: &mut Vec<Anomaly>,
    ) -> KeyVerdict {
        let mut steps = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            match model.parse(op) {
                Ok(Some(step)) => steps.push(TimedStep {
                    id: i,
                    step,
                    invoke_ms: op.invoke_ms,
                    complete_ms: op.known_end_ms(),
                }),
                Ok(None) => {}
                Err(e) => anomalies.push(Anomaly::new(
                    AnomalyKind::MalformedHistory,
                    Some(key),
                    e.to_string(),
                    vec![op.invoke_index],
                )),
            }
        }
        let verdict = self.search.check(model, &steps);
        let index_of = |id: usize| ops.get(id).map(|o| o.invoke_index);
        let (name, states) = match &verdict {
            Verdict::Linearizable { states } => ("linearizable", *states),
            Verdict::Unknown { states } => ("unknown", *states),
            Verdict::NotLinearizable {
                deepest,
                prefix,
                blocked,
                state,
            } => {
                let blocked_op = blocked.and_then(|b| ops.get(b));
                let message = format!(
                    "no linearization against the {} model: after {deepest} operations (last: {}) \
                     the state is {state}, and {} cannot take effect",
                    model.name(),
                    prefix
                        .iter()
                        .rev()
                        .take(3)
                        .filter_map(|&i| ops.get(i).map(|o| format!("#{} {}", o.invoke_index, o.f)))
                        .collect::<Vec<_>>()
                        .join(", "),
                    blocked_op
                        .map(|o| format!("#{} {} {} -> {}", o.invoke_index, o.f, o.input, o.output))
                        .unwrap_or_else(|| "the next operation".into())
                );
                let mut shown: Vec<u64> = prefix
                    .iter()
                    .rev()
                    .take(3)
                    .filter_map(|&i| index_of(i))
                    .collect();
                shown.extend(blocked.and_then(index_of));
                anomalies.push(Anomaly::new(
                    AnomalyKind::NonLinearizable,
                    Some(key),
                    message,
                    shown,
                ));
                ("not-linearizable", 0)
            }
        };
        KeyVerdict {
            key: key.to_string(),
            model: model.name().to_string(),
            operations: steps.len(),
            verdict: name.to_string(),
            states,
        }
    }
}

/// The keys of a checked family with no successful final read (the quiet phase's
/// `{"final": true}` read): without it, a lost acknowledged write would go unseen.
fn keys_without_final_read<'a>(keys: &BTreeMap<&'a str, Vec<&Operation>>) -> Vec<&'a str> {
    keys.iter()
        .filter(|(key, _)| {
            matches!(
                key_family(key),
                "lease"
                    | "capacity"
                    | "cas"
                    | "keyed"
                    | "expiry"
                    | "capsule"
                    | "tasks"
                    | "takeover"
            )
        })
        .filter(|(_, ops)| {
            !ops.iter().any(|o| {
                o.f == "read"
                    && o.is_ok()
                    && o.input.get("final").and_then(serde_json::Value::as_bool) == Some(true)
            })
        })
        .map(|(key, _)| *key)
        .collect()
}
