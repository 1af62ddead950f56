//! The encoding of every value this crate writes to disk (log entries, vote, log ids, snapshot
//! metadata): one format byte, then bincode 2 in serde mode with a size limit. Decoding checks
//! the format byte, the limit and trailing bytes, so corrupt data becomes an error value and
//! never a panic or an unbounded allocation.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Format byte of the current value encoding. Bump it when the layout changes, and keep a
/// decoder for the old one. Format 2 changed only log entries (their commands carry a subject);
/// every other value has the same layout in both, so format 1 still decodes for all, and
/// format-1 log entries through [`decode_entry_v1`].
pub const VALUE_FORMAT_VERSION: u8 = 2;
/// The format before commands carried subjects.
pub const VALUE_FORMAT_VERSION_V1: u8 = 1;

/// Largest encoded value accepted. A log entry carries one core command (the core caps those
/// at 4 MiB) or a membership config; the margin leaves room for the entry's own framing.
pub const VALUE_BYTES_MAX: usize = 16 * 1024 * 1024;

type Config = bincode::config::Configuration<
    bincode::config::BigEndian,
    bincode::config::Varint,
    bincode::config::Limit<VALUE_BYTES_MAX>,
>;

fn config() -> Config {
    bincode::config::standard()
        .with_big_endian()
        .with_limit::<VALUE_BYTES_MAX>()
}

/// Why a stored value could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("empty value")]
    Empty,
    #[error("unsupported value format {found}; this build reads format {supported}")]
    UnsupportedFormat { found: u8, supported: u8 },
    #[error("value of {size} bytes exceeds the {max}-byte limit")]
    TooLarge { size: usize, max: usize },
    #[error("malformed value: {0}")]
    Malformed(String),
    #[error("{0} trailing bytes after the value")]
    TrailingBytes(usize),
    #[error("encoding failed: {0}")]
    Encode(String),
}

/// Encodes a value with the format byte in front.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![VALUE_FORMAT_VERSION];
    bincode::serde::encode_into_std_write(value, &mut out, config())
        .map_err(|e| CodecError::Encode(e.to_string()))?;
    if out.len() > VALUE_BYTES_MAX + 1 {
        return Err(CodecError::TooLarge {
            size: out.len(),
            max: VALUE_BYTES_MAX,
        });
    }
    Ok(out)
}

/// Decodes a value written by [`encode`].
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    if bytes.len() > VALUE_BYTES_MAX + 1 {
        return Err(CodecError::TooLarge {
            size: bytes.len(),
            max: VALUE_BYTES_MAX,
        });
    }
    let (&found, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if found != VALUE_FORMAT_VERSION && found != VALUE_FORMAT_VERSION_V1 {
        return Err(CodecError::UnsupportedFormat {
            found,
            supported: VALUE_FORMAT_VERSION,
        });
    }
    decode_body(body)
}

/// The format byte of an encoded value.
pub fn format_of(bytes: &[u8]) -> Option<u8> {
    bytes.first().copied()
}

fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, CodecError> {
    let (value, used) = bincode::serde::decode_from_slice(body, config())
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(CodecError::TrailingBytes(body.len() - used));
    }
    Ok(value)
}

/// A format-1 log entry: openraft's entry layout with a command of log encoding 1 inside,
/// made current with `Subject::Legacy`.
pub fn decode_entry_v1(bytes: &[u8]) -> Result<crate::type_config::Entry, CodecError> {
    use squadron_core::legacy::CommandEnvelopeV1;

    #[derive(serde::Deserialize)]
    struct EntryV1 {
        log_id: crate::type_config::LogId,
        payload: PayloadV1,
    }
    #[derive(serde::Deserialize)]
    enum PayloadV1 {
        Blank,
        Normal(Box<CommandEnvelopeV1>),
        Membership(openraft::Membership<crate::type_config::NodeId, crate::type_config::NodeAddr>),
    }

    let (&found, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if found != VALUE_FORMAT_VERSION_V1 {
        return Err(CodecError::UnsupportedFormat {
            found,
            supported: VALUE_FORMAT_VERSION_V1,
        });
    }
    let v1: EntryV1 = decode_body(body)?;
    Ok(openraft::Entry {
        log_id: v1.log_id,
        payload: match v1.payload {
            PayloadV1::Blank => openraft::EntryPayload::Blank,
            PayloadV1::Normal(c) => openraft::EntryPayload::Normal((*c).into()),
            PayloadV1::Membership(m) => openraft::EntryPayload::Membership(m),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::type_config::{LogId, Vote};

    #[test]
    fn round_trips_and_refuses_garbage() {
        let vote = Vote::new(7, 3);
        let bytes = encode(&vote).unwrap();
        assert_eq!(decode::<Vote>(&bytes).unwrap(), vote);

        assert_eq!(decode::<Vote>(&[]), Err(CodecError::Empty));
        let mut v1 = bytes.clone();
        v1[0] = VALUE_FORMAT_VERSION_V1;
        assert_eq!(decode::<Vote>(&v1).unwrap(), vote, "format 1 still decodes");
        assert!(matches!(
            decode::<Vote>(&[9, 1, 2]),
            Err(CodecError::UnsupportedFormat { found: 9, .. })
        ));
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert_eq!(decode::<Vote>(&trailing), Err(CodecError::TrailingBytes(1)));
        assert!(matches!(
            decode::<LogId>(&[VALUE_FORMAT_VERSION, 0xff]),
            Err(CodecError::Malformed(_))
        ));
    }
}
