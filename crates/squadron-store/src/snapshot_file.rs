//! The snapshot envelope and the one snapshot file on disk.
//!
//! Envelope layout (all integers big-endian):
//!
//! ```text
//! offset  size  field
//! 0       8     magic  b"SQDSMSN\0"
//! 8       4     envelope version (u32) = 1
//! 12      4     meta length m (u32)
//! 16      m     openraft SnapshotMeta, encoded by `crate::codec`
//! 16+m    8     state length s (u64)
//! 24+m    s     squadron_core::snapshot::encode_snapshot bytes (own magic and version)
//! 24+m+s  32    SHA-256 of every byte before it
//! ```
//!
//! The same bytes are what openraft streams to a follower, so a follower checks the checksum
//! and the core invariants before it installs anything. The checksum catches the corruption
//! that a well-formed bincode body would not (a flipped bit inside a string).
//!
//! On disk there is one file, `snapshot/current.snap`, replaced atomically and durably: a
//! temporary file is written and fsynced, renamed over it, and the directory fsynced
//! (`atomic-write-file`). A snapshot the node builds is encoded straight into that temporary
//! file (`SnapshotDir::write_new`): the state length is filled in once known and the checksum
//! read back from the file, so the bytes are those `encode_envelope` would build in memory.
//! A snapshot a follower receives is written chunk by chunk into `receiving.snap`
//! (`SnapshotDir::new_receiving`), checked and decoded from there, and renamed into place:
//! neither side ever holds a snapshot's bytes whole in memory (`read_envelope` checks a file
//! as it streams through it).

use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

use atomic_write_file::AtomicWriteFile;

use sha2::{Digest as _, Sha256};

use crate::codec::{self, CodecError};
use crate::type_config::SnapshotMeta;

/// Magic bytes that open every snapshot envelope.
pub const ENVELOPE_MAGIC: &[u8; 8] = b"SQDSMSN\0";
/// Version of the envelope layout.
pub const ENVELOPE_VERSION: u32 = 1;
/// Largest encoded snapshot meta accepted: it holds a membership config, a log id and an id.
pub const SNAPSHOT_META_BYTES_MAX: usize = 1024 * 1024;

const HEADER_BYTES: usize = 8 + 4 + 4;
const STATE_LEN_BYTES: usize = 8;
const CHECKSUM_BYTES: usize = 32;
/// The largest envelope read: the largest state and meta with their framing. A peer can make
/// a received file of any size (a chunk at any offset); beyond this it is not hashed.
const ENVELOPE_BYTES_MAX: u64 = (squadron_core::snapshot::SNAPSHOT_BYTES_MAX
    + SNAPSHOT_META_BYTES_MAX
    + HEADER_BYTES
    + STATE_LEN_BYTES
    + CHECKSUM_BYTES) as u64;
/// The buffer a snapshot is written and read back through.
const WRITE_BUFFER_BYTES: usize = 1024 * 1024;

/// Name of the live snapshot file inside the snapshot directory.
pub const SNAPSHOT_FILE_NAME: &str = "current.snap";
const SNAPSHOT_TMP_FILE_NAME: &str = "current.snap.tmp";
/// The snapshot a follower is receiving, until it is checked and renamed into place.
const RECEIVING_FILE_NAME: &str = "receiving.snap";

/// Why a snapshot envelope was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("not a Squadron store snapshot (bad magic)")]
    BadMagic,
    #[error("unsupported snapshot envelope version {found}; this build reads version {supported}")]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("snapshot envelope is truncated")]
    Truncated,
    #[error("snapshot meta of {size} bytes exceeds the {max}-byte limit")]
    MetaTooLarge { size: usize, max: usize },
    #[error("snapshot checksum mismatch")]
    ChecksumMismatch,
    #[error("snapshot file of {size} bytes exceeds the {max}-byte limit")]
    TooLarge { size: u64, max: u64 },
    #[error("snapshot meta is malformed: {0}")]
    Meta(CodecError),
    #[error("snapshot state is refused: {0}")]
    State(squadron_core::snapshot::SnapshotError),
    #[error("snapshot carries meta {found} but was offered as {expected}")]
    MetaMismatch { found: String, expected: String },
}

/// Why a snapshot file could not be written or read: the envelope, or the disk.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    #[error("snapshot file: {0}")]
    Io(#[from] io::Error),
}

/// What [`read_envelope`] found: the meta, and where the core's state bytes lie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub meta: SnapshotMeta,
    /// The offset of the state's bytes.
    pub state_at: u64,
    pub state_len: u64,
    /// The whole envelope's size.
    pub size: u64,
}

/// A writer that counts what passes through it.
struct Counted<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// SHA-256 of the `len` bytes `source` yields; fewer is an error.
fn sha256_of(source: &mut impl Read, len: u64) -> io::Result<[u8; CHECKSUM_BYTES]> {
    let mut hasher = Sha256::new();
    let mut reader = io::BufReader::with_capacity(WRITE_BUFFER_BYTES, source.take(len));
    let read = io::copy(&mut reader, &mut hasher)?;
    if read != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("read back {read} of the snapshot's {len} bytes"),
        ));
    }
    Ok(hasher.finalize().into())
}

/// Builds an envelope around the core's encoding of the state.
pub fn encode_envelope(meta: &SnapshotMeta, state_bytes: &[u8]) -> Result<Vec<u8>, EnvelopeError> {
    let meta_bytes = codec::encode(meta).map_err(EnvelopeError::Meta)?;
    if meta_bytes.len() > SNAPSHOT_META_BYTES_MAX {
        return Err(EnvelopeError::MetaTooLarge {
            size: meta_bytes.len(),
            max: SNAPSHOT_META_BYTES_MAX,
        });
    }
    // The bound above keeps the length inside u32.
    let meta_len = u32::try_from(meta_bytes.len()).map_err(|_| EnvelopeError::MetaTooLarge {
        size: meta_bytes.len(),
        max: SNAPSHOT_META_BYTES_MAX,
    })?;
    let mut out = Vec::with_capacity(
        HEADER_BYTES + meta_bytes.len() + STATE_LEN_BYTES + state_bytes.len() + CHECKSUM_BYTES,
    );
    out.extend_from_slice(ENVELOPE_MAGIC);
    out.extend_from_slice(&ENVELOPE_VERSION.to_be_bytes());
    out.extend_from_slice(&meta_len.to_be_bytes());
    out.extend_from_slice(&meta_bytes);
    out.extend_from_slice(&(state_bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(state_bytes);
    let checksum: [u8; CHECKSUM_BYTES] = Sha256::digest(&out).into();
    out.extend_from_slice(&checksum);
    Ok(out)
}

/// Checks an envelope's framing and checksum as it streams through `source` (a file of any
/// size, read through a fixed buffer), and says where its state lies; the state itself is not
/// decoded (the caller decides whether it needs it). Reading from the start, whatever the
/// source's position.
pub fn read_envelope<R: Read + Seek>(source: &mut R) -> Result<Envelope, SnapshotFileError> {
    let size = source.seek(SeekFrom::End(0))?;
    if size > ENVELOPE_BYTES_MAX {
        return Err(EnvelopeError::TooLarge {
            size,
            max: ENVELOPE_BYTES_MAX,
        }
        .into());
    }
    source.seek(SeekFrom::Start(0))?;
    let mut header = Vec::with_capacity(HEADER_BYTES);
    (&mut *source)
        .take(HEADER_BYTES as u64)
        .read_to_end(&mut header)?;
    let rest = header
        .strip_prefix(ENVELOPE_MAGIC.as_slice())
        .ok_or(EnvelopeError::BadMagic)?;
    let (version, rest) = split_u32(rest)?;
    if version != ENVELOPE_VERSION {
        return Err(EnvelopeError::UnsupportedVersion {
            found: version,
            supported: ENVELOPE_VERSION,
        }
        .into());
    }
    let covered = size
        .checked_sub(CHECKSUM_BYTES as u64)
        .filter(|c| *c >= (HEADER_BYTES + STATE_LEN_BYTES) as u64)
        .ok_or(EnvelopeError::Truncated)?;
    source.seek(SeekFrom::Start(0))?;
    let computed = sha256_of(source, covered)?;
    let mut checksum = [0u8; CHECKSUM_BYTES];
    source.read_exact(&mut checksum)?;
    if computed != checksum {
        return Err(EnvelopeError::ChecksumMismatch.into());
    }
    // From here on only the checksummed part is parsed.
    let (meta_len, _) = split_u32(rest)?;
    let meta_len = usize::try_from(meta_len).map_err(|_| EnvelopeError::Truncated)?;
    if meta_len > SNAPSHOT_META_BYTES_MAX {
        return Err(EnvelopeError::MetaTooLarge {
            size: meta_len,
            max: SNAPSHOT_META_BYTES_MAX,
        }
        .into());
    }
    let state_len_at = (HEADER_BYTES + meta_len) as u64;
    if state_len_at + STATE_LEN_BYTES as u64 > covered {
        return Err(EnvelopeError::Truncated.into());
    }
    source.seek(SeekFrom::Start(HEADER_BYTES as u64))?;
    let mut meta_bytes = vec![0u8; meta_len];
    source.read_exact(&mut meta_bytes)?;
    let meta = codec::decode_snapshot_meta(&meta_bytes).map_err(EnvelopeError::Meta)?;
    let mut state_len = [0u8; STATE_LEN_BYTES];
    source.read_exact(&mut state_len)?;
    let state_len = u64::from_be_bytes(state_len);
    let state_at = state_len_at + STATE_LEN_BYTES as u64;
    if state_at.checked_add(state_len) != Some(covered) {
        return Err(EnvelopeError::Truncated.into());
    }
    Ok(Envelope {
        meta,
        state_at,
        state_len,
        size,
    })
}

/// [`read_envelope`] of bytes in memory: the meta and the state's bytes.
pub fn decode_envelope(bytes: &[u8]) -> Result<(SnapshotMeta, &[u8]), EnvelopeError> {
    let found = read_envelope(&mut io::Cursor::new(bytes)).map_err(|e| match e {
        SnapshotFileError::Envelope(e) => e,
        // Reading a slice fails only past its end.
        SnapshotFileError::Io(_) => EnvelopeError::Truncated,
    })?;
    // Both bounds were checked against the slice's length.
    let state = &bytes[found.state_at as usize..(found.state_at + found.state_len) as usize];
    Ok((found.meta, state))
}

fn split_u32(bytes: &[u8]) -> Result<(u32, &[u8]), EnvelopeError> {
    let (head, rest) = bytes
        .split_first_chunk::<4>()
        .ok_or(EnvelopeError::Truncated)?;
    Ok((u32::from_be_bytes(*head), rest))
}

/// The directory that holds the live snapshot file.
#[derive(Debug, Clone)]
pub struct SnapshotDir {
    dir: PathBuf,
}

impl SnapshotDir {
    /// Creates the directory when missing and removes the temporary files a crash left
    /// behind: an earlier version's `current.snap.tmp`, and `atomic-write-file`'s own
    /// (`.current.snap.XXXXXX`), which it removes on drop but a killed process leaves — a
    /// build killed mid-encoding would leave one as large as a snapshot.
    pub fn open(dir: PathBuf) -> io::Result<Self> {
        fs::create_dir_all(&dir)?;
        let this = Self { dir };
        let leftover_prefix = format!(".{SNAPSHOT_FILE_NAME}.");
        for entry in fs::read_dir(&this.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name == SNAPSHOT_TMP_FILE_NAME
                || name == RECEIVING_FILE_NAME
                || name.starts_with(&leftover_prefix)
            {
                match fs::remove_file(entry.path()) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
        }
        Ok(this)
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(SNAPSHOT_FILE_NAME)
    }

    fn receiving_path(&self) -> PathBuf {
        self.dir.join(RECEIVING_FILE_NAME)
    }

    /// The live snapshot, opened, or `None` when no snapshot was ever written. A file
    /// replaced after it was opened stays readable through the handle.
    pub fn open_current(&self) -> io::Result<Option<fs::File>> {
        match fs::File::open(self.path()) {
            Ok(file) => Ok(Some(file)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads the live snapshot whole, or `None` when no snapshot was ever written. For tests
    /// and tools: the node itself reads it through [`Self::open_current`].
    pub fn read(&self) -> io::Result<Option<Vec<u8>>> {
        match fs::read(self.path()) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// An empty file for a snapshot about to be received. One is received at a time (openraft
    /// begins a stream only once the one before was installed or abandoned), so an earlier
    /// file is abandoned and goes: unlinked, not truncated, should a handle on it live on.
    pub fn new_receiving(&self) -> io::Result<fs::File> {
        match fs::remove_file(self.receiving_path()) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(self.receiving_path())
    }

    /// Whether `file` is the snapshot being received (not some other file handed in).
    fn is_receiving(&self, file: &fs::File) -> io::Result<bool> {
        let held = file.metadata()?;
        match fs::metadata(self.receiving_path()) {
            Ok(named) => Ok(named.dev() == held.dev() && named.ino() == held.ino()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Puts a checked snapshot in place of the live one, atomically and durably: the received
    /// file itself is fsynced and renamed (its bytes are not written twice); any other file
    /// (openraft's storage suite hands one in) is copied through a temporary file.
    pub fn replace_with_received(&self, mut file: fs::File) -> io::Result<()> {
        if !self.is_receiving(&file)? {
            let mut copy = AtomicWriteFile::open(self.path())?;
            file.seek(SeekFrom::Start(0))?;
            io::copy(
                &mut io::BufReader::with_capacity(WRITE_BUFFER_BYTES, file),
                &mut copy,
            )?;
            return copy.commit();
        }
        file.sync_all()?;
        fs::rename(self.receiving_path(), self.path())?;
        // The rename is durable only once the directory entry is.
        fs::File::open(&self.dir)?.sync_all()
    }

    /// Removes the received file `file` after its checks failed or a newer snapshot won; a
    /// file handed in from elsewhere is left alone. An abandoned one (a stream that never
    /// ended, or one openraft did not install) goes at the next receive or start.
    pub fn discard_received(&self, file: &fs::File) {
        match self.is_receiving(file) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell whether a snapshot file is the one received");
                return;
            }
        }
        if let Err(e) = fs::remove_file(self.receiving_path()) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(error = %e, "cannot remove a received snapshot file");
            }
        }
    }

    /// Writes an envelope of `meta` and the state `encode` writes into a new file beside the
    /// live snapshot, as it is encoded: the state is never whole in memory (at a million tasks
    /// its encoding and the envelope around it were two buffers of 230 MB each). The state's
    /// length, which the envelope puts before it, is written once known, and the checksum is
    /// read back from the file. Returns the file, not yet in place ([`Self::replace_with`]),
    /// and its size.
    pub fn write_new(
        &self,
        meta: &SnapshotMeta,
        encode: impl FnOnce(&mut dyn Write) -> io::Result<()>,
    ) -> Result<(AtomicWriteFile, u64), SnapshotFileError> {
        let meta_bytes = codec::encode(meta).map_err(EnvelopeError::Meta)?;
        let meta_len = u32::try_from(meta_bytes.len())
            .ok()
            .filter(|len| *len as usize <= SNAPSHOT_META_BYTES_MAX)
            .ok_or(EnvelopeError::MetaTooLarge {
                size: meta_bytes.len(),
                max: SNAPSHOT_META_BYTES_MAX,
            })?;
        let mut file = AtomicWriteFile::options().read(true).open(self.path())?;
        let state_len_at = (HEADER_BYTES + meta_bytes.len()) as u64;
        let state_len = {
            let mut out = io::BufWriter::with_capacity(WRITE_BUFFER_BYTES, &mut file);
            out.write_all(ENVELOPE_MAGIC)?;
            out.write_all(&ENVELOPE_VERSION.to_be_bytes())?;
            out.write_all(&meta_len.to_be_bytes())?;
            out.write_all(&meta_bytes)?;
            out.write_all(&0u64.to_be_bytes())?;
            let mut counted = Counted {
                inner: out,
                bytes: 0,
            };
            encode(&mut counted)?;
            counted.inner.flush()?;
            counted.bytes
        };
        file.seek(SeekFrom::Start(state_len_at))?;
        file.write_all(&state_len.to_be_bytes())?;
        let covered = state_len_at + STATE_LEN_BYTES as u64 + state_len;
        file.seek(SeekFrom::Start(0))?;
        let checksum = sha256_of(&mut file, covered)?;
        file.seek(SeekFrom::Start(covered))?;
        file.write_all(&checksum)?;
        Ok((file, covered + CHECKSUM_BYTES as u64))
    }

    /// Puts a file from [`Self::write_new`] in place of the live snapshot, atomically and
    /// durably.
    pub fn replace_with(&self, file: AtomicWriteFile) -> io::Result<()> {
        file.commit()
    }
}

/// Checks that an envelope's own meta is the meta it is offered under.
pub fn check_meta(found: &SnapshotMeta, expected: &SnapshotMeta) -> Result<(), EnvelopeError> {
    if found == expected {
        Ok(())
    } else {
        Err(EnvelopeError::MetaMismatch {
            found: found.to_string(),
            expected: expected.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::testing::log_id;

    fn meta() -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(log_id(2, 1, 9)),
            last_membership: Default::default(),
            snapshot_id: "2-9-1".into(),
        }
    }

    /// A file written as the state is encoded holds the same bytes as the envelope built in
    /// memory, and is the live snapshot only once put in place.
    #[test]
    fn a_streamed_file_is_the_envelope_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let snapshots = SnapshotDir::open(dir.path().to_path_buf()).unwrap();
        let state: Vec<u8> = (0..3 * WRITE_BUFFER_BYTES + 5).map(|i| i as u8).collect();
        // Small writes, as the state's encoder makes, cross the buffer's boundaries.
        let (file, size) = snapshots
            .write_new(&meta(), |w| {
                state.chunks(7).try_for_each(|c| w.write_all(c))
            })
            .unwrap();
        assert_eq!(
            snapshots.read().unwrap(),
            None,
            "in place before replace_with"
        );
        snapshots.replace_with(file).unwrap();
        let on_disk = snapshots.read().unwrap().unwrap();
        assert_eq!(on_disk, encode_envelope(&meta(), &state).unwrap());
        assert_eq!(size, on_disk.len() as u64);
        let (m, body) = decode_envelope(&on_disk).unwrap();
        assert_eq!((m, body), (meta(), state.as_slice()));
    }

    /// A process killed while writing leaves `atomic-write-file`'s temporary file behind; the
    /// next open removes it, and leaves the live snapshot alone.
    #[test]
    fn opening_removes_the_temporary_files_a_crash_left() {
        let dir = tempfile::tempdir().unwrap();
        let live = encode_envelope(&meta(), b"state").unwrap();
        std::fs::write(dir.path().join(SNAPSHOT_FILE_NAME), &live).unwrap();
        for leftover in [
            ".current.snap.a1B2c3",
            SNAPSHOT_TMP_FILE_NAME,
            RECEIVING_FILE_NAME,
        ] {
            std::fs::write(dir.path().join(leftover), b"half a snapshot").unwrap();
        }
        let snapshots = SnapshotDir::open(dir.path().to_path_buf()).unwrap();
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [SNAPSHOT_FILE_NAME]);
        assert_eq!(snapshots.read().unwrap(), Some(live));
    }

    /// A source that counts the bytes read from it.
    struct CountedReads<R> {
        inner: R,
        read: u64,
    }

    impl<R: Read> Read for CountedReads<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read += n as u64;
            Ok(n)
        }
    }

    impl<R: Seek> Seek for CountedReads<R> {
        fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
            self.inner.seek(pos)
        }
    }

    /// A received file can be made of any size (a chunk at any offset); one beyond the largest
    /// envelope is refused before a byte of it is read (here a sparse file of 8 GiB).
    #[test]
    fn a_file_beyond_the_largest_envelope_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let file = fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.path().join("huge"))
            .unwrap();
        file.set_len(ENVELOPE_BYTES_MAX + 1).unwrap();
        let mut counted = CountedReads {
            inner: file,
            read: 0,
        };
        let refused = read_envelope(&mut counted).unwrap_err().to_string();
        assert!(refused.contains("exceeds the"), "{refused}");
        assert_eq!(counted.read, 0);
    }

    #[test]
    fn envelope_round_trips() {
        let bytes = encode_envelope(&meta(), b"state bytes").unwrap();
        let (m, state) = decode_envelope(&bytes).unwrap();
        assert_eq!(m, meta());
        assert_eq!(state, b"state bytes");
    }

    #[test]
    fn every_flipped_byte_and_every_truncation_is_refused() {
        let bytes = encode_envelope(&meta(), b"state bytes").unwrap();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x01;
            assert!(decode_envelope(&bad).is_err(), "flip at {i} accepted");
            assert!(decode_envelope(&bytes[..i]).is_err(), "cut at {i} accepted");
        }
    }
}
