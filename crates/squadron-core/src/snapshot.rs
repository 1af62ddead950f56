//! The versioned snapshot encoding of the whole state, and the state digest (INV-12).

use std::io::{BufRead as _, BufReader, Read};

use sha2::{Digest as _, Sha256};

use crate::ids::Digest;
use crate::state::State;

/// Magic bytes that open every snapshot.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"SQDSNAP\0";
/// Version of the snapshot layout. Version 2 appended the trust boundary's state (tokens,
/// certificates, audit) and task lineage, version 3 the credentials, version 4 the workers'
/// policies, version 5 the agent sessions, version 6 the project tasks' leases, version 7 the
/// credentials of agent profiles, version 8 the egress bindings, version 9 the figures of
/// pruned tasks, version 10 the providers' progress; earlier versions still decode, with what
/// they lack empty.
pub const SNAPSHOT_VERSION: u32 = 10;
/// The layout before the providers' progress.
pub const SNAPSHOT_VERSION_V9: u32 = 9;
/// The layout before the figures of pruned tasks.
pub const SNAPSHOT_VERSION_V8: u32 = 8;
/// The layout before egress bindings.
pub const SNAPSHOT_VERSION_V7: u32 = 7;
/// The layout before the credentials of agent profiles.
pub const SNAPSHOT_VERSION_V6: u32 = 6;
/// The layout before project tasks' leases.
pub const SNAPSHOT_VERSION_V5: u32 = 5;
/// The layout before agent sessions.
pub const SNAPSHOT_VERSION_V4: u32 = 4;
/// The layout before worker policies.
pub const SNAPSHOT_VERSION_V3: u32 = 3;
/// The layout before credentials.
pub const SNAPSHOT_VERSION_V2: u32 = 2;
/// The layout before the trust boundary.
pub const SNAPSHOT_VERSION_V1: u32 = 1;
/// Largest snapshot accepted when decoding.
pub const SNAPSHOT_BYTES_MAX: usize = 8 * 1024 * 1024 * 1024;
/// The buffer a snapshot is read through while it is decoded.
const DECODE_BUFFER_BYTES: usize = 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a Squadron snapshot (bad magic)")]
    BadMagic,
    #[error("unsupported snapshot version {found}; this build reads version {supported}")]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("snapshot body is malformed: {0}")]
    Malformed(String),
    #[error("snapshot decodes but breaks an invariant: {0}")]
    Inconsistent(String),
}

type Config = bincode::config::Configuration<
    bincode::config::BigEndian,
    bincode::config::Varint,
    bincode::config::Limit<SNAPSHOT_BYTES_MAX>,
>;

fn config() -> Config {
    bincode::config::standard()
        .with_big_endian()
        .with_limit::<SNAPSHOT_BYTES_MAX>()
}

/// Encodes the whole state. Ordered maps make the bytes identical on every replica that
/// applied the same commands.
pub fn encode_snapshot(state: &State) -> Vec<u8> {
    let mut out = Vec::with_capacity(4096);
    encode_snapshot_into(state, &mut out)
        .unwrap_or_else(|e| panic!("encoding the state failed: {e}"));
    out
}

/// [`encode_snapshot`] written to `out` as it is encoded (a snapshot file), never whole in
/// memory. Fails only when `out` does.
pub fn encode_snapshot_into<W: std::io::Write + ?Sized>(
    state: &State,
    mut out: &mut W,
) -> std::io::Result<()> {
    out.write_all(SNAPSHOT_MAGIC)?;
    out.write_all(&SNAPSHOT_VERSION.to_be_bytes())?;
    match bincode::serde::encode_into_std_write(state, &mut out, config()) {
        Ok(_) => Ok(()),
        // The writer's own error (a full disk) keeps its kind.
        Err(bincode::error::EncodeError::Io { inner, .. }) => Err(inner),
        Err(e) => Err(std::io::Error::other(e)),
    }
}

/// Decodes a snapshot and checks every invariant before handing the state out: a corrupt or
/// forged snapshot is refused rather than installed.
pub fn decode_snapshot(bytes: &[u8]) -> Result<State, SnapshotError> {
    decode_snapshot_from(bytes, bytes.len() as u64)
}

/// [`decode_snapshot`] of the `len` bytes `source` yields, read as they are decoded: a
/// snapshot file is never whole in memory (at a million tasks it is 230 MB beside the state).
/// Bytes after `len` are not read; fewer than `len` are refused.
pub fn decode_snapshot_from<R: Read>(source: R, len: u64) -> Result<State, SnapshotError> {
    let mut reader = BufReader::with_capacity(DECODE_BUFFER_BYTES, source.take(len));
    let mut head = Vec::with_capacity(SNAPSHOT_MAGIC.len() + 4);
    (&mut reader)
        .take((SNAPSHOT_MAGIC.len() + 4) as u64)
        .read_to_end(&mut head)
        .map_err(|e| SnapshotError::Malformed(e.to_string()))?;
    let rest = head
        .strip_prefix(SNAPSHOT_MAGIC.as_slice())
        .ok_or(SnapshotError::BadMagic)?;
    let version: [u8; 4] = rest
        .try_into()
        .map_err(|_| SnapshotError::Malformed("truncated header".into()))?;
    let mut state = decode_body(u32::from_be_bytes(version), &mut reader)?;
    // Whatever is left of the `len` bytes: buffered, or not yet read.
    let unread = reader.buffer().len() as u64 + reader.get_ref().limit();
    if unread != 0 {
        let more = reader
            .fill_buf()
            .map_err(|e| SnapshotError::Malformed(e.to_string()))?;
        return Err(SnapshotError::Malformed(if more.is_empty() {
            format!("the source ended {unread} bytes short of its length")
        } else {
            format!("{unread} trailing bytes")
        }));
    }
    state.rebuild_ended_index();
    state
        .check_invariants()
        .map_err(SnapshotError::Inconsistent)?;
    Ok(state)
}

/// The state of a body in layout `version`, the older layouts converted.
fn decode_body(version: u32, body: &mut impl Read) -> Result<State, SnapshotError> {
    fn layout<T: serde::de::DeserializeOwned + Into<State>>(
        body: &mut impl Read,
    ) -> Result<State, bincode::error::DecodeError> {
        bincode::serde::decode_from_std_read::<T, _, _>(body, config()).map(Into::into)
    }
    match version {
        SNAPSHOT_VERSION => layout::<State>(body),
        SNAPSHOT_VERSION_V9 => layout::<crate::legacy::StateV9>(body),
        SNAPSHOT_VERSION_V8 => layout::<crate::legacy::StateV8>(body),
        SNAPSHOT_VERSION_V7 => layout::<crate::legacy::StateV7>(body),
        SNAPSHOT_VERSION_V6 => layout::<crate::legacy::StateV6>(body),
        SNAPSHOT_VERSION_V5 => layout::<crate::legacy::StateV5>(body),
        SNAPSHOT_VERSION_V4 => layout::<crate::legacy::StateV4>(body),
        SNAPSHOT_VERSION_V3 => layout::<crate::legacy::StateV3>(body),
        SNAPSHOT_VERSION_V2 => layout::<crate::legacy::StateV2>(body),
        SNAPSHOT_VERSION_V1 => layout::<crate::legacy::StateV1>(body),
        found => {
            return Err(SnapshotError::UnsupportedVersion {
                found,
                supported: SNAPSHOT_VERSION,
            })
        }
    }
    .map_err(|e| SnapshotError::Malformed(e.to_string()))
}

/// SHA-256 of the snapshot encoding: equal on replicas that applied the same index (INV-12).
/// Streams the encoding into the hash, so a large state is never held twice in memory.
pub fn state_digest(state: &State) -> Digest {
    let mut hasher = HashWriter(Sha256::new());
    hasher.0.update(SNAPSHOT_MAGIC);
    hasher.0.update(SNAPSHOT_VERSION.to_be_bytes());
    bincode::serde::encode_into_std_write(state, &mut hasher, config())
        .unwrap_or_else(|e| panic!("encoding the state failed: {e}"));
    Digest::from_bytes(hasher.0.finalize().into())
}

struct HashWriter(Sha256);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use serde::{Deserialize, Serialize};

    use super::config;
    use crate::state::{PMap, PSet};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Std {
        map: BTreeMap<u64, String>,
        set: BTreeSet<(u8, u64)>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Persistent {
        #[serde(deserialize_with = "crate::persistent_maps::deserialize_map")]
        map: PMap<u64, String>,
        #[serde(deserialize_with = "crate::persistent_maps::deserialize_set")]
        set: PSet<(u8, u64)>,
    }

    /// A forged count (2^62 entries, then nothing) is refused as malformed input: imbl's own
    /// decoder would reserve room for it first and abort the node.
    #[test]
    fn a_huge_stated_count_is_refused_without_reserving_it() {
        let mut forged = vec![253u8];
        forged.extend_from_slice(&(1u64 << 62).to_be_bytes());
        forged.extend_from_slice(&[1, 2, 3]);
        let refused = bincode::serde::decode_from_slice::<Persistent, _>(&forged, config());
        assert!(refused.is_err(), "{refused:?}");
        let mut set_forged = vec![0u8];
        set_forged.extend_from_slice(&forged);
        let refused = bincode::serde::decode_from_slice::<Persistent, _>(&set_forged, config());
        assert!(refused.is_err(), "{refused:?}");
    }

    /// The state moved its large maps from `BTreeMap` to persistent maps: snapshots written
    /// before must decode, and every replica's digest must stay the same, so the two encode
    /// byte for byte alike.
    #[test]
    fn persistent_maps_encode_as_the_standard_ones_do() {
        let map: BTreeMap<u64, String> = (0..300u64)
            .rev()
            .map(|i| (i * 7, format!("v{i}")))
            .collect();
        let set: BTreeSet<(u8, u64)> = (0..300u64).map(|i| ((i % 3) as u8, i)).collect();
        let std = Std {
            map: map.clone(),
            set: set.clone(),
        };
        let persistent = Persistent {
            map: map.into(),
            set: set.into(),
        };
        let a = bincode::serde::encode_to_vec(&std, config()).unwrap();
        let b = bincode::serde::encode_to_vec(&persistent, config()).unwrap();
        assert_eq!(a, b);
        let (back, _): (Persistent, usize) =
            bincode::serde::decode_from_slice(&a, config()).unwrap();
        assert_eq!(back, persistent);
        assert_eq!(
            serde_json::to_string(&std).unwrap(),
            serde_json::to_string(&persistent).unwrap()
        );
    }
}
