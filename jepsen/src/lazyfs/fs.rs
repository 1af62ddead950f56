//! The FUSE filesystem: a directory on disk seen through a page cache that only fsync
//! empties. Data writes stay in memory (`Pending`) until `fsync`/`fdatasync` of the file, or
//! until memory pressure writes the largest file back; `State::crash` drops them. Metadata
//! (create, rename, unlink, mkdir, links) goes to disk at once: the fault under test is lost
//! data, as in LazyFS's default mode.

use std::ffi::OsStr;
use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    FileAttr, FileType, Filesystem, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};
use libc::c_int;

use super::inodes::{Inodes, ROOT};

/// Unsynced bytes held in memory before the largest file is written back (without a sync),
/// as a kernel does under memory pressure.
pub const DIRTY_BYTES_MAX: usize = 256 << 20;
/// The kernel asks again every time: attributes change when a crash drops data.
const TTL: Duration = Duration::ZERO;

/// What the filesystem did, for the run's record.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub fsyncs: u64,
    pub synced_bytes: u64,
    pub written_back_bytes: u64,
    pub crashes: u64,
    pub lost_bytes: u64,
    pub lost_files: u64,
    /// Writes that arrived from a crashed process after its crash, refused.
    pub fenced_writes: u64,
}

/// Shared by the FUSE thread and the harness.
#[derive(Debug)]
pub struct State {
    inodes: Inodes,
    dirty_bytes: usize,
    /// Between a crash and the next start: writes still in flight from the dead process are
    /// refused, not kept.
    fenced: bool,
    pub stats: Stats,
}

impl State {
    pub fn new(disk: PathBuf) -> Self {
        Self {
            inodes: Inodes::new(disk),
            dirty_bytes: 0,
            fenced: false,
            stats: Stats::default(),
        }
    }

    /// Drops every unsynced write and refuses writes until `unfence`. Returns what was lost.
    pub fn crash(&mut self) -> (u64, u64) {
        let (mut files, mut bytes) = (0, 0);
        for node in self.inodes.iter_mut() {
            if !node.pending.is_empty() {
                files += 1;
                bytes += node.pending.bytes() as u64;
                node.pending = Default::default();
            }
        }
        self.dirty_bytes = 0;
        self.fenced = true;
        self.stats.crashes += 1;
        self.stats.lost_files += files;
        self.stats.lost_bytes += bytes;
        (files, bytes)
    }

    pub fn unfence(&mut self) {
        self.fenced = false;
    }
}

pub struct LazyFs {
    pub state: Arc<Mutex<State>>,
}

fn errno(e: &std::io::Error) -> c_int {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn disk_id(m: &Metadata) -> (u64, u64) {
    (m.dev(), m.ino())
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let t = Duration::new(secs.unsigned_abs(), nsecs.clamp(0, 999_999_999) as u32);
    if secs >= 0 {
        UNIX_EPOCH + t
    } else {
        UNIX_EPOCH - t
    }
}

fn kind(m: &Metadata) -> FileType {
    let t = m.file_type();
    if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    }
}

fn attr(ino: u64, m: &Metadata, size: u64) -> FileAttr {
    FileAttr {
        ino,
        size,
        blocks: size.div_ceil(512),
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: kind(m),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: 4096,
        flags: 0,
    }
}

impl LazyFs {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a filesystem we cannot trust: stop here.
        self.state.lock().expect("lazyfs state poisoned")
    }
}

impl State {
    fn path(&self, ino: u64) -> Result<PathBuf, c_int> {
        self.inodes
            .get(ino)
            .map(|n| n.path.clone())
            .ok_or(libc::ENOENT)
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, c_int> {
        Ok(self.path(parent)?.join(name))
    }

    /// The attributes of `ino` as a reader sees them: the disk's, with unsynced sizes.
    fn attr_of(&mut self, ino: u64) -> Result<FileAttr, c_int> {
        let path = self.path(ino)?;
        let m = match (std::fs::symlink_metadata(&path), self.inodes.get(ino)) {
            (Ok(m), Some(n)) if !n.orphan => m,
            (Ok(m), None) => m,
            (found, node) => match node.and_then(|n| n.handle.as_ref()) {
                Some(file) => file.metadata().map_err(|e| errno(&e))?,
                None => found.map_err(|e| errno(&e))?,
            },
        };
        let size = match self.inodes.get(ino) {
            Some(n) if m.is_file() => n.pending.size(m.len()),
            _ => m.len(),
        };
        Ok(attr(ino, &m, size))
    }

    /// Looks `path` up on disk and gives it an inode.
    fn entry(&mut self, path: PathBuf) -> Result<FileAttr, c_int> {
        let m = std::fs::symlink_metadata(&path).map_err(|e| errno(&e))?;
        let ino = self.inodes.intern(disk_id(&m), &path);
        self.attr_of(ino)
    }

    fn read(&self, ino: u64, offset: u64, size: usize) -> Result<Vec<u8>, c_int> {
        let node = self.inodes.get(ino).ok_or(libc::ENOENT)?;
        let opened;
        let file = match &node.handle {
            Some(held) => held,
            None => {
                opened = File::open(&node.path).map_err(|e| errno(&e))?;
                &opened
            }
        };
        let disk_size = file.metadata().map_err(|e| errno(&e))?.len();
        let mut buf = vec![0u8; size];
        let mut done = 0;
        while offset + (done as u64) < disk_size && done < size {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) => return Err(errno(&e)),
            }
        }
        let n = node.pending.overlay(disk_size, offset, &mut buf);
        buf.truncate(n);
        Ok(buf)
    }

    /// The kernel opened `ino`: its disk file is held until the last release.
    fn opened(&mut self, ino: u64) -> Result<(), c_int> {
        let node = self.inodes.get_mut(ino).ok_or(libc::ENOENT)?;
        if node.handle.is_none() {
            let rw = OpenOptions::new().read(true).write(true).open(&node.path);
            let file = match rw {
                Ok(f) => f,
                Err(_) => File::open(&node.path).map_err(|e| errno(&e))?,
            };
            node.handle = Some(file);
        }
        node.opens += 1;
        Ok(())
    }

    fn released(&mut self, ino: u64) {
        if let Some(gone) = self.inodes.released(ino) {
            self.dirty_bytes = self.dirty_bytes.saturating_sub(gone.pending.bytes());
        }
    }

    /// Between a crash and the restart, a change is refused (and counted), not kept.
    fn refuse_if_fenced(&mut self) -> Result<(), c_int> {
        if self.fenced {
            self.stats.fenced_writes += 1;
            return Err(libc::EIO);
        }
        Ok(())
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<(), c_int> {
        self.refuse_if_fenced()?;
        let node = self.inodes.get_mut(ino).ok_or(libc::ENOENT)?;
        node.pending.write(offset, data);
        self.dirty_bytes += data.len();
        if self.dirty_bytes > DIRTY_BYTES_MAX {
            self.write_back_largest()?;
        }
        Ok(())
    }

    fn resize(&mut self, ino: u64, size: u64) -> Result<(), c_int> {
        self.refuse_if_fenced()?;
        let node = self.inodes.get_mut(ino).ok_or(libc::ENOENT)?;
        node.pending.resize(size);
        Ok(())
    }

    /// Writes `ino`'s unsynced changes to disk.
    fn flush_to_disk(&mut self, ino: u64) -> Result<u64, c_int> {
        let node = self.inodes.get_mut(ino).ok_or(libc::ENOENT)?;
        if node.pending.is_empty() {
            return Ok(0);
        }
        let bytes = node.pending.bytes();
        // Through the held file when open (an orphan has no path left); else by path.
        let by_path;
        let file = match &node.handle {
            Some(held) => held,
            None => {
                by_path = OpenOptions::new()
                    .write(true)
                    .open(&node.path)
                    .map_err(|e| errno(&e))?;
                &by_path
            }
        };
        node.pending.apply(file).map_err(|e| errno(&e))?;
        self.dirty_bytes = self.dirty_bytes.saturating_sub(bytes);
        Ok(bytes as u64)
    }

    fn fsync(&mut self, ino: u64) -> Result<(), c_int> {
        // The disk directory stands for the platter: what reaches it survives a simulated
        // crash, so it needs no fsync of its own.
        let bytes = self.flush_to_disk(ino)?;
        self.stats.fsyncs += 1;
        self.stats.synced_bytes += bytes;
        Ok(())
    }

    fn write_back_largest(&mut self) -> Result<(), c_int> {
        let Some(ino) = self.inodes.most_dirty() else {
            return Ok(());
        };
        let bytes = self.flush_to_disk(ino)?;
        self.stats.written_back_bytes += bytes;
        Ok(())
    }

    /// Before unlinking or replacing `path`: a last link going drops its unsynced data.
    fn forget_if_last_link(&mut self, path: &std::path::Path) {
        if let Ok(m) = std::fs::symlink_metadata(path) {
            if m.is_file() && m.nlink() == 1 {
                if let Some(node) = self.inodes.remove(disk_id(&m)) {
                    self.dirty_bytes = self.dirty_bytes.saturating_sub(node.pending.bytes());
                }
            }
        }
    }
}

fn reply_entry(reply: ReplyEntry, r: Result<FileAttr, c_int>) {
    match r {
        Ok(a) => reply.entry(&TTL, &a, 0),
        Err(e) => reply.error(e),
    }
}

fn reply_empty(reply: ReplyEmpty, r: Result<(), c_int>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn set_times(
    path: &std::path::Path,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
) -> Result<(), c_int> {
    if atime.is_none() && mtime.is_none() {
        return Ok(());
    }
    let resolve = |t: TimeOrNow| match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    };
    let mut times = std::fs::FileTimes::new();
    if let Some(a) = atime {
        times = times.set_accessed(resolve(a));
    }
    if let Some(m) = mtime {
        times = times.set_modified(resolve(m));
    }
    let file = File::open(path).map_err(|e| errno(&e))?;
    file.set_times(times).map_err(|e| errno(&e))
}

impl Filesystem for LazyFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let mut s = self.lock();
        let r = s.child(parent, name).and_then(|p| s.entry(p));
        reply_entry(reply, r);
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.lock().attr_of(ino) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let mut s = self.lock();
        let r = (|| {
            let path = s.path(ino)?;
            if let Some(mode) = mode {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(|e| errno(&e))?;
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::lchown(&path, uid, gid).map_err(|e| errno(&e))?;
            }
            if let Some(size) = size {
                s.resize(ino, size)?;
            }
            set_times(&path, atime, mtime)?;
            s.attr_of(ino)
        })();
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyData) {
        let r = self
            .lock()
            .path(ino)
            .and_then(|p| std::fs::read_link(p).map_err(|e| errno(&e)));
        match r {
            Ok(target) => reply.data(target.as_os_str().as_encoded_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut s = self.lock();
        let r = s.child(parent, name).and_then(|path| {
            std::fs::DirBuilder::new()
                .mode(mode & !umask & 0o7777)
                .create(&path)
                .map_err(|e| errno(&e))?;
            s.entry(path)
        });
        reply_entry(reply, r);
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.lock();
        let r = s.child(parent, name).and_then(|path| {
            s.forget_if_last_link(&path);
            std::fs::remove_file(&path).map_err(|e| errno(&e))
        });
        reply_empty(reply, r);
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let s = self.lock();
        let r = s
            .child(parent, name)
            .and_then(|path| std::fs::remove_dir(&path).map_err(|e| errno(&e)));
        reply_empty(reply, r);
    }

    fn symlink(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let mut s = self.lock();
        let r = s.child(parent, link_name).and_then(|path| {
            std::os::unix::fs::symlink(target, &path).map_err(|e| errno(&e))?;
            s.entry(path)
        });
        reply_entry(reply, r);
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        let mut s = self.lock();
        let r = (|| {
            let from = s.child(parent, name)?;
            let to = s.child(newparent, newname)?;
            if flags & libc::RENAME_NOREPLACE != 0 && std::fs::symlink_metadata(&to).is_ok() {
                return Err(libc::EEXIST);
            }
            if flags & !libc::RENAME_NOREPLACE != 0 {
                return Err(libc::EINVAL);
            }
            s.forget_if_last_link(&to);
            std::fs::rename(&from, &to).map_err(|e| errno(&e))?;
            s.inodes.renamed(&from, &to);
            Ok(())
        })();
        reply_empty(reply, r);
    }

    fn link(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut s = self.lock();
        let r = (|| {
            let from = s.path(ino)?;
            let to = s.child(newparent, newname)?;
            std::fs::hard_link(&from, &to).map_err(|e| errno(&e))?;
            s.attr_of(ino)
        })();
        reply_entry(reply, r);
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        // Direct I/O: every read comes here, so the kernel never serves bytes a crash dropped.
        match self.lock().opened(ino) {
            Ok(()) => reply.opened(0, fuser::consts::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.lock().released(ino);
        reply.ok();
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        match self.lock().read(ino, offset.max(0) as u64, size as usize) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        match self.lock().write(ino, offset.max(0) as u64, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lo: u64, reply: ReplyEmpty) {
        // close() does not sync.
        reply.ok();
    }

    fn fsync(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _data: bool, reply: ReplyEmpty) {
        let r = self.lock().fsync(ino);
        reply_empty(reply, r);
    }

    fn fsyncdir(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _d: bool, reply: ReplyEmpty) {
        // Metadata reaches the disk at once.
        reply.ok();
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let path = match self.lock().path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let entries = match std::fs::read_dir(&path) {
            Ok(rd) => rd,
            Err(e) => return reply.error(errno(&e)),
        };
        let mut list: Vec<(u64, FileType, std::ffi::OsString)> = vec![
            (ino, FileType::Directory, ".".into()),
            (ino, FileType::Directory, "..".into()),
        ];
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            // The kernel looks each name up before use; this number is informational.
            list.push((m.ino().max(1), kind(&m), e.file_name()));
        }
        list.sort_by(|a, b| a.2.cmp(&b.2));
        for (i, (ino, kind, name)) in list.iter().enumerate().skip(offset.max(0) as usize) {
            if reply.add(*ino, (i + 1) as i64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let root = match self.lock().path(ROOT) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match rustix::fs::statvfs(&root) {
            Ok(v) => reply.statfs(
                v.f_blocks,
                v.f_bfree,
                v.f_bavail,
                v.f_files,
                v.f_ffree,
                v.f_bsize as u32,
                v.f_namemax as u32,
                v.f_frsize as u32,
            ),
            Err(e) => reply.error(e.raw_os_error()),
        }
    }

    fn create(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut s = self.lock();
        let r = (|| {
            let path = s.child(parent, name)?;
            let mut o = OpenOptions::new();
            o.write(true).mode(mode & !umask & 0o7777);
            if flags & libc::O_EXCL != 0 {
                o.create_new(true);
            } else {
                o.create(true);
            }
            o.open(&path).map_err(|e| errno(&e))?;
            let a = s.entry(path)?;
            // The kernel holds the created file open: released like an opened one.
            s.opened(a.ino)?;
            if flags & libc::O_TRUNC != 0 && a.size > 0 {
                s.resize(a.ino, 0)?;
                return s.attr_of(a.ino);
            }
            Ok(a)
        })();
        match r {
            Ok(a) => reply.created(&TTL, &a, 0, 0, fuser::consts::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut s = self.lock();
        let r = (|| {
            if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
                return Err(libc::EOPNOTSUPP);
            }
            // Preallocation changes no byte a reader sees; growing the size is a resize.
            if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
                let end = (offset.max(0) + length.max(0)) as u64;
                if end > s.attr_of(ino)?.size {
                    s.resize(ino, end)?;
                }
            }
            Ok(())
        })();
        reply_empty(reply, r);
    }
}
