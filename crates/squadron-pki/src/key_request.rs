//! The enrolling side: a fresh key that never leaves the caller, and a CSR that proves it.

use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};

use crate::error::PkiError;
use crate::spiffe_id::SpiffeId;

/// A private key and the CSR to send with a bootstrap token.
pub struct KeyRequest {
    pub csr_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for KeyRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRequest").finish_non_exhaustive()
    }
}

impl KeyRequest {
    /// The CSR names the identity asked for; the CA decides what it grants.
    pub fn new(identity: &SpiffeId) -> Result<Self, PkiError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, identity.uri());
        params.distinguished_name = dn;
        let csr = params.serialize_request(&key)?;
        Ok(KeyRequest {
            csr_pem: csr.pem().map_err(|e| PkiError::Csr(e.to_string()))?,
            key_pem: key.serialize_pem(),
        })
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }
}
