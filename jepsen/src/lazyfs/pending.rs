//! The writes to one file that no fsync has covered yet: what a page cache holds and a power
//! cut loses. Reads see them laid over the file on disk; `apply` writes them to disk (fsync,
//! or write-back under memory pressure); a crash drops them.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// One change to a file's contents, in the order it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    /// `ftruncate`/`O_TRUNC`/extending `fallocate`: the file's size becomes this.
    Resize(u64),
}

/// The unsynced changes of one file, oldest first.
#[derive(Debug, Default, Clone)]
pub struct Pending {
    changes: Vec<Change>,
    bytes: usize,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The bytes held in memory.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) {
        // A write of nothing changes nothing, not even the size (POSIX pwrite).
        if data.is_empty() {
            return;
        }
        self.bytes += data.len();
        // Appends (a WAL, a log file) extend the last write instead of piling up entries.
        if let Some(Change::Write { offset: o, data: d }) = self.changes.last_mut() {
            if *o + d.len() as u64 == offset {
                d.extend_from_slice(data);
                return;
            }
        }
        self.changes.push(Change::Write {
            offset,
            data: data.to_vec(),
        });
    }

    pub fn resize(&mut self, size: u64) {
        self.changes.push(Change::Resize(size));
    }

    /// The file's size once these changes are laid over a file of `disk_size` bytes.
    pub fn size(&self, disk_size: u64) -> u64 {
        self.changes.iter().fold(disk_size, |size, c| match c {
            Change::Write { offset, data } => size.max(offset + data.len() as u64),
            Change::Resize(s) => *s,
        })
    }

    /// Lays the changes over `buf`, which holds the disk's bytes from `start` (zeros past the
    /// disk's end), and returns how many of them the file has.
    pub fn overlay(&self, disk_size: u64, start: u64, buf: &mut [u8]) -> usize {
        let end = start + buf.len() as u64;
        // Invariant of the loop: every byte of `buf` at or past `size` is zero.
        let mut size = disk_size;
        for change in &self.changes {
            match change {
                Change::Resize(s) => {
                    if *s < size {
                        let from = (*s).clamp(start, end) - start;
                        buf[from as usize..].fill(0);
                    }
                    size = *s;
                }
                Change::Write { offset, data } => {
                    let w_end = offset + data.len() as u64;
                    let (lo, hi) = ((*offset).max(start), w_end.min(end));
                    if lo < hi {
                        let src = &data[(lo - offset) as usize..(hi - offset) as usize];
                        buf[(lo - start) as usize..(hi - start) as usize].copy_from_slice(src);
                    }
                    size = size.max(w_end);
                }
            }
        }
        size.saturating_sub(start).min(buf.len() as u64) as usize
    }

    /// Writes the changes to `file`, in order, and forgets them.
    pub fn apply(&mut self, file: &File) -> io::Result<()> {
        for change in &self.changes {
            match change {
                Change::Write { offset, data } => file.write_all_at(data, *offset)?,
                Change::Resize(size) => file.set_len(*size)?,
            }
        }
        self.changes.clear();
        self.bytes = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference: a file is a byte vector.
    fn reference(disk: &[u8], ops: &[Change]) -> Vec<u8> {
        let mut file = disk.to_vec();
        for op in ops {
            match op {
                Change::Write { data, .. } if data.is_empty() => {}
                Change::Write { offset, data } => {
                    let end = *offset as usize + data.len();
                    if file.len() < end {
                        file.resize(end, 0);
                    }
                    file[*offset as usize..end].copy_from_slice(data);
                }
                Change::Resize(s) => file.resize(*s as usize, 0),
            }
        }
        file
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            (0u64..96, proptest::collection::vec(any::<u8>(), 0..24))
                .prop_map(|(offset, data)| Change::Write { offset, data }),
            (0u64..96).prop_map(Change::Resize),
        ]
    }

    fn pending(ops: &[Change]) -> Pending {
        let mut p = Pending::default();
        for op in ops {
            match op {
                Change::Write { offset, data } => p.write(*offset, data),
                Change::Resize(s) => p.resize(*s),
            }
        }
        p
    }

    proptest! {
        #[test]
        fn reads_match_a_byte_vector(
            disk in proptest::collection::vec(any::<u8>(), 0..64),
            ops in proptest::collection::vec(change(), 0..12),
            start in 0u64..120,
            len in 0usize..64,
        ) {
            let want = reference(&disk, &ops);
            let p = pending(&ops);
            prop_assert_eq!(p.size(disk.len() as u64), want.len() as u64);
            let mut buf = vec![0u8; len];
            for (i, b) in buf.iter_mut().enumerate() {
                *b = disk.get(start as usize + i).copied().unwrap_or(0);
            }
            let n = p.overlay(disk.len() as u64, start, &mut buf);
            let lo = (start as usize).min(want.len());
            let hi = (start as usize + len).min(want.len());
            prop_assert_eq!(&buf[..n], &want[lo..hi]);
        }

        #[test]
        fn apply_writes_what_reads_showed(
            disk in proptest::collection::vec(any::<u8>(), 0..64),
            ops in proptest::collection::vec(change(), 0..12),
        ) {
            let want = reference(&disk, &ops);
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f");
            std::fs::write(&path, &disk).unwrap();
            let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
            let mut p = pending(&ops);
            p.apply(&file).unwrap();
            prop_assert!(p.is_empty());
            prop_assert_eq!(p.bytes(), 0);
            prop_assert_eq!(std::fs::read(&path).unwrap(), want);
        }
    }

    #[test]
    fn appends_coalesce_into_one_change() {
        let mut p = Pending::default();
        for i in 0..100u64 {
            p.write(i * 10, &[1; 10]);
        }
        assert_eq!(p.changes.len(), 1);
        assert_eq!(p.bytes(), 1_000);
    }
}
