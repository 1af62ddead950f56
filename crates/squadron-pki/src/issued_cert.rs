//! A certificate with its private key, as a node, worker or agent holds it.

use std::fmt;

use crate::error::PkiError;
use crate::peer_identity::{first_cert_der, CertFacts};

/// A leaf certificate, its key and the CA that signed it, all PEM. `Debug` hides the key.
#[derive(Clone)]
pub struct IssuedCert {
    pub cert_pem: String,
    key_pem: String,
    pub ca_pem: String,
}

impl IssuedCert {
    pub fn new(cert_pem: String, key_pem: String, ca_pem: &str) -> Self {
        IssuedCert {
            cert_pem,
            key_pem,
            ca_pem: ca_pem.to_owned(),
        }
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Identity and validity of the leaf.
    pub fn facts(&self) -> Result<CertFacts, PkiError> {
        CertFacts::of_der(&first_cert_der(&self.cert_pem)?)
    }
}

impl fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedCert")
            .field("cert_pem_bytes", &self.cert_pem.len())
            .finish_non_exhaustive()
    }
}
