//! rustls configurations for every listener and every dialer.
//!
//! A server presents its certificate through a [`ReloadableCert`], so rotation swaps it without
//! a restart. Clients verify a server by chain to the cluster CA and by the identity they expect
//! ([`ExpectedPeer`]) rather than by host name: control nodes and workers are reached by
//! whatever address they advertised, and the identity is what matters. Operator tools that
//! know only a URL use [`ExpectedPeer::ServerName`], the usual host-name check.

use std::sync::{Arc, RwLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ParsedCertificate, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::pem::PemObject;

use crate::error::PkiError;
use crate::issued_cert::IssuedCert;
use crate::peer_identity::CertFacts;
use crate::spiffe_id::SpiffeId;

/// ALPN protocols offered: gRPC needs HTTP/2; REST, browsers and curl may use either.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The cluster CA as a verifier sees it.
#[derive(Debug, Clone)]
pub struct ClusterTrust {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    /// The PEM it was made from, handed on to those who must trust the same CA (the agent of
    /// a sandbox).
    ca_pem: Arc<str>,
}

impl ClusterTrust {
    pub fn from_ca_pem(ca_pem: &str) -> Result<Self, PkiError> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            let cert = cert.map_err(|e| PkiError::Certificate(format!("CA PEM: {e}")))?;
            roots.add(cert)?;
        }
        if roots.is_empty() {
            return Err(PkiError::Certificate("no CA certificate in PEM".into()));
        }
        Ok(ClusterTrust {
            roots: Arc::new(roots),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            ca_pem: Arc::from(ca_pem),
        })
    }

    pub fn provider(&self) -> &Arc<CryptoProvider> {
        &self.provider
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }
}

/// Whether a listener asks for client certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Every client must present a certificate of the cluster CA (peer and worker listeners).
    Required,
    /// Clients may present one (workers, agents) or not (operators with bearer tokens).
    Optional,
}

/// A certificate and key that can be swapped while listeners and dialers keep running.
#[derive(Debug, Clone)]
pub struct ReloadableCert {
    current: Arc<RwLock<Arc<CertifiedKey>>>,
    provider: Arc<CryptoProvider>,
}

impl ReloadableCert {
    pub fn new(trust: &ClusterTrust, cert: &IssuedCert) -> Result<Self, PkiError> {
        let key = certified_key(trust.provider(), cert)?;
        Ok(ReloadableCert {
            current: Arc::new(RwLock::new(Arc::new(key))),
            provider: trust.provider().clone(),
        })
    }

    /// Replaces the certificate; new handshakes use it, open connections keep theirs.
    pub fn reload(&self, cert: &IssuedCert) -> Result<(), PkiError> {
        let key = Arc::new(certified_key(&self.provider, cert)?);
        let mut current = self
            .current
            .write()
            .map_err(|_| PkiError::Tls("certificate lock poisoned".into()))?;
        *current = key;
        Ok(())
    }

    fn get(&self) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|k| k.clone())
    }
}

fn certified_key(provider: &CryptoProvider, cert: &IssuedCert) -> Result<CertifiedKey, PkiError> {
    let chain = CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PkiError::Certificate(format!("certificate PEM: {e}")))?;
    if chain.is_empty() {
        return Err(PkiError::Certificate("no CERTIFICATE block in PEM".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem().as_bytes())
        .map_err(|e| PkiError::Key(format!("private key PEM: {e}")))?;
    Ok(CertifiedKey::from_der(chain, key, provider)?)
}

impl ResolvesServerCert for ReloadableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.get()
    }
}

impl ResolvesClientCert for ReloadableCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.get()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A server configuration for one listener.
pub fn server_config(
    trust: &ClusterTrust,
    cert: &ReloadableCert,
    client_auth: ClientAuth,
) -> Result<Arc<ServerConfig>, PkiError> {
    let verifier =
        WebPkiClientVerifier::builder_with_provider(trust.roots.clone(), trust.provider.clone());
    let verifier = match client_auth {
        ClientAuth::Required => verifier,
        ClientAuth::Optional => verifier.allow_unauthenticated(),
    }
    .build()
    .map_err(|e| PkiError::Tls(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(trust.provider.clone())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(cert.clone()));
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Whom a client expects at the other end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpectedPeer {
    /// Any control node (peer calls, workers and agents dialing the API).
    AnyNode,
    /// Exactly this identity (a control node relaying to one worker).
    Exactly(SpiffeId),
    /// The usual host-name check against the URL's host (operators' tools).
    ServerName,
}

/// A client configuration. `client_cert` is presented when the server asks.
pub fn client_config(
    trust: &ClusterTrust,
    expect: ExpectedPeer,
    client_cert: Option<&ReloadableCert>,
) -> Result<ClientConfig, PkiError> {
    let verifier = Arc::new(IdentityVerifier {
        trust: trust.clone(),
        expect,
    });
    let builder = ClientConfig::builder_with_provider(trust.provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match client_cert {
        Some(cert) => {
            let mut config = builder.with_client_cert_resolver(Arc::new(cert.clone()));
            // A resumed session keeps the client certificate of the session it resumes: after
            // a renewal every new connection would still be the old certificate's, refused
            // once that one ends. Each connection presents the current certificate instead.
            config.resumption = rustls::client::Resumption::disabled();
            config
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// Chain to the cluster CA, then the identity the caller expects.
#[derive(Debug)]
struct IdentityVerifier {
    trust: ClusterTrust,
    expect: ExpectedPeer,
}

impl ServerCertVerifier for IdentityVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.trust.roots,
            intermediates,
            now,
            self.trust.provider.signature_verification_algorithms.all,
        )?;
        let facts =
            CertFacts::of_der(end_entity).map_err(|e| rustls::Error::General(e.to_string()))?;
        let ok = match &self.expect {
            ExpectedPeer::AnyNode => facts.identity.is_node(),
            ExpectedPeer::Exactly(id) => &facts.identity == id,
            ExpectedPeer::ServerName => {
                rustls::client::verify_server_name(&parsed, server_name)?;
                true
            }
        };
        if !ok {
            return Err(rustls::Error::General(format!(
                "the server is {}, not the expected {:?}",
                facts.identity, self.expect
            )));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.trust.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.trust.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.trust
            .provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
