//! What a comparison runs: clusters, client counts, durations, workloads.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::BenchError;

/// Where Debian's `etcd-server` package installs etcd.
pub const ETCD_BIN_DEFAULT: &str = "/usr/bin/etcd";
/// Clients of the failover measurement.
pub const FAILOVER_CLIENTS_DEFAULT: usize = 16;
/// Most clients of one point: each holds a connection to a node and a profile of its own.
pub const CLIENTS_MAX: usize = 4_096;
/// Most nodes per cluster.
pub const NODES_MAX: usize = 7;

/// One closed-loop workload, run the same way on both systems.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Compare-and-swap acquire on the expected generation → heartbeat → release.
    LeaseCycle,
    /// Acquire one of 8 profiles under a 4-slot project limit, then release.
    Capacity,
    /// Linearizable read of a profile.
    Read,
    /// Submit a small task.
    Submit,
}

impl Workload {
    pub const ALL: [Workload; 4] = [
        Workload::LeaseCycle,
        Workload::Capacity,
        Workload::Read,
        Workload::Submit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Workload::LeaseCycle => "lease-cycle",
            Workload::Capacity => "capacity",
            Workload::Read => "read",
            Workload::Submit => "submit",
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Workload {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Workload::ALL
            .into_iter()
            .find(|w| w.as_str() == s.trim())
            .ok_or_else(|| BenchError::Options {
                field: "workloads",
                reason: format!(
                    "unknown workload {s:?}; known: lease-cycle, capacity, read, submit"
                ),
            })
    }
}

/// One of the two systems compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum System {
    Squadron,
    Etcd,
}

impl System {
    pub fn as_str(self) -> &'static str {
        match self {
            System::Squadron => "squadron",
            System::Etcd => "etcd",
        }
    }
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the benchmark talks to etcd: its own gRPC API, as etcd's users do (the default), or
/// its JSON gateway (`/v3/...`), which etcd 3.4 translates to gRPC and calls its own gRPC
/// server with — an extra hop the earlier figures carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EtcdProtocol {
    Grpc,
    Gateway,
}

impl EtcdProtocol {
    /// What reports written before the choice existed used.
    pub fn gateway() -> Self {
        EtcdProtocol::Gateway
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EtcdProtocol::Grpc => "grpc",
            EtcdProtocol::Gateway => "gateway",
        }
    }
}

impl fmt::Display for EtcdProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EtcdProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "grpc" => Ok(EtcdProtocol::Grpc),
            "gateway" => Ok(EtcdProtocol::Gateway),
            other => Err(format!("{other:?}: grpc or gateway")),
        }
    }
}

/// Which node a client sends to first (the rest follow in order, for when it fails).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientRoute {
    /// Every client starts at the leader the cluster agreed on before the run: where
    /// Squadron's agents and workers send (gRPC to the leader), and what a leader-aware client
    /// of either system does. The default.
    Leader,
    /// Client `i` starts at node `i mod n`; a follower passes the write on to the leader
    /// (both systems do), an extra hop for two clients in three.
    Spread,
}

impl ClientRoute {
    /// What reports written before the choice existed used.
    pub fn spread() -> Self {
        ClientRoute::Spread
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ClientRoute::Leader => "leader",
            ClientRoute::Spread => "spread",
        }
    }
}

impl fmt::Display for ClientRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ClientRoute {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "leader" => Ok(ClientRoute::Leader),
            "spread" => Ok(ClientRoute::Spread),
            other => Err(format!("{other:?}: leader or spread")),
        }
    }
}

/// The options of `squadron bench compare`.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareOptions {
    /// Nodes per cluster (both systems).
    pub nodes: usize,
    /// Client counts: one point per workload and count.
    pub clients: Vec<usize>,
    /// Measured time of each point.
    pub duration: Duration,
    /// Unmeasured load before each point (connections, caches).
    pub warmup: Duration,
    pub workloads: Vec<Workload>,
    /// Systems to run (both by default; one alone gives no ratios).
    pub systems: Vec<System>,
    /// Measure failover (kill -9 of the leader under a lease-cycle load).
    pub failover: bool,
    pub failover_clients: usize,
    /// The `squadron` binary that runs the nodes.
    pub squadron_bin: PathBuf,
    pub etcd_bin: PathBuf,
    /// How the load reaches etcd.
    pub etcd_protocol: EtcdProtocol,
    /// Which node each client of either system sends to first.
    pub route: ClientRoute,
    /// Where node directories go (a fresh temporary directory inside it, removed at the end);
    /// the system's temporary directory when `None`.
    pub work_dir: Option<PathBuf>,
    /// Keep the node directories (configs, data, logs) after the run.
    pub keep_work_dir: bool,
    /// Seeds each client's random choices (profiles picked by the capacity workload).
    pub seed: u64,
}

impl CompareOptions {
    /// The defaults, with the given squadron binary.
    pub fn new(squadron_bin: PathBuf) -> Self {
        Self {
            nodes: 3,
            clients: vec![1, 16, 64, 256],
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            workloads: Workload::ALL.to_vec(),
            systems: vec![System::Squadron, System::Etcd],
            failover: true,
            failover_clients: FAILOVER_CLIENTS_DEFAULT,
            squadron_bin,
            etcd_bin: PathBuf::from(ETCD_BIN_DEFAULT),
            etcd_protocol: EtcdProtocol::Grpc,
            route: ClientRoute::Leader,
            work_dir: None,
            keep_work_dir: false,
            seed: 1,
        }
    }

    /// Refuses options that cannot describe a run, naming the field.
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |field: &'static str, reason: String| Err(BenchError::Options { field, reason });
        if self.nodes == 0 || self.nodes > NODES_MAX {
            return bad(
                "nodes",
                format!("must be 1..={NODES_MAX}, got {}", self.nodes),
            );
        }
        if self.clients.is_empty() {
            return bad("clients", "must name at least one client count".into());
        }
        if let Some(c) = self.clients.iter().find(|c| **c == 0 || **c > CLIENTS_MAX) {
            return bad(
                "clients",
                format!("each count must be 1..={CLIENTS_MAX}, got {c}"),
            );
        }
        if self.duration.is_zero() {
            return bad("duration", "must be positive".into());
        }
        if self.systems.is_empty() {
            return bad("systems", "must name squadron, etcd or both".into());
        }
        if self.failover && (self.failover_clients == 0 || self.failover_clients > CLIENTS_MAX) {
            return bad(
                "failover_clients",
                format!("must be 1..={CLIENTS_MAX}, got {}", self.failover_clients),
            );
        }
        if self.failover && self.nodes < 3 {
            return bad(
                "nodes",
                "failover needs at least 3 nodes (a majority must survive the kill)".into(),
            );
        }
        Ok(())
    }

    /// The most clients any point of this run uses (the data set is sized for it).
    pub fn clients_max(&self) -> usize {
        let points = self.clients.iter().copied().max().unwrap_or(1);
        if self.failover {
            points.max(self.failover_clients)
        } else {
            points
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_routes_round_trip_and_a_bad_one_is_named() {
        for r in [ClientRoute::Leader, ClientRoute::Spread] {
            assert_eq!(r.as_str().parse::<ClientRoute>().unwrap(), r);
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
        let err = "random".parse::<ClientRoute>().unwrap_err();
        assert!(
            err.contains("random") && err.contains("leader or spread"),
            "{err}"
        );
        assert_eq!(
            CompareOptions::new(PathBuf::from("/bin/true")).route,
            ClientRoute::Leader
        );
    }

    #[test]
    fn workload_names_round_trip() {
        for w in Workload::ALL {
            assert_eq!(w.as_str().parse::<Workload>().unwrap(), w);
            assert_eq!(serde_json::to_value(w).unwrap(), w.as_str());
        }
        let err = "writes".parse::<Workload>().unwrap_err().to_string();
        assert!(err.contains("workloads") && err.contains("writes"), "{err}");
    }

    #[test]
    fn validation_names_the_field() {
        let good = CompareOptions::new(PathBuf::from("/bin/true"));
        good.validate().unwrap();
        let mut o = good.clone();
        o.clients = vec![1, 0];
        assert!(o.validate().unwrap_err().to_string().contains("clients"));
        let mut o = good.clone();
        o.nodes = 1;
        assert!(o.validate().unwrap_err().to_string().contains("nodes"));
        o.failover = false;
        o.validate().unwrap();
        let mut o = good;
        o.duration = Duration::ZERO;
        assert!(o.validate().unwrap_err().to_string().contains("duration"));
    }
}
