//! The encoding of every value this crate writes to disk (log entries, vote, log ids, snapshot
//! metadata): one format byte, then bincode 2 in serde mode with a size limit. Decoding checks
//! the format byte, the limit and trailing bytes, so corrupt data becomes an error value and
//! never a panic or an unbounded allocation.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Format byte of the current value encoding. Bump it when the layout changes, and keep a
/// decoder for the old one. Format 2 changed only log entries (their commands carry a subject);
/// format 3 only memberships (a node's address gained `peer`), found in log entries and
/// snapshot metadata. Every other value has the same layout in all three, so formats 1 and 2
/// still decode for all; log entries of formats 1 and 2 go through [`decode_entry_v1`] and
/// [`decode_entry_v2`], snapshot metadata through [`decode_snapshot_meta`].
pub const VALUE_FORMAT_VERSION: u8 = 3;
/// The format before commands carried subjects.
pub const VALUE_FORMAT_VERSION_V1: u8 = 1;
/// The format before nodes had a peer address.
pub const VALUE_FORMAT_VERSION_V2: u8 = 2;

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
    if ![
        VALUE_FORMAT_VERSION,
        VALUE_FORMAT_VERSION_V2,
        VALUE_FORMAT_VERSION_V1,
    ]
    .contains(&found)
    {
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

/// openraft's entry layout, with the command type `C` of its format and the old membership.
#[derive(serde::Deserialize)]
struct LegacyEntry<C> {
    log_id: crate::type_config::LogId,
    payload: LegacyPayload<C>,
}

#[derive(serde::Deserialize)]
enum LegacyPayload<C> {
    Blank,
    Normal(Box<C>),
    Membership(crate::legacy_addr::MembershipV1),
}

fn decode_legacy_entry<C>(bytes: &[u8], format: u8) -> Result<crate::type_config::Entry, CodecError>
where
    C: DeserializeOwned + Into<squadron_core::CommandEnvelope>,
{
    let (&found, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if found != format {
        return Err(CodecError::UnsupportedFormat {
            found,
            supported: format,
        });
    }
    let old: LegacyEntry<C> = decode_body(body)?;
    Ok(openraft::Entry {
        log_id: old.log_id,
        payload: match old.payload {
            LegacyPayload::Blank => openraft::EntryPayload::Blank,
            LegacyPayload::Normal(c) => openraft::EntryPayload::Normal((*c).into()),
            LegacyPayload::Membership(m) => {
                openraft::EntryPayload::Membership(crate::legacy_addr::membership(m))
            }
        },
    })
}

/// A format-1 log entry: openraft's entry layout with a command of log encoding 1 inside,
/// made current with `Subject::Legacy`; a membership's nodes get `peer` = their old `grpc`.
pub fn decode_entry_v1(bytes: &[u8]) -> Result<crate::type_config::Entry, CodecError> {
    decode_legacy_entry::<squadron_core::legacy::CommandEnvelopeV1>(bytes, VALUE_FORMAT_VERSION_V1)
}

/// A format-2 log entry: current commands; a membership's nodes get `peer` = their old `grpc`.
pub fn decode_entry_v2(bytes: &[u8]) -> Result<crate::type_config::Entry, CodecError> {
    decode_legacy_entry::<squadron_core::CommandEnvelope>(bytes, VALUE_FORMAT_VERSION_V2)
}

/// A log entry of any format this build reads.
pub fn decode_entry(bytes: &[u8]) -> Result<crate::type_config::Entry, CodecError> {
    match format_of(bytes) {
        Some(VALUE_FORMAT_VERSION_V1) => decode_entry_v1(bytes),
        Some(VALUE_FORMAT_VERSION_V2) => decode_entry_v2(bytes),
        _ => decode(bytes),
    }
}

/// Snapshot metadata of any format this build reads (formats 1 and 2: the old membership).
pub fn decode_snapshot_meta(bytes: &[u8]) -> Result<crate::type_config::SnapshotMeta, CodecError> {
    match format_of(bytes) {
        Some(VALUE_FORMAT_VERSION_V1 | VALUE_FORMAT_VERSION_V2) => {
            let (_, body) = bytes.split_first().ok_or(CodecError::Empty)?;
            decode_body::<crate::legacy_addr::SnapshotMetaV1>(body).map(Into::into)
        }
        _ => decode(bytes),
    }
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

    /// A membership entry as format 2 wrote it (nodes without `peer`) reads back with `peer`
    /// set to the old `grpc` address, where Raft ran then.
    #[test]
    fn an_old_membership_gets_its_grpc_address_as_peer() {
        use std::collections::{BTreeMap, BTreeSet};

        #[derive(serde::Serialize)]
        struct OldAddr {
            rest: &'static str,
            grpc: &'static str,
        }
        #[derive(serde::Serialize)]
        struct OldMembership {
            configs: Vec<BTreeSet<u64>>,
            nodes: BTreeMap<u64, OldAddr>,
        }
        #[derive(serde::Serialize)]
        #[allow(dead_code)]
        enum OldPayload {
            Blank,
            Normal(()),
            Membership(OldMembership),
        }
        #[derive(serde::Serialize)]
        struct OldEntry {
            log_id: LogId,
            payload: OldPayload,
        }
        let old = OldEntry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), 1),
            payload: OldPayload::Membership(OldMembership {
                configs: vec![BTreeSet::from([1])],
                nodes: BTreeMap::from([(
                    1,
                    OldAddr {
                        rest: "127.0.0.1:8211",
                        grpc: "127.0.0.1:8311",
                    },
                )]),
            }),
        };
        for format in [VALUE_FORMAT_VERSION_V1, VALUE_FORMAT_VERSION_V2] {
            let mut bytes = encode(&old).unwrap();
            bytes[0] = format;
            let entry = decode_entry(&bytes).unwrap();
            let openraft::EntryPayload::Membership(m) = entry.payload else {
                panic!("not a membership entry");
            };
            let (id, addr) = m.nodes().next().unwrap();
            assert_eq!(*id, 1);
            assert_eq!(addr.rest, "127.0.0.1:8211");
            assert_eq!(addr.grpc, "127.0.0.1:8311");
            assert_eq!(addr.peer, "127.0.0.1:8311", "format {format}");
            assert_eq!(m.get_joint_config(), &vec![BTreeSet::from([1])]);
        }
    }
}
