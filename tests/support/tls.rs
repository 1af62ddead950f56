//! The harness's trust material: one cluster CA per test process (every test cluster's
//! nodes get certificates from it through `squadron init --ca-cert/--ca-key`), the admin token
//! of each cluster by REST address, worker certificates issued without enrollment, and the
//! TLS clients every helper uses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use squadron_client::Credentials;
use squadron_core::ids::WorkerId;
use squadron_pki::{
    client_config, issue_worker_cert, ClusterCa, ClusterTrust, ExpectedPeer, PkiDir,
    ReloadableCert, SpiffeId, SubjectName, TlsIdentity, WORKER_CERT_NAME,
};

/// The node identity the harness presents when it talks to a worker's output server
/// directly (a listener that admits only nodes). No cluster has a node with this id.
pub const HARNESS_NODE_ID: u64 = 999;

pub struct TestPki {
    /// Kept for the life of the process: nodes and workers read these files.
    _dir: tempfile::TempDir,
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    ca: ClusterCa,
    pub trust: ClusterTrust,
    /// A client configuration without a certificate, checking host names (an operator).
    pub operator: Arc<rustls::ClientConfig>,
    /// A client configuration presenting the harness's node certificate.
    pub as_node: Arc<rustls::ClientConfig>,
    tokens: Mutex<BTreeMap<String, String>>,
    /// Client configurations presenting a certificate of the test CA, by SPIFFE id.
    presenting: Mutex<BTreeMap<String, Arc<rustls::ClientConfig>>>,
    /// Nodes with a CA of their own (`squadron dev` makes one): the client configuration
    /// trusting it, by REST `host:port`.
    foreign: Mutex<BTreeMap<String, Arc<rustls::ClientConfig>>>,
}

fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

/// HTTP/1.1 only: ureq and tungstenite speak nothing else.
fn http1(mut config: rustls::ClientConfig) -> Arc<rustls::ClientConfig> {
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

pub fn pki() -> &'static TestPki {
    static PKI: OnceLock<TestPki> = OnceLock::new();
    PKI.get_or_init(|| {
        let dir = tempfile::tempdir().expect("pki dir");
        let (ca, key) = ClusterCa::generate("tests").expect("CA");
        let ca_cert = dir.path().join("ca.pem");
        let ca_key = dir.path().join("ca.key");
        squadron_pki::pki_dir::write_file(&ca_cert, ca.cert_pem().as_bytes(), 0o644).expect("ca");
        squadron_pki::pki_dir::write_file(&ca_key, key.as_bytes(), 0o600).expect("ca key");
        let trust = ClusterTrust::from_ca_pem(ca.cert_pem()).expect("trust");
        let node = ca
            .issue(
                &SpiffeId::Node(HARNESS_NODE_ID),
                &[SubjectName::of_host("127.0.0.1")],
                std::time::Duration::from_secs(24 * 3600),
                squadron_pki::CertUse::ServerAndClient,
            )
            .expect("harness cert");
        let node = ReloadableCert::new(&trust, &node).expect("harness cert");
        let operator =
            http1(client_config(&trust, ExpectedPeer::ServerName, None).expect("operator"));
        let as_node =
            http1(client_config(&trust, ExpectedPeer::ServerName, Some(&node)).expect("node"));
        TestPki {
            _dir: dir,
            ca_cert,
            ca_key,
            ca,
            trust,
            operator,
            as_node,
            tokens: Mutex::new(BTreeMap::new()),
            presenting: Mutex::new(BTreeMap::new()),
            foreign: Mutex::new(BTreeMap::new()),
        }
    })
}

impl TestPki {
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// Remembers the admin token of the cluster whose node serves REST at `rest`.
    pub fn register_token(&self, rest: &str, token: &str) {
        self.tokens
            .lock()
            .expect("tokens")
            .insert(rest.to_string(), token.trim().to_string());
    }

    /// The admin token for a URL's `host:port`, if a cluster registered one.
    pub fn token_for(&self, url: &str) -> Option<String> {
        self.tokens
            .lock()
            .expect("tokens")
            .get(authority(url))
            .cloned()
    }

    /// A node with its own CA (a `squadron dev` node), reached at `rest` with `token`.
    pub fn register_foreign(&self, rest: &str, ca_pem: &str, token: &str) {
        let trust = ClusterTrust::from_ca_pem(ca_pem).expect("foreign CA");
        let config = http1(client_config(&trust, ExpectedPeer::ServerName, None).expect("config"));
        self.foreign
            .lock()
            .expect("foreign")
            .insert(rest.to_string(), config);
        self.register_token(rest, token);
    }

    /// The operator client configuration for a URL: the test CA, or the node's own.
    pub fn operator_for(&self, url: &str) -> Arc<rustls::ClientConfig> {
        self.foreign
            .lock()
            .expect("foreign")
            .get(authority(url))
            .cloned()
            .unwrap_or_else(|| self.operator.clone())
    }

    /// Operator credentials for a cluster's REST URLs (its admin token).
    pub fn operator_credentials(&self, url: &str) -> Credentials {
        Credentials::operator(self.ca_pem(), self.token_for(url)).expect("credentials")
    }

    /// A client configuration presenting a certificate for `identity` (a worker's, an
    /// agent's), issued by the test CA without enrollment.
    pub fn presenting_id(&self, identity: &SpiffeId) -> Arc<rustls::ClientConfig> {
        let mut cache = self.presenting.lock().expect("presenting");
        cache
            .entry(identity.uri())
            .or_insert_with(|| {
                let cert =
                    ReloadableCert::new(&self.trust, &self.issue_cert(identity)).expect("cert");
                http1(
                    client_config(&self.trust, ExpectedPeer::ServerName, Some(&cert))
                        .expect("config"),
                )
            })
            .clone()
    }

    /// A day-long certificate of the test CA for `identity`, valid for 127.0.0.1.
    fn issue_cert(&self, identity: &SpiffeId) -> squadron_pki::IssuedCert {
        self.ca
            .issue(
                identity,
                &[SubjectName::of_host("127.0.0.1")],
                std::time::Duration::from_secs(24 * 3600),
                squadron_pki::CertUse::ServerAndClient,
            )
            .expect("cert")
    }

    /// Writes a certificate for `identity` into `dir` (as `name.pem`/`name.key`, with the CA)
    /// and loads it: what an enrolled agent or worker would hold.
    pub fn issue_identity(&self, identity: &SpiffeId, dir: &Path, name: &str) -> TlsIdentity {
        let pki = PkiDir::new(dir);
        pki.write_identity(name, &self.issue_cert(identity))
            .expect("cert files");
        TlsIdentity::load(&pki, name).expect("identity")
    }

    /// Writes worker `id`'s certificate and the CA into `dir` (`worker.pem`, `worker.key`,
    /// `ca.pem`): what `squadron worker --cert-dir` reads. The enrollment helper replaces it.
    pub fn issue_worker(&self, id: &str, dir: &Path) -> TlsIdentity {
        let id = WorkerId::new(id).expect("worker id");
        let pki = PkiDir::new(dir);
        let cert = issue_worker_cert(&self.ca, &id).expect("worker cert");
        pki.write_identity(WORKER_CERT_NAME, &cert)
            .expect("worker cert files");
        TlsIdentity::load(&pki, WORKER_CERT_NAME).expect("worker identity")
    }
}

/// A client configuration presenting `identity`'s certificate (HTTP/1.1, host names checked).
pub fn presenting(identity: &TlsIdentity) -> Arc<rustls::ClientConfig> {
    http1(
        client_config(
            &identity.trust,
            ExpectedPeer::ServerName,
            Some(&identity.cert),
        )
        .expect("config"),
    )
}
