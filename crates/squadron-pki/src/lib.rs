//! Squadron's trust material (DESIGN §5): the cluster CA, certificates whose SPIFFE URI names
//! who holds them, rustls configurations for every listener and dialer, and the tokens
//! operators and enrolling workers present.
//!
//! Map: `spiffe_id` (identities), `cluster_ca` (issue and sign), `key_request` (the enrolling
//! side's key and CSR), `peer_identity` (what a verified certificate says), `tls_config`
//! (server and client configs, rotation), `tls_listener` / `tls_dialer` (serving and dialing),
//! `admission` (node-only listeners), `secret_token` (tokens and their hashes), `data_key`
//! (the cluster key credential values are sealed under), `signing_key` (Ed25519 keys that
//! sign release evidence),
//! `pki_dir` (files on disk).

pub mod admission;
pub mod build_digest;
pub mod cluster_ca;
pub mod data_key;
pub mod error;
pub mod issued_cert;
pub mod key_request;
pub mod peer_identity;
pub mod pki_dir;
pub mod secret_token;
pub mod signing_key;
pub mod spiffe_id;
pub mod tls_config;
pub mod tls_dialer;
pub mod tls_identity;
pub mod tls_listener;

pub use admission::{is_from_node, NodesOnly};
pub use build_digest::{own_binary_sha256, own_binary_sha256_or_empty};
pub use cluster_ca::{CertUse, ClusterCa, SubjectName};
pub use data_key::{DataKey, DATA_KEY_FILE_NAME};
pub use error::PkiError;
pub use issued_cert::IssuedCert;
pub use key_request::KeyRequest;
pub use peer_identity::CertFacts;
pub use pki_dir::PkiDir;
pub use secret_token::{SecretToken, TokenHash, TokenKind};
pub use signing_key::{verify_signature, SigningKey};
pub use spiffe_id::{AgentSubject, SpiffeId};
pub use tls_config::{
    client_config, server_config, ClientAuth, ClusterTrust, ExpectedPeer, ReloadableCert,
};
pub use tls_dialer::{DialError, TlsConnector, UnixTlsConnector, RELAYED_SERVER_NAME};
pub use tls_identity::{
    issue_node_cert, issue_worker_cert, load_ca, AdminTokenRecord, TlsIdentity, LOOPBACK_NAMES,
    NODE_CERT_NAME, WORKER_CERT_NAME,
};
pub use tls_listener::{serve_tls, PeerCert};
