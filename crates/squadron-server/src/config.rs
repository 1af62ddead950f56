//! A control node's configuration file (TOML).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use squadron_raft::RaftTimeouts;

use crate::retention_policy::RetentionSettings;

/// Largest configuration file read.
pub const CONFIG_BYTES_MAX: u64 = 1024 * 1024;

/// Most names `server.allowed_hosts` may list.
pub const ALLOWED_HOSTS_MAX: usize = 64;

/// One member of the initial cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    pub id: u64,
    /// `host:port` of the member's REST API.
    pub rest: String,
    /// `host:port` of the member's gRPC API.
    pub grpc: String,
    /// `host:port` of the member's peer listener (Raft, the node-to-node protocol).
    pub peer: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub node_id: u64,
    #[serde(default = "default_cluster_name")]
    pub cluster_name: String,
    pub rest_listen: SocketAddr,
    pub grpc_listen: SocketAddr,
    /// Raft and the node-to-node protocol: mTLS, node certificates only.
    pub peer_listen: SocketAddr,
    /// What other nodes and clients should dial; defaults to the listen addresses.
    #[serde(default)]
    pub advertise_rest: Option<String>,
    #[serde(default)]
    pub advertise_grpc: Option<String>,
    #[serde(default)]
    pub advertise_peer: Option<String>,
    pub data_dir: PathBuf,
    /// The voters a brand-new cluster starts with. Used once: the member with the lowest id
    /// initialises the cluster when its data directory is new. Empty for a node that will be
    /// added later as a learner.
    #[serde(default)]
    pub initial_members: Vec<MemberConfig>,
    #[serde(default)]
    pub raft: RaftTimeouts,
    #[serde(default)]
    pub server: ServerSettings,
    #[serde(default)]
    pub retention: RetentionSettings,
}

/// HTTP and leader-loop settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Largest request body accepted by REST.
    pub body_bytes_max: usize,
    /// How often the leader proposes a sweep (lease expiry, lost workers).
    pub sweep_interval_ms: u64,
    /// How often the leader runs the scheduler.
    pub schedule_interval_ms: u64,
    /// How long a request waits for a leader, a forward or a read index.
    pub request_timeout_ms: u64,
    /// How long a write or a follower's read that arrives while this node knows no leader (an
    /// election under way) waits for the election's outcome before it is refused with 503
    /// "no leader is known" (Consul's `rpc_hold_timeout`). 0 refuses at once.
    pub leader_wait_ms: u64,
    /// Host names (besides IP literals, `localhost` and the node's own listen, advertised
    /// and member addresses) that REST requests may name in `Host`: the names a load
    /// balancer or DNS gives the node. Anything else is refused, which defeats DNS
    /// rebinding from a browser.
    pub allowed_hosts: Vec<String>,
    /// The life of a certificate an agent inside a sandbox enrolls or renews for; the agent
    /// renews it a third before its end for as long as its task runs.
    pub agent_cert_ttl_ms: u64,
}

/// Bounds of `server.agent_cert_ttl_ms`: the shortest life the CA issues (short enough to let
/// tests watch a renewal), and no longer than a day (a leaked agent key is good for at most
/// one certificate life).
pub const AGENT_CERT_TTL_MS_MIN: u64 = squadron_pki::cluster_ca::ENROLLED_CERT_VALIDITY_MS_MIN;
pub const AGENT_CERT_TTL_MS_MAX: u64 = 24 * 3_600 * 1_000;
/// `server.leader_wait_ms` by default: an election takes one to two election timeouts (0.4–0.8
/// s by default), and a node leaderless for longer is most likely cut off from a quorum.
pub const LEADER_WAIT_MS_DEFAULT: u64 = 2_000;
/// The longest `server.leader_wait_ms`: a client should hear back within a minute.
pub const LEADER_WAIT_MS_MAX: u64 = 60_000;

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            body_bytes_max: 1024 * 1024,
            sweep_interval_ms: 1_000,
            schedule_interval_ms: 500,
            request_timeout_ms: 5_000,
            leader_wait_ms: LEADER_WAIT_MS_DEFAULT,
            allowed_hosts: Vec::new(),
            agent_cert_ttl_ms: AGENT_CERT_TTL_MS_MAX,
        }
    }
}

fn default_cluster_name() -> String {
    "squadron".into()
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is larger than {CONFIG_BYTES_MAX} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
}

impl NodeConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let meta = std::fs::metadata(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        if meta.len() > CONFIG_BYTES_MAX {
            return Err(ConfigError::TooLarge { path: path.into() });
        }
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let mut config: NodeConfig = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: e.to_string(),
        })?;
        // A relative data dir is relative to the config file, so configs are portable.
        if config.data_dir.is_relative() {
            if let Some(parent) = path.parent() {
                config.data_dir = parent.join(&config.data_dir);
            }
        }
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field: &str, reason: String| ConfigError::Invalid {
            field: field.into(),
            reason,
        };
        if self.node_id == 0 {
            return Err(invalid("node_id", "must be a positive integer".into()));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, m) in self.initial_members.iter().enumerate() {
            if m.id == 0 || !seen.insert(m.id) {
                return Err(invalid(
                    &format!("initial_members[{i}].id"),
                    format!("must be a positive, unique id, got {}", m.id),
                ));
            }
            for (field, addr) in [("rest", &m.rest), ("grpc", &m.grpc), ("peer", &m.peer)] {
                if addr.parse::<SocketAddr>().is_err() && !addr.contains(':') {
                    return Err(invalid(
                        &format!("initial_members[{i}].{field}"),
                        format!("must be host:port, got {addr:?}"),
                    ));
                }
            }
        }
        if !self.initial_members.is_empty() && !seen.contains(&self.node_id) {
            return Err(invalid(
                "initial_members",
                format!("must include this node ({})", self.node_id),
            ));
        }
        if self.server.body_bytes_max < 1024 {
            return Err(invalid(
                "server.body_bytes_max",
                "must be at least 1024".into(),
            ));
        }
        for (field, v) in [
            ("server.sweep_interval_ms", self.server.sweep_interval_ms),
            (
                "server.schedule_interval_ms",
                self.server.schedule_interval_ms,
            ),
            ("server.request_timeout_ms", self.server.request_timeout_ms),
        ] {
            if !(10..=600_000).contains(&v) {
                return Err(invalid(field, format!("must be 10..=600000 ms, got {v}")));
            }
        }
        if self.server.leader_wait_ms > LEADER_WAIT_MS_MAX {
            return Err(invalid(
                "server.leader_wait_ms",
                format!(
                    "must be 0..={LEADER_WAIT_MS_MAX} ms, got {}",
                    self.server.leader_wait_ms
                ),
            ));
        }
        if !(AGENT_CERT_TTL_MS_MIN..=AGENT_CERT_TTL_MS_MAX).contains(&self.server.agent_cert_ttl_ms)
        {
            return Err(invalid(
                "server.agent_cert_ttl_ms",
                format!(
                    "must be {AGENT_CERT_TTL_MS_MIN}..={AGENT_CERT_TTL_MS_MAX} ms, got {}",
                    self.server.agent_cert_ttl_ms
                ),
            ));
        }
        if self.server.allowed_hosts.len() > ALLOWED_HOSTS_MAX {
            return Err(invalid(
                "server.allowed_hosts",
                format!("at most {ALLOWED_HOSTS_MAX} names"),
            ));
        }
        for (i, host) in self.server.allowed_hosts.iter().enumerate() {
            if host.is_empty() || host.contains(|c: char| c == ':' || c == '/' || c.is_whitespace())
            {
                return Err(invalid(
                    &format!("server.allowed_hosts[{i}]"),
                    format!("must be a bare host name without port, got {host:?}"),
                ));
            }
        }
        if let Some((field, reason)) = self.retention.terminal_tasks.refusal() {
            return Err(invalid(field, reason));
        }
        self.raft
            .to_openraft(&self.cluster_name)
            .map_err(|reason| invalid("raft", reason))?;
        Ok(())
    }

    pub fn rest_addr(&self) -> String {
        self.advertise_rest
            .clone()
            .unwrap_or_else(|| self.rest_listen.to_string())
    }

    pub fn grpc_addr(&self) -> String {
        self.advertise_grpc
            .clone()
            .unwrap_or_else(|| self.grpc_listen.to_string())
    }

    pub fn peer_addr(&self) -> String {
        self.advertise_peer
            .clone()
            .unwrap_or_else(|| self.peer_listen.to_string())
    }

    /// Where the node's CA, certificate and key are (`squadron init` writes them).
    pub fn pki_dir(&self) -> squadron_pki::PkiDir {
        squadron_pki::PkiDir::of_data_dir(&self.data_dir)
    }

    /// A single-node configuration, for `squadron dev`.
    pub fn single_node(
        data_dir: PathBuf,
        rest_listen: SocketAddr,
        grpc_listen: SocketAddr,
        peer_listen: SocketAddr,
    ) -> Self {
        let member = MemberConfig {
            id: 1,
            rest: rest_listen.to_string(),
            grpc: grpc_listen.to_string(),
            peer: peer_listen.to_string(),
        };
        Self {
            node_id: 1,
            cluster_name: default_cluster_name(),
            rest_listen,
            grpc_listen,
            peer_listen,
            advertise_rest: None,
            advertise_grpc: None,
            advertise_peer: None,
            data_dir,
            initial_members: vec![member],
            raft: RaftTimeouts::default(),
            server: ServerSettings::default(),
            retention: RetentionSettings::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> NodeConfig {
        let at = |port| SocketAddr::from(([127, 0, 0, 1], port));
        NodeConfig::single_node("data".into(), at(7001), at(7002), at(7003))
    }

    #[test]
    fn an_agent_certificate_life_out_of_bounds_is_refused_naming_the_field() {
        assert!(config().validate().is_ok());
        for bad in [0, AGENT_CERT_TTL_MS_MIN - 1, AGENT_CERT_TTL_MS_MAX + 1] {
            let mut c = config();
            c.server.agent_cert_ttl_ms = bad;
            let e = c.validate().expect_err("out of bounds").to_string();
            assert!(e.contains("server.agent_cert_ttl_ms"), "{e}");
        }
        let mut c = config();
        c.server.agent_cert_ttl_ms = AGENT_CERT_TTL_MS_MIN;
        assert!(c.validate().is_ok());
    }

    #[test]
    fn a_leader_wait_out_of_bounds_is_refused_naming_the_field() {
        assert_eq!(config().server.leader_wait_ms, LEADER_WAIT_MS_DEFAULT);
        for ok in [0, LEADER_WAIT_MS_MAX] {
            let mut c = config();
            c.server.leader_wait_ms = ok;
            assert!(c.validate().is_ok(), "{ok}");
        }
        let mut c = config();
        c.server.leader_wait_ms = LEADER_WAIT_MS_MAX + 1;
        let e = c.validate().expect_err("out of bounds").to_string();
        assert!(e.contains("server.leader_wait_ms"), "{e}");
    }
}
