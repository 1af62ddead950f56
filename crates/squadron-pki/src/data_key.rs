//! The cluster data key (INV-13): credential values are sealed under it before they are
//! proposed, so the Raft log, snapshots and RocksDB hold ciphertext only. Every control node
//! holds the same key in `pki/data.key` (0600), written by `squadron init`.
//!
//! ChaCha20-Poly1305 from `ring` (already the TLS stack's provider) with a random 96-bit
//! nonce per value: a cluster seals a few thousand values per key, far below the bound where
//! random nonces could repeat. The credential id is the associated data, so a sealed value
//! copied under another id does not open.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest as _, Sha256};
use squadron_core::credential::{SealedSecret, DATA_KEY_ID_HEX_LEN};
use squadron_core::ids::CredentialId;
use squadron_core::limits::CREDENTIAL_VALUE_BYTES_MAX;
use zeroize::Zeroizing;

use crate::error::PkiError;
use crate::pki_dir::{read_secret_file, write_file, PkiDir, SECRET_FILE_MODE};

/// The key's file in a node's `pki/`.
pub const DATA_KEY_FILE_NAME: &str = "data.key";
/// Length of the key.
pub const DATA_KEY_BYTES: usize = 32;

/// The cluster's data key and its public id.
pub struct DataKey {
    key: LessSafeKey,
    id: String,
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataKey").field("id", &self.id).finish()
    }
}

impl DataKey {
    /// A new random key, with the hex text its file holds.
    pub fn generate() -> Result<(DataKey, Zeroizing<String>), PkiError> {
        let mut bytes = Zeroizing::new([0u8; DATA_KEY_BYTES]);
        SystemRandom::new()
            .fill(bytes.as_mut())
            .map_err(|_| PkiError::DataKey("the system random source failed".into()))?;
        let text = Zeroizing::new(hex::encode(bytes.as_ref()));
        Ok((DataKey::from_bytes(bytes.as_ref())?, text))
    }

    /// The key from its file's text: 64 hex digits.
    pub fn from_hex(text: &str) -> Result<DataKey, PkiError> {
        let bytes = Zeroizing::new(
            hex::decode(text.trim())
                .map_err(|_| PkiError::DataKey("the key file is not hex".into()))?,
        );
        if bytes.len() != DATA_KEY_BYTES {
            return Err(PkiError::DataKey(format!(
                "the key must be {DATA_KEY_BYTES} bytes, the file holds {}",
                bytes.len()
            )));
        }
        DataKey::from_bytes(&bytes)
    }

    fn from_bytes(bytes: &[u8]) -> Result<DataKey, PkiError> {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, bytes)
            .map_err(|_| PkiError::DataKey("unusable key".into()))?;
        let mut hash = Sha256::new();
        hash.update(b"squadron data key id\0");
        hash.update(bytes);
        let id = hex::encode(hash.finalize())[..DATA_KEY_ID_HEX_LEN].to_string();
        Ok(DataKey {
            key: LessSafeKey::new(unbound),
            id,
        })
    }

    /// The node's key, or `None` when its `pki/` has none (a cluster made before credentials).
    pub fn load(pki: &PkiDir) -> Result<Option<DataKey>, PkiError> {
        let path = pki.path().join(DATA_KEY_FILE_NAME);
        if !path.exists() {
            return Ok(None);
        }
        let text = Zeroizing::new(read_secret_file(&path)?);
        DataKey::from_hex(&text).map(Some)
    }

    /// Writes the key's text into a node's `pki/` (0600, atomically).
    pub fn write(pki: &PkiDir, text: &str) -> Result<(), PkiError> {
        let mut line = Zeroizing::new(text.trim().to_string());
        line.push('\n');
        write_file(
            &pki.path().join(DATA_KEY_FILE_NAME),
            line.as_bytes(),
            SECRET_FILE_MODE,
        )
    }

    /// Names the key without revealing it.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn seal(&self, credential: &CredentialId, value: &[u8]) -> Result<SealedSecret, PkiError> {
        if value.is_empty() || value.len() > CREDENTIAL_VALUE_BYTES_MAX {
            return Err(PkiError::DataKey(format!(
                "a value must be 1 to {CREDENTIAL_VALUE_BYTES_MAX} bytes, got {}",
                value.len()
            )));
        }
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| PkiError::DataKey("the system random source failed".into()))?;
        let mut ciphertext = value.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(credential.as_str().as_bytes()),
                &mut ciphertext,
            )
            .map_err(|_| PkiError::DataKey("sealing failed".into()))?;
        Ok(SealedSecret {
            key_id: self.id.clone(),
            nonce: nonce.to_vec(),
            ciphertext,
        })
    }

    pub fn open(
        &self,
        credential: &CredentialId,
        sealed: &SealedSecret,
    ) -> Result<Zeroizing<Vec<u8>>, PkiError> {
        if sealed.key_id != self.id {
            return Err(PkiError::DataKey(format!(
                "credential {credential} is sealed under data key {}, this node holds {}",
                sealed.key_id, self.id
            )));
        }
        let nonce = <[u8; NONCE_LEN]>::try_from(sealed.nonce.as_slice())
            .map_err(|_| PkiError::DataKey("malformed nonce".into()))?;
        let mut buffer = Zeroizing::new(sealed.ciphertext.clone());
        let plain_len = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(credential.as_str().as_bytes()),
                &mut buffer,
            )
            .map_err(|_| {
                PkiError::DataKey(format!("credential {credential} does not open: tampered"))
            })?
            .len();
        buffer.truncate(plain_len);
        Ok(buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cid(s: &str) -> CredentialId {
        CredentialId::new(s).unwrap()
    }

    #[test]
    fn a_value_opens_only_under_its_key_and_its_id() {
        let (key, text) = DataKey::generate().unwrap();
        let sealed = key.seal(&cid("cred_a"), b"sk-live-123").unwrap();
        assert_eq!(
            sealed.nonce.len(),
            squadron_core::credential::SEALED_NONCE_BYTES
        );
        sealed.check("sealed").unwrap();
        assert!(!sealed.ciphertext.windows(11).any(|w| w == b"sk-live-123"));
        let again = DataKey::from_hex(&text).unwrap();
        assert_eq!(again.id(), key.id());
        assert_eq!(
            again.open(&cid("cred_a"), &sealed).unwrap().as_slice(),
            b"sk-live-123"
        );
        let moved = again.open(&cid("cred_b"), &sealed).unwrap_err();
        assert!(moved.to_string().contains("tampered"), "{moved}");
        let mut flipped = sealed.clone();
        flipped.ciphertext[0] ^= 1;
        assert!(again.open(&cid("cred_a"), &flipped).is_err());
        let (other, _) = DataKey::generate().unwrap();
        let e = other.open(&cid("cred_a"), &sealed).unwrap_err().to_string();
        assert!(e.contains(key.id()) && e.contains(other.id()), "{e}");
        // Two seals of one value differ (fresh nonces).
        assert_ne!(key.seal(&cid("cred_a"), b"sk-live-123").unwrap(), sealed);
    }

    #[test]
    fn bad_key_files_and_values_are_refused() {
        assert!(DataKey::from_hex("zz").is_err());
        assert!(DataKey::from_hex(&"ab".repeat(16)).is_err());
        let (key, _) = DataKey::generate().unwrap();
        assert!(key.seal(&cid("cred_a"), b"").is_err());
        let big = vec![b'x'; CREDENTIAL_VALUE_BYTES_MAX + 1];
        assert!(key.seal(&cid("cred_a"), &big).is_err());
    }

    #[test]
    fn the_key_file_is_private_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let pki = PkiDir::new(dir.path());
        assert!(DataKey::load(&pki).unwrap().is_none());
        std::fs::create_dir_all(dir.path()).unwrap();
        let (key, text) = DataKey::generate().unwrap();
        DataKey::write(&pki, &text).unwrap();
        assert_eq!(DataKey::load(&pki).unwrap().unwrap().id(), key.id());
        use std::os::unix::fs::PermissionsExt;
        let path = dir.path().join(DATA_KEY_FILE_NAME);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            DataKey::load(&pki).is_err(),
            "a world-readable key is refused"
        );
    }
}
