//! Ed25519 keys for signing release evidence (`squadron evidence --sign`): the private key as a
//! PKCS#8 PEM file, the public key as one line `ed25519:<64 hex digits>`, signatures as hex.

use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivatePkcs8KeyDer;

use crate::error::PkiError;

/// The prefix of a public key's text form.
pub const PUBLIC_KEY_PREFIX: &str = "ed25519:";
/// An Ed25519 public key and signature, in bytes.
pub const PUBLIC_KEY_BYTES: usize = 32;
pub const SIGNATURE_BYTES: usize = 64;

/// A private signing key.
pub struct SigningKey(Ed25519KeyPair);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("public", &self.public_key_text())
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A new key: its PKCS#8 PEM (to be written 0600) and the key itself.
    pub fn generate() -> Result<(zeroize::Zeroizing<String>, SigningKey), PkiError> {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)
            .map_err(|e| PkiError::Key(format!("generating an Ed25519 key: {e}")))?;
        let pem = zeroize::Zeroizing::new(pair.serialize_pem());
        let key = SigningKey::from_pem(&pem)?;
        Ok((pem, key))
    }

    pub fn from_pem(pem: &str) -> Result<SigningKey, PkiError> {
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| PkiError::Key(format!("not a PKCS#8 PEM private key: {e}")))?;
        Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der())
            .map(SigningKey)
            .map_err(|e| PkiError::Key(format!("not an Ed25519 key: {e}")))
    }

    /// The signature of `message`, hex.
    pub fn sign_hex(&self, message: &[u8]) -> String {
        hex::encode(self.0.sign(message).as_ref())
    }

    pub fn public_key_text(&self) -> String {
        format!(
            "{PUBLIC_KEY_PREFIX}{}",
            hex::encode(self.0.public_key().as_ref())
        )
    }
}

/// Checks `signature_hex` over `message` against the public key in its text form.
pub fn verify_signature(
    public_key_text: &str,
    message: &[u8],
    signature_hex: &str,
) -> Result<(), PkiError> {
    let key = public_key_text
        .trim()
        .strip_prefix(PUBLIC_KEY_PREFIX)
        .and_then(|h| hex::decode(h).ok())
        .filter(|k| k.len() == PUBLIC_KEY_BYTES)
        .ok_or_else(|| {
            PkiError::Key(format!(
                "a public key is {PUBLIC_KEY_PREFIX} and {} hex digits",
                PUBLIC_KEY_BYTES * 2
            ))
        })?;
    let signature = hex::decode(signature_hex.trim())
        .ok()
        .filter(|s| s.len() == SIGNATURE_BYTES)
        .ok_or_else(|| {
            PkiError::Key(format!("a signature is {} hex digits", SIGNATURE_BYTES * 2))
        })?;
    UnparsedPublicKey::new(&ED25519, key)
        .verify(message, &signature)
        .map_err(|_| PkiError::Key("the signature does not match the key and the content".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_for_its_key_and_content() {
        let (pem, key) = SigningKey::generate().unwrap();
        assert!(pem.contains("BEGIN PRIVATE KEY"));
        let again = SigningKey::from_pem(&pem).unwrap();
        assert_eq!(again.public_key_text(), key.public_key_text());
        let sig = key.sign_hex(b"evidence");
        verify_signature(&key.public_key_text(), b"evidence", &sig).unwrap();
        assert!(verify_signature(&key.public_key_text(), b"evidencE", &sig).is_err());
        let (_, other) = SigningKey::generate().unwrap();
        assert!(verify_signature(&other.public_key_text(), b"evidence", &sig).is_err());
        for bad in ["", "ed25519:zz", "rsa:00"] {
            assert!(verify_signature(bad, b"evidence", &sig).is_err(), "{bad}");
        }
        assert!(verify_signature(&key.public_key_text(), b"evidence", "00").is_err());
        assert!(SigningKey::from_pem("not a key").is_err());
    }
}
