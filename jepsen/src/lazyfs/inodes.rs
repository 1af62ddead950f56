//! FUSE inode numbers for the files of the disk directory, and where each one lives now.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::pending::Pending;

/// The inode FUSE gives the mount's root.
pub const ROOT: u64 = fuser::FUSE_ROOT_ID;

/// One file or directory the kernel has looked up.
#[derive(Debug)]
pub struct Inode {
    /// One of its paths on disk (any one will do for a hard-linked file).
    pub path: PathBuf,
    pub pending: Pending,
    /// The disk file, held while the kernel has it open: a file unlinked or renamed over
    /// while open stays readable through it, as on any disk (a reader of a snapshot that a
    /// newer one replaced met ENOENT when reads went by path).
    pub handle: Option<std::fs::File>,
    /// The kernel's open handles on it.
    pub opens: u32,
    /// Its last link is gone while it was open: forgotten at the last release.
    pub orphan: bool,
}

impl Inode {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            pending: Pending::default(),
            handle: None,
            opens: 0,
            orphan: false,
        }
    }
}

/// Inode numbers keyed by the disk's (device, inode), so hard links share one.
#[derive(Debug)]
pub struct Inodes {
    by_ino: HashMap<u64, Inode>,
    by_disk: HashMap<(u64, u64), u64>,
    next: u64,
}

impl Inodes {
    pub fn new(root: PathBuf) -> Self {
        let mut by_ino = HashMap::new();
        by_ino.insert(ROOT, Inode::new(root));
        Self {
            by_ino,
            by_disk: HashMap::new(),
            next: ROOT + 1,
        }
    }

    pub fn get(&self, ino: u64) -> Option<&Inode> {
        self.by_ino.get(&ino)
    }

    pub fn get_mut(&mut self, ino: u64) -> Option<&mut Inode> {
        self.by_ino.get_mut(&ino)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Inode> {
        self.by_ino.values_mut()
    }

    /// The inode holding the most unsynced bytes, if any holds some.
    pub fn most_dirty(&self) -> Option<u64> {
        self.by_ino
            .iter()
            .filter(|(_, n)| !n.pending.is_empty())
            .max_by_key(|(_, n)| n.pending.bytes())
            .map(|(ino, _)| *ino)
    }

    /// The inode of the file at `path` with the disk identity `disk`, made if new.
    pub fn intern(&mut self, disk: (u64, u64), path: &Path) -> u64 {
        if let Some(&ino) = self.by_disk.get(&disk) {
            if let Some(node) = self.by_ino.get_mut(&ino) {
                node.path = path.to_path_buf();
            }
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_disk.insert(disk, ino);
        self.by_ino.insert(ino, Inode::new(path.to_path_buf()));
        ino
    }

    /// Forgets a file whose last link is gone (its unsynced data with it) and returns it; one
    /// still open stays, an orphan, until its last release ([`Self::released`]).
    pub fn remove(&mut self, disk: (u64, u64)) -> Option<Inode> {
        let ino = self.by_disk.remove(&disk)?;
        match self.by_ino.get_mut(&ino) {
            Some(node) if node.opens > 0 => {
                node.orphan = true;
                None
            }
            _ => self.by_ino.remove(&ino),
        }
    }

    /// One open handle of `ino` closed: the last one lets go of the disk file, and forgets an
    /// orphan (returned, for its unsynced bytes).
    pub fn released(&mut self, ino: u64) -> Option<Inode> {
        let node = self.by_ino.get_mut(&ino)?;
        node.opens = node.opens.saturating_sub(1);
        if node.opens > 0 {
            return None;
        }
        node.handle = None;
        if node.orphan {
            return self.by_ino.remove(&ino);
        }
        None
    }

    /// After `from` moved to `to`: every known path under `from` now lives under `to`.
    pub fn renamed(&mut self, from: &Path, to: &Path) {
        for node in self.by_ino.values_mut() {
            if let Ok(rest) = node.path.strip_prefix(from) {
                node.path = if rest.as_os_str().is_empty() {
                    to.to_path_buf()
                } else {
                    to.join(rest)
                };
            }
        }
    }
}
