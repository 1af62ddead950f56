//! Binary encodings of commands and responses for the Raft log: one version byte, then
//! bincode 2 (standard configuration, size-limited so corrupt input cannot allocate without
//! bound). Decoding re-validates every id through its constructor.

use sha2::{Digest as _, Sha256};

use crate::access::Subject;
use crate::command::{Command, CommandEnvelope};
use crate::ids::Digest;
use crate::response::Response;

/// Version byte of the current command encoding. Version 2 added the subject of every
/// command; version-1 entries still decode (`legacy.rs`), as `Subject::Legacy`.
pub const LOG_ENCODING_VERSION: u8 = 2;
/// The command encoding before subjects.
pub const LOG_ENCODING_VERSION_V1: u8 = 1;
/// Version byte of the response encoding (responses only grew variants, at the end).
pub const RESPONSE_ENCODING_VERSION: u8 = 1;
/// Largest encoded command or response accepted.
pub const LOG_ENTRY_BYTES_MAX: usize = 4 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("empty input")]
    Empty,
    #[error("unsupported encoding version {found}; this build reads version {supported}")]
    UnsupportedVersion { found: u8, supported: u8 },
    #[error("input of {size} bytes exceeds the {max}-byte limit")]
    TooLarge { size: usize, max: usize },
    #[error("malformed input: {0}")]
    Malformed(String),
    #[error("{0} trailing bytes after the value")]
    TrailingBytes(usize),
}

type Config = bincode::config::Configuration<
    bincode::config::BigEndian,
    bincode::config::Varint,
    bincode::config::Limit<LOG_ENTRY_BYTES_MAX>,
>;

fn config() -> Config {
    bincode::config::standard()
        .with_big_endian()
        .with_limit::<LOG_ENTRY_BYTES_MAX>()
}

pub(crate) fn encode_versioned<T: serde::Serialize>(version: u8, value: &T) -> Vec<u8> {
    let mut out = vec![version];
    // Our types are plain data; encoding can fail only on a bug (an unsupported serde shape).
    let body = bincode::serde::encode_to_vec(value, config())
        .unwrap_or_else(|e| panic!("encoding a core value failed: {e}"));
    out.extend_from_slice(&body);
    out
}

pub(crate) fn decode_versioned<T: serde::de::DeserializeOwned>(
    version: u8,
    bytes: &[u8],
) -> Result<T, CodecError> {
    if bytes.len() > LOG_ENTRY_BYTES_MAX + 1 {
        return Err(CodecError::TooLarge {
            size: bytes.len(),
            max: LOG_ENTRY_BYTES_MAX,
        });
    }
    let (&found, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if found != version {
        return Err(CodecError::UnsupportedVersion {
            found,
            supported: version,
        });
    }
    let (value, used) = bincode::serde::decode_from_slice(body, config())
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(CodecError::TrailingBytes(body.len() - used));
    }
    Ok(value)
}

pub fn encode_command(envelope: &CommandEnvelope) -> Vec<u8> {
    encode_versioned(LOG_ENCODING_VERSION, envelope)
}

/// About how many bytes a command takes in a log entry (for sizing batches; no limit is
/// applied, so this never fails).
pub fn command_encoded_len(command: &Command) -> usize {
    struct Count(usize);
    impl bincode::enc::write::Writer for Count {
        fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
            self.0 += bytes.len();
            Ok(())
        }
    }
    let mut count = Count(0);
    match bincode::serde::encode_into_writer(command, &mut count, bincode::config::standard()) {
        Ok(()) => count.0,
        // Unencodable means a bug; size it as too big to share an entry.
        Err(_) => usize::MAX / 2,
    }
}

/// Decodes the current encoding, or version 1 as a legacy command.
pub fn decode_command(bytes: &[u8]) -> Result<CommandEnvelope, CodecError> {
    if bytes.first() == Some(&LOG_ENCODING_VERSION_V1) {
        let v1: crate::legacy::CommandEnvelopeV1 =
            decode_versioned(LOG_ENCODING_VERSION_V1, bytes)?;
        return Ok(v1.into());
    }
    decode_versioned(LOG_ENCODING_VERSION, bytes)
}

pub fn encode_response(response: &Response) -> Vec<u8> {
    encode_versioned(RESPONSE_ENCODING_VERSION, response)
}

pub fn decode_response(bytes: &[u8]) -> Result<Response, CodecError> {
    decode_versioned(RESPONSE_ENCODING_VERSION, bytes)
}

/// The version byte inside fingerprints. Fixed at 1 whatever the log encoding, so the keys a
/// ledger recorded before a log-encoding change still match their retries.
const FINGERPRINT_VERSION: u8 = 1;

/// SHA-256 of a command's encoding and, since subjects are recorded, of its subject: what an
/// idempotency key is bound to. An old entry's (`Subject::Legacy`) leaves the subject out,
/// so it matches what the ledger recorded then.
pub fn command_fingerprint(subject: &Subject, command: &Command) -> Digest {
    let mut hasher = Sha256::new();
    hasher.update(encode_versioned(FINGERPRINT_VERSION, command));
    if *subject != Subject::Legacy {
        hasher.update(encode_versioned(FINGERPRINT_VERSION, subject));
    }
    Digest::from_bytes(hasher.finalize().into())
}
