//! The encoding of openraft RPCs inside `RaftPayload`: a version byte, then bincode 2 of the
//! serde form, size-limited. Both sides of a connection must speak the same version; a node of
//! another version is refused with a clear error instead of misreading bytes.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Version of the Raft wire encoding. 2: node addresses carry `peer`.
pub const RAFT_WIRE_VERSION: u8 = 2;
/// Largest Raft RPC payload accepted (a batch of entries or a snapshot chunk).
pub const RAFT_PAYLOAD_BYTES_MAX: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("empty raft payload")]
    Empty,
    #[error("raft payload version {found}, this node speaks {supported}")]
    Version { found: u8, supported: u8 },
    #[error("raft payload malformed: {0}")]
    Malformed(String),
    #[error("raft payload could not be encoded: {0}")]
    Encode(String),
}

type Config = bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<RAFT_PAYLOAD_BYTES_MAX>,
>;

fn config() -> Config {
    bincode::config::standard().with_limit::<RAFT_PAYLOAD_BYTES_MAX>()
}

pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    let mut out = vec![RAFT_WIRE_VERSION];
    bincode::serde::encode_into_std_write(value, &mut out, config())
        .map_err(|e| WireError::Encode(e.to_string()))?;
    Ok(out)
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    let (&version, body) = bytes.split_first().ok_or(WireError::Empty)?;
    if version != RAFT_WIRE_VERSION {
        return Err(WireError::Version {
            found: version,
            supported: RAFT_WIRE_VERSION,
        });
    }
    let (value, used) = bincode::serde::decode_from_slice(body, config())
        .map_err(|e| WireError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(WireError::Malformed(format!(
            "{} trailing bytes",
            body.len() - used
        )));
    }
    Ok(value)
}
