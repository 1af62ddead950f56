//! One party's TLS identity as it lives on disk — the cluster CA it trusts and its own
//! certificate and key in a [`PkiDir`] — loaded once and reloadable in place (rotation), plus
//! the issuing of the certificates `squadron init` and `squadron dev` write.

use std::time::Duration;

use crate::cluster_ca::{CertUse, ClusterCa, SubjectName, NODE_CERT_VALIDITY_DAYS};
use crate::error::PkiError;
use crate::issued_cert::IssuedCert;
use crate::pki_dir::{read_file, PkiDir};
use crate::spiffe_id::SpiffeId;
use crate::tls_config::{ClusterTrust, ReloadableCert};

/// File stem of a control node's certificate and key (`node.pem`, `node.key`).
pub const NODE_CERT_NAME: &str = "node";
/// File stem of a worker's certificate and key (`worker.pem`, `worker.key`).
pub const WORKER_CERT_NAME: &str = "worker";
/// Validity of a worker certificate issued without enrollment (`squadron dev`, tests).
pub const WORKER_CERT_VALIDITY_DAYS: u64 = 30;

/// Names every node and worker certificate carries besides its advertised hosts, so local
/// tools and tests reach it by loopback.
pub const LOOPBACK_NAMES: [&str; 3] = ["127.0.0.1", "localhost", "::1"];

/// A loaded identity: what it trusts and what it presents.
#[derive(Debug, Clone)]
pub struct TlsIdentity {
    pub trust: ClusterTrust,
    pub cert: ReloadableCert,
    pub identity: SpiffeId,
    dir: PkiDir,
    name: String,
}

impl TlsIdentity {
    /// Reads `ca.pem`, `{name}.pem` and `{name}.key` (which must be 0600) from `dir`.
    pub fn load(dir: &PkiDir, name: &str) -> Result<Self, PkiError> {
        Self::load_with_ca(dir, name, None)
    }

    /// [`load`](Self::load), trusting `ca_pem` instead of the directory's `ca.pem` when given
    /// (a worker started with `--cacert`).
    pub fn load_with_ca(dir: &PkiDir, name: &str, ca_pem: Option<&str>) -> Result<Self, PkiError> {
        let issued = match ca_pem {
            Some(ca) => IssuedCert::new(
                read_file(&dir.cert(name))?,
                crate::pki_dir::read_secret_file(&dir.key(name))?,
                ca,
            ),
            None => dir.read_identity(name)?,
        };
        let trust = ClusterTrust::from_ca_pem(&issued.ca_pem)?;
        let cert = ReloadableCert::new(&trust, &issued)?;
        Ok(TlsIdentity {
            trust,
            cert,
            identity: issued.facts()?.identity,
            dir: dir.clone(),
            name: name.to_owned(),
        })
    }

    /// Reads the certificate files again and swaps them in: new handshakes (served and
    /// dialed) present the new certificate, open connections keep theirs. The identity must
    /// stay the same.
    pub fn reload(&self) -> Result<(), PkiError> {
        let issued = IssuedCert::new(
            read_file(&self.dir.cert(&self.name))?,
            crate::pki_dir::read_secret_file(&self.dir.key(&self.name))?,
            "",
        );
        let identity = issued.facts()?.identity;
        if identity != self.identity {
            return Err(PkiError::Identity(format!(
                "the new certificate is {identity}, this process is {}",
                self.identity
            )));
        }
        self.cert.reload(&issued)
    }

    pub fn dir(&self) -> &PkiDir {
        &self.dir
    }
}

/// The CA kept in `dir` (`ca.pem`, `ca.key`).
pub fn load_ca(dir: &PkiDir) -> Result<ClusterCa, PkiError> {
    let cert = read_file(&dir.ca_cert())?;
    let key = crate::pki_dir::read_secret_file(&dir.ca_key())?;
    ClusterCa::from_pem(&cert, &key)
}

/// A control node's certificate: `spiffe://squadron.local/node/{id}`, the hosts of its
/// advertised addresses and the loopback names, server and client use.
pub fn issue_node_cert(
    ca: &ClusterCa,
    node_id: u64,
    advertised: &[String],
) -> Result<IssuedCert, PkiError> {
    let mut names: Vec<SubjectName> = Vec::new();
    let loopback = LOOPBACK_NAMES.iter().map(|h| h.to_string());
    for host in advertised.iter().cloned().chain(loopback) {
        let name = SubjectName::of_host(&host);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    ca.issue(
        &SpiffeId::Node(node_id),
        &names,
        Duration::from_secs(NODE_CERT_VALIDITY_DAYS * 24 * 3_600),
        CertUse::ServerAndClient,
    )
}

/// A worker's certificate without enrollment (`squadron dev`, the test harness): its
/// identity, the loopback names, server and client use (it serves its output listener).
pub fn issue_worker_cert(
    ca: &ClusterCa,
    worker: &squadron_core::ids::WorkerId,
) -> Result<IssuedCert, PkiError> {
    let names: Vec<SubjectName> = LOOPBACK_NAMES
        .iter()
        .map(|h| SubjectName::of_host(h))
        .collect();
    ca.issue(
        &SpiffeId::Worker(worker.clone()),
        &names,
        Duration::from_secs(WORKER_CERT_VALIDITY_DAYS * 24 * 3_600),
        CertUse::ServerAndClient,
    )
}

/// File, in the initialising node's PKI directory, naming the first admin token by id and
/// hash (`{id} {sha256 hex}`): `squadron init` writes it, the node proposes it once.
pub const ADMIN_TOKEN_HASH_FILE: &str = "admin-token.hash";

/// The first admin token as the initialising node learns it (never the secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminTokenRecord {
    pub id: String,
    pub hash: crate::secret_token::TokenHash,
}

impl AdminTokenRecord {
    pub fn of(token: &crate::secret_token::SecretToken) -> Self {
        AdminTokenRecord {
            id: token.id().to_owned(),
            hash: token.hash(),
        }
    }

    pub fn write(&self, dir: &PkiDir) -> Result<(), PkiError> {
        let path = dir.path().join(ADMIN_TOKEN_HASH_FILE);
        std::fs::create_dir_all(dir.path()).map_err(|e| PkiError::io(dir.path(), e))?;
        let text = format!("{} {}\n", self.id, self.hash.to_hex());
        crate::pki_dir::write_file(&path, text.as_bytes(), crate::pki_dir::SECRET_FILE_MODE)
    }

    /// `None` when the file is absent (any node but the initialiser).
    pub fn read(dir: &PkiDir) -> Result<Option<Self>, PkiError> {
        let path = dir.path().join(ADMIN_TOKEN_HASH_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let text = read_file(&path)?;
        let (id, hash) = text
            .trim()
            .split_once(' ')
            .ok_or_else(|| PkiError::Token(format!("{}: expected `id hash`", path.display())))?;
        Ok(Some(AdminTokenRecord {
            id: id.to_owned(),
            hash: crate::secret_token::TokenHash::from_hex(hash)?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret_token::{SecretToken, TokenKind};

    #[test]
    fn a_node_identity_loads_reloads_and_refuses_another_identity() {
        let dir = tempfile::tempdir().unwrap();
        let pki = PkiDir::new(dir.path().join("pki"));
        let (ca, key) = ClusterCa::generate("t").unwrap();
        pki.write_ca(ca.cert_pem(), &key).unwrap();
        let first = issue_node_cert(&ca, 3, &["node3.example:8211".into()]).unwrap();
        pki.write_identity(NODE_CERT_NAME, &first).unwrap();
        let loaded = TlsIdentity::load(&pki, NODE_CERT_NAME).unwrap();
        assert_eq!(loaded.identity, SpiffeId::Node(3));
        assert_eq!(load_ca(&pki).unwrap().cert_pem(), ca.cert_pem());

        let rotated = issue_node_cert(&ca, 3, &[]).unwrap();
        assert_ne!(
            rotated.facts().unwrap().serial_hex,
            first.facts().unwrap().serial_hex
        );
        pki.write_identity(NODE_CERT_NAME, &rotated).unwrap();
        loaded.reload().unwrap();

        let other = issue_node_cert(&ca, 4, &[]).unwrap();
        pki.write_identity(NODE_CERT_NAME, &other).unwrap();
        let refused = loaded.reload().unwrap_err().to_string();
        assert!(refused.contains("node/4"), "{refused}");
    }

    #[test]
    fn the_admin_token_record_keeps_the_hash_only() {
        let dir = tempfile::tempdir().unwrap();
        let pki = PkiDir::new(dir.path());
        assert_eq!(AdminTokenRecord::read(&pki).unwrap(), None);
        let token = SecretToken::generate(TokenKind::Operator);
        AdminTokenRecord::of(&token).write(&pki).unwrap();
        let back = AdminTokenRecord::read(&pki).unwrap().unwrap();
        assert_eq!(back.id, token.id());
        assert!(back.hash.matches(&token));
        let text = std::fs::read_to_string(dir.path().join(ADMIN_TOKEN_HASH_FILE)).unwrap();
        let secret = token.expose().rsplit('_').next().unwrap().to_owned();
        assert!(!text.contains(&secret), "the secret reached the file");
    }
}
