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

    /// The certificate's life counted from issue, not from `not_before`, which the CA
    /// backdates by the clock-skew allowance.
    pub fn life_ms(&self) -> u64 {
        let span = self.not_after_ms.saturating_sub(self.not_before_ms);
        match span.checked_sub(crate::cluster_ca::CLOCK_SKEW_ALLOWANCE_MS) {
            Some(issued) if issued > 0 => issued,
            _ => span,
        }
    }

    /// When the holder renews: a third of the certificate's life before its end, so a renewal
    /// that fails has the rest of that third to be asked again.
    pub fn renew_at_ms(&self) -> u64 {
        self.not_after_ms.saturating_sub(self.life_ms() / 3)
    }

    /// Renewal is due once less than a third of the certificate's life remains.
    pub fn renewal_due(&self, now_ms: u64) -> bool {
        now_ms > self.renew_at_ms()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(not_before_ms: u64, not_after_ms: u64) -> CertFacts {
        CertFacts {
            identity: "spiffe://squadron.local/agent/task-1".parse().unwrap(),
            serial_hex: "01".into(),
            not_before_ms,
            not_after_ms,
        }
    }

    #[test]
    fn renewal_is_due_in_the_last_third_of_life() {
        let (start, end) = (1_000, 1_000 + 90_000);
        let f = facts(start, end);
        assert_eq!(f.renew_at_ms(), start + 60_000);
        assert!(!f.renewal_due(start));
        assert!(!f.renewal_due(start + 59_999));
        assert!(f.renewal_due(start + 60_001));
        assert!(f.renewal_due(end + 5), "an ended certificate is due");
        // As the CA issues: not_before backdated; two thirds of the issued life still pass.
        let issued = 10_000_000;
        let skew = crate::cluster_ca::CLOCK_SKEW_ALLOWANCE_MS;
        let backdated = facts(issued - skew, issued + 60_000);
        assert_eq!(backdated.life_ms(), 60_000);
        assert_eq!(backdated.renew_at_ms(), issued + 40_000);
        assert!(!backdated.renewal_due(issued + 1));
    }
}
