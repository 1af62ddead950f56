//! The cluster CA: it signs every node, worker and agent certificate. Its key lives only on
//! control nodes (0600, under the data directory), never in the replicated state.

use std::net::IpAddr;
use std::time::Duration;

use rand::RngCore;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use time::OffsetDateTime;

use crate::error::PkiError;
use crate::issued_cert::IssuedCert;
use crate::spiffe_id::SpiffeId;

/// How long a new cluster CA is valid.
pub const CA_VALIDITY_DAYS: u64 = 3_650;
/// How long a control node's certificate is valid; rotated by `squadron init --rotate`.
pub const NODE_CERT_VALIDITY_DAYS: u64 = 365;
/// Longest validity the CA signs for an enrolled identity (workers and agents renew).
pub const ENROLLED_CERT_VALIDITY_MS_MAX: u64 = 7 * 24 * 3_600 * 1_000;
/// Shortest validity worth issuing: renewed a third before its end, a 30 s certificate is
/// asked for again every 20 s, already more often than any heartbeat.
pub const ENROLLED_CERT_VALIDITY_MS_MIN: u64 = 30 * 1_000;
/// Backdating of `not_before`, so a peer whose clock is slightly behind accepts a fresh cert.
pub const CLOCK_SKEW_ALLOWANCE_MS: u64 = 5 * 60 * 1_000;
/// Most host names or addresses one certificate carries.
pub const SUBJECT_NAMES_MAX: usize = 16;
/// Largest CSR accepted.
pub const CSR_BYTES_MAX: usize = 16 * 1024;

/// What a certificate is used for, which decides its key usages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertUse {
    /// Serves TLS and dials peers: control nodes and workers (their listener is mTLS).
    ServerAndClient,
    /// Only dials: agents.
    Client,
}

/// The CA as a control node holds it.
pub struct ClusterCa {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa").finish_non_exhaustive()
    }
}

impl ClusterCa {
    /// A new self-signed CA for a cluster.
    pub fn generate(cluster_name: &str) -> Result<(Self, String), PkiError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            format!("squadron cluster CA ({cluster_name})"),
        );
        dn.push(DnType::OrganizationName, "squadron");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(random_serial());
        let now = OffsetDateTime::now_utc();
        params.not_before = now - ms(CLOCK_SKEW_ALLOWANCE_MS);
        params.not_after = now + days(CA_VALIDITY_DAYS);
        let cert = params.self_signed(&key)?;
        let key_pem = key.serialize_pem();
        let ca = ClusterCa {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        };
        Ok((ca, key_pem))
    }

    /// A CA from its certificate and key (an operator may supply their own).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| PkiError::Key(e.to_string()))?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)
            .map_err(|e| PkiError::Certificate(format!("CA certificate: {e}")))?;
        let public = crate::peer_identity::first_cert_der(cert_pem)?;
        crate::peer_identity::require_ca(&public)?;
        Ok(ClusterCa {
            cert_pem: cert_pem.to_owned(),
            issuer,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key, PEM: written only to control nodes' `pki/ca.key` (0600), which
    /// sign enrollments.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A key and certificate for `identity`, made here (control nodes at `init`).
    pub fn issue(
        &self,
        identity: &SpiffeId,
        names: &[SubjectName],
        validity: Duration,
        usage: CertUse,
    ) -> Result<IssuedCert, PkiError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let params = leaf_params(identity, names, validity, usage)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCert::new(
            cert.pem(),
            key.serialize_pem(),
            &self.cert_pem,
        ))
    }

    /// Signs a CSR for an enrolled identity. Only the CSR's public key is used (its signature
    /// proves the caller holds the private key); the identity, names and validity are the
    /// control plane's — whatever the CSR asks for is ignored.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        identity: &SpiffeId,
        names: &[SubjectName],
        validity: Duration,
        usage: CertUse,
    ) -> Result<String, PkiError> {
        if csr_pem.len() > CSR_BYTES_MAX {
            return Err(PkiError::Csr(format!("larger than {CSR_BYTES_MAX} bytes")));
        }
        let validity_ms = u64::try_from(validity.as_millis()).unwrap_or(u64::MAX);
        if !(ENROLLED_CERT_VALIDITY_MS_MIN..=ENROLLED_CERT_VALIDITY_MS_MAX).contains(&validity_ms) {
            return Err(PkiError::Certificate(format!(
                "validity must be {ENROLLED_CERT_VALIDITY_MS_MIN}–{ENROLLED_CERT_VALIDITY_MS_MAX} ms, got {validity_ms}"
            )));
        }
        let csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| PkiError::Csr(e.to_string()))?;
        let ours = CertificateSigningRequestParams {
            params: leaf_params(identity, names, validity, usage)?,
            public_key: csr.public_key,
        };
        Ok(ours.signed_by(&self.issuer)?.pem())
    }
}

/// A DNS name or an address a server certificate is valid for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectName {
    Dns(String),
    Ip(IpAddr),
}

impl SubjectName {
    /// `host` of a `host:port` (or a bare host): an address when it parses as one.
    pub fn of_host(host_port: &str) -> SubjectName {
        let host = match host_port.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => host_port,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match host.parse::<IpAddr>() {
            Ok(ip) => SubjectName::Ip(ip),
            Err(_) => SubjectName::Dns(host.to_owned()),
        }
    }
}

fn leaf_params(
    identity: &SpiffeId,
    names: &[SubjectName],
    validity: Duration,
    usage: CertUse,
) -> Result<CertificateParams, PkiError> {
    if names.len() > SUBJECT_NAMES_MAX {
        return Err(PkiError::Certificate(format!(
            "at most {SUBJECT_NAMES_MAX} subject names, got {}",
            names.len()
        )));
    }
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, identity.uri());
    dn.push(DnType::OrganizationName, "squadron");
    params.distinguished_name = dn;
    let uri = identity
        .uri()
        .try_into()
        .map_err(|_| PkiError::Identity("identity is not an IA5 string".into()))?;
    params.subject_alt_names.push(SanType::URI(uri));
    for name in names {
        params.subject_alt_names.push(match name {
            SubjectName::Ip(ip) => SanType::IpAddress(*ip),
            SubjectName::Dns(d) => SanType::DnsName(
                d.clone()
                    .try_into()
                    .map_err(|_| PkiError::Certificate(format!("bad DNS name {d:?}")))?,
            ),
        });
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = match usage {
        CertUse::ServerAndClient => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        CertUse::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial());
    let now = OffsetDateTime::now_utc();
    params.not_before = now - ms(CLOCK_SKEW_ALLOWANCE_MS);
    params.not_after = now
        + time::Duration::try_from(validity)
            .map_err(|_| PkiError::Certificate("validity too long".into()))?;
    Ok(params)
}

fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    // A positive integer: the top bit clear.
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

fn ms(v: u64) -> time::Duration {
    time::Duration::milliseconds(i64::try_from(v).unwrap_or(i64::MAX))
}

fn days(v: u64) -> time::Duration {
    time::Duration::days(i64::try_from(v).unwrap_or(i64::MAX))
}
