//! What a presented certificate says: its SPIFFE identity and validity. Called only on
//! certificates the TLS layer has already verified against the cluster CA.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::PkiError;
use crate::spiffe_id::SpiffeId;

/// The facts of one certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFacts {
    pub identity: SpiffeId,
    /// Serial number, hex: what a revocation names.
    pub serial_hex: String,
    pub not_before_ms: u64,
    pub not_after_ms: u64,
}

impl CertFacts {
    /// Parses a leaf certificate; it must carry exactly one Squadron identity.
    pub fn of_der(der: &[u8]) -> Result<Self, PkiError> {
        let (_, cert) = X509Certificate::from_der(der)
            .map_err(|e| PkiError::Certificate(format!("cannot parse: {e}")))?;
        let mut ids = spiffe_uris(&cert)?.into_iter();
        let identity = match (ids.next(), ids.next()) {
            (Some(id), None) => id.parse::<SpiffeId>()?,
            (None, _) => {
                return Err(PkiError::Identity(
                    "certificate carries no spiffe:// identity".into(),
                ))
            }
            (Some(_), Some(_)) => {
                return Err(PkiError::Identity(
                    "certificate carries more than one spiffe:// identity".into(),
                ))
            }
        };
        let validity = cert.validity();
        Ok(CertFacts {
            identity,
            serial_hex: cert.raw_serial_as_string().replace(':', ""),
            not_before_ms: secs_to_ms(validity.not_before.timestamp()),
            not_after_ms: secs_to_ms(validity.not_after.timestamp()),
        })
    }
}

fn spiffe_uris(cert: &X509Certificate<'_>) -> Result<Vec<String>, PkiError> {
    let san = cert
        .subject_alternative_name()
        .map_err(|e| PkiError::Certificate(format!("subject alternative names: {e}")))?;
    Ok(san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(u) if u.starts_with("spiffe://") => Some((*u).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default())
}

fn secs_to_ms(secs: i64) -> u64 {
    u64::try_from(secs).unwrap_or(0).saturating_mul(1_000)
}

/// The first certificate of a PEM text, DER.
pub fn first_cert_der(pem: &str) -> Result<CertificateDer<'static>, PkiError> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .ok_or_else(|| PkiError::Certificate("no CERTIFICATE block in PEM".into()))?
        .map_err(|e| PkiError::Certificate(format!("PEM: {e}")))
}

/// Refuses a certificate that is not a CA (an operator supplying a leaf as "the CA").
pub(crate) fn require_ca(der: &[u8]) -> Result<(), PkiError> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| PkiError::Certificate(format!("cannot parse: {e}")))?;
    match cert.basic_constraints() {
        Ok(Some(bc)) if bc.value.ca => Ok(()),
        _ => Err(PkiError::Certificate(
            "the supplied CA certificate is not a CA (basicConstraints cA is not set)".into(),
        )),
    }
}
