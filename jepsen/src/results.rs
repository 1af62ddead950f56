//! `results.json`: the verdict of a run.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::anomaly::Anomaly;

/// Jepsen's three-valued verdict: `true`, `false`, or `"unknown"` (a search hit its bound and
/// nothing else was wrong).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    Valid,
    Invalid,
    Unknown,
}

impl Serialize for Validity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Validity::Valid => s.serialize_bool(true),
            Validity::Invalid => s.serialize_bool(false),
            Validity::Unknown => s.serialize_str("unknown"),
        }
    }
}

impl<'de> Deserialize<'de> for Validity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Bool(true) => Ok(Validity::Valid),
            serde_json::Value::Bool(false) => Ok(Validity::Invalid),
            serde_json::Value::String(s) if s == "unknown" => Ok(Validity::Unknown),
            other => Err(serde::de::Error::custom(format!(
                "valid must be true, false or \"unknown\", got {other}"
            ))),
        }
    }
}

/// Counts of operations by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeCounts {
    pub total: u64,
    pub ok: u64,
    pub fail: u64,
    pub info: u64,
}

/// The linearizability verdict of one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyVerdict {
    pub key: String,
    pub model: String,
    /// Operations the search considered (after dropping those that say nothing).
    pub operations: usize,
    /// `linearizable`, `not-linearizable` or `unknown`.
    pub verdict: String,
    /// Cache entries the search used.
    pub states: usize,
}

/// The whole verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub valid: Validity,
    pub operations: OutcomeCounts,
    /// Counts per operation name (`acquire`, `read`, …).
    pub by_f: BTreeMap<String, OutcomeCounts>,
    pub linearizability: Vec<KeyVerdict>,
    pub anomalies: Vec<Anomaly>,
    /// Why the verdict is `unknown` rather than `true` (a search bound, a key without a final
    /// read); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknowns: Vec<String>,
    /// Facts about the run that are not violations (the harness's settings, recovery times).
    #[serde(default)]
    pub run: BTreeMap<String, serde_json::Value>,
}

impl Results {
    /// A few lines for a terminal.
    pub fn summary(&self) -> String {
        let o = &self.operations;
        let mut s = format!(
            "valid: {}\noperations: {} (ok {}, fail {}, info {})\n",
            match self.valid {
                Validity::Valid => "true",
                Validity::Invalid => "false",
                Validity::Unknown => "unknown",
            },
            o.total,
            o.ok,
            o.fail,
            o.info
        );
        for (f, c) in &self.by_f {
            s.push_str(&format!(
                "  {f:<10} ok {:>6}  fail {:>6}  info {:>6}\n",
                c.ok, c.fail, c.info
            ));
        }
        let lin = self
            .linearizability
            .iter()
            .filter(|k| k.verdict == "linearizable")
            .count();
        s.push_str(&format!(
            "linearizability: {lin} of {} keys linearizable\n",
            self.linearizability.len()
        ));
        for why in self.unknowns.iter().take(20) {
            s.push_str(&format!("unknown: {why}\n"));
        }
        if self.anomalies.is_empty() {
            s.push_str("anomalies: none\n");
        } else {
            s.push_str(&format!("anomalies: {}\n", self.anomalies.len()));
            for a in self.anomalies.iter().take(20) {
                s.push_str(&format!(
                    "  {:?} {}: {}\n",
                    a.kind,
                    a.key.as_deref().unwrap_or("-"),
                    a.message
                ));
            }
        }
        s
    }
}
