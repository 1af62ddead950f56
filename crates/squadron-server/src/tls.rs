//! A control node's TLS material: the cluster CA and its node certificate from
//! `{data_dir}/pki` (written by `squadron init` or `squadron dev`), the server configuration of
//! each listener, and the clients it dials with — to other nodes (any node certificate) and to
//! workers (exactly the worker's certificate, one cached client per worker).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::{ClientConfig, ServerConfig};
use squadron_core::ids::WorkerId;
use squadron_pki::{
    client_config, server_config, ClientAuth, ExpectedPeer, PkiDir, PkiError, SpiffeId,
    TlsConnector, TlsIdentity, NODE_CERT_NAME,
};

/// How long to wait for a worker to accept a connection (relays).
pub const WORKER_CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Relay clients kept at once; beyond it the cache starts over (workers come and go).
pub const WORKER_CLIENTS_MAX: usize = 1_024;

/// Everything TLS a node serves and dials with.
pub struct NodeTls {
    pub identity: TlsIdentity,
    /// The cluster data key credential values are sealed under (INV-13); `None` on a node
    /// whose `pki/` has no `data.key` (made before credentials existed).
    pub data_key: Option<squadron_pki::DataKey>,
    workers: Mutex<BTreeMap<WorkerId, reqwest::Client>>,
    /// The Raft network's channels to the other nodes, forgotten at a reload.
    raft_channels: squadron_raft::PeerChannels,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls")
            .field("identity", &self.identity.identity)
            .finish_non_exhaustive()
    }
}

impl NodeTls {
    /// Loads `ca.pem`, `node.pem` and `node.key` from the node's PKI directory; the
    /// certificate must name this node.
    pub fn load(dir: &PkiDir, node_id: u64) -> Result<Self, PkiError> {
        let identity = TlsIdentity::load(dir, NODE_CERT_NAME)?;
        if identity.identity != SpiffeId::Node(node_id) {
            return Err(PkiError::Identity(format!(
                "{} holds the certificate of {}, this is node {node_id}",
                dir.path().display(),
                identity.identity
            )));
        }
        Ok(NodeTls {
            identity,
            data_key: squadron_pki::DataKey::load(dir)?,
            workers: Mutex::new(BTreeMap::new()),
            raft_channels: squadron_raft::PeerChannels::default(),
        })
    }

    /// The REST listener: client certificates optional (operators use bearer tokens).
    pub fn rest_server(&self) -> Result<Arc<ServerConfig>, PkiError> {
        server_config(
            &self.identity.trust,
            &self.identity.cert,
            ClientAuth::Optional,
        )
    }

    /// The gRPC API and peer listeners: a certificate of the cluster CA required.
    pub fn mtls_server(&self) -> Result<Arc<ServerConfig>, PkiError> {
        server_config(
            &self.identity.trust,
            &self.identity.cert,
            ClientAuth::Required,
        )
    }

    /// Dialing another node: this node's certificate, any node's expected.
    pub fn peer_client(&self) -> Result<ClientConfig, PkiError> {
        client_config(
            &self.identity.trust,
            ExpectedPeer::AnyNode,
            Some(&self.identity.cert),
        )
    }

    /// The connector Raft's gRPC channels dial with.
    pub fn peer_connector(&self) -> Result<TlsConnector, PkiError> {
        Ok(TlsConnector::new(self.peer_client()?))
    }

    /// Raft's network: one channel per peer, dialled with [`NodeTls::peer_connector`].
    pub fn raft_network(&self) -> Result<squadron_raft::GrpcNetworkFactory, PkiError> {
        Ok(squadron_raft::GrpcNetworkFactory::new(
            self.peer_connector()?,
            self.raft_channels.clone(),
        ))
    }

    /// The HTTP client of relays to `worker`: only that worker's certificate is accepted, so
    /// a registration naming someone else's address reaches nobody.
    pub fn worker_client(&self, worker: &WorkerId) -> Result<reqwest::Client, PkiError> {
        let mut cache = self
            .workers
            .lock()
            .map_err(|_| PkiError::Tls("worker client cache poisoned".into()))?;
        if let Some(c) = cache.get(worker) {
            return Ok(c.clone());
        }
        let config = client_config(
            &self.identity.trust,
            ExpectedPeer::Exactly(SpiffeId::Worker(worker.clone())),
            Some(&self.identity.cert),
        )?;
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(config)
            .connect_timeout(Duration::from_millis(WORKER_CONNECT_TIMEOUT_MS))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| PkiError::Tls(e.to_string()))?;
        if cache.len() >= WORKER_CLIENTS_MAX {
            cache.clear();
        }
        cache.insert(worker.clone(), client.clone());
        Ok(client)
    }

    /// Reads the certificate files again (rotation): new connections, served and dialed,
    /// present the new certificate. Raft's shared channels to the other nodes are forgotten,
    /// so the next read round or vote dials with it (a connection lives as long as it works).
    pub fn reload(&self) -> Result<(), PkiError> {
        self.identity.reload()?;
        self.raft_channels.forget_all();
        Ok(())
    }

    /// How this node's Raft appends reached its peers (streamed or unary).
    pub fn raft_append_stats(&self) -> &squadron_raft::AppendStats {
        self.raft_channels.append_stats()
    }
}
