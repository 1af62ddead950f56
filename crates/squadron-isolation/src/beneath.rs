//! Opening files in a directory a sandbox can write to, from the worker's side, without
//! following anything the sandbox planted there.
//!
//! The worker runs as root; a sandbox owns its outbox. A symbolic link the sandbox leaves in
//! place of `progress/stdout.log` or `artifacts/` would make the worker read (and serve) or
//! append to any host file. Every open here goes through `openat2(2)` relative to a directory
//! handle with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, so no component of the relative path
//! may be a link (the kernel answers `ELOOP`) or lead outside (`EXDEV`), and what was opened is
//! then checked on the handle itself: a regular file with no other hard link. Handles, not
//! paths, carry a walk from one directory to the next, so a path swapped for a link between two
//! steps is never followed either.
//!
//! Written over `rustix` rather than with `cap-std`: cap-std follows links that stay inside the
//! directory, and the rule here is no link at all; the three operations below are all we need.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Most entries `entries` lists from one directory.
pub const DIR_ENTRIES_MAX: usize = 100_000;

/// Mode of a file `append` creates.
const CREATED_FILE_MODE: u32 = 0o644;

#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    #[error("{0} does not exist")]
    Missing(String),
    #[error("{0} passes through a symbolic link or leads outside its directory; not followed")]
    Link(String),
    #[error("{0} is not a regular file")]
    NotRegular(String),
    #[error("{0} has other hard links; not opened")]
    HardLinked(String),
    #[error("{0} must be a relative path of plain names")]
    NotRelative(String),
    #[error("cannot open {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl BeneathError {
    /// True when the name simply is not there (not an attack, not a failure).
    pub fn is_missing(&self) -> bool {
        matches!(self, BeneathError::Missing(_))
    }
}

/// One directory, opened once; everything below it is reached through its handle.
#[derive(Debug)]
pub struct Beneath {
    dir: OwnedFd,
    path: PathBuf,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: std::ffi::OsString,
    pub kind: EntryKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    /// A link, a device, a socket, a FIFO: never opened.
    Other,
}

impl Beneath {
    /// Opens `path` itself, which must be a directory and not a link. The components above it
    /// are the worker's own (its data directory), so they are trusted.
    pub fn open(path: &Path) -> Result<Self, BeneathError> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let dir = rustix::fs::open(path, flags, Mode::empty())
            .map_err(|e| classify(e, &path.display().to_string()))?;
        Ok(Self {
            dir,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A directory beneath this one, as a new root.
    pub fn dir(&self, relative: &Path) -> Result<Beneath, BeneathError> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let dir = self.openat(relative, flags, Mode::empty())?;
        Ok(Self {
            dir,
            path: self.path.join(relative),
        })
    }

    /// A regular file beneath this directory, for reading.
    pub fn read(&self, relative: &Path) -> Result<File, BeneathError> {
        // NONBLOCK: a FIFO in place of a log would otherwise hang the open; it is refused below.
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = self.openat(relative, flags, Mode::empty())?;
        self.regular(fd, relative)
    }

    /// A regular file beneath this directory, for appending; created when missing.
    pub fn append(&self, relative: &Path) -> Result<File, BeneathError> {
        let flags = OFlags::WRONLY
            | OFlags::APPEND
            | OFlags::CREATE
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::CLOEXEC;
        let fd = self.openat(relative, flags, Mode::from_raw_mode(CREATED_FILE_MODE))?;
        let file = self.regular(fd, relative)?;
        // Blocking writes from here on: the handle is a regular file.
        let fd = std::os::fd::OwnedFd::from(file);
        let flags = rustix::fs::fcntl_getfl(&fd).map_err(|e| self.io(relative, e))?;
        rustix::fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK).map_err(|e| self.io(relative, e))?;
        Ok(File::from(fd))
    }

    /// A regular file beneath this directory, for reading and rewriting in place (never
    /// created).
    pub fn read_write(&self, relative: &Path) -> Result<File, BeneathError> {
        let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = self.openat(relative, flags, Mode::empty())?;
        let file = self.regular(fd, relative)?;
        let fd = std::os::fd::OwnedFd::from(file);
        let flags = rustix::fs::fcntl_getfl(&fd).map_err(|e| self.io(relative, e))?;
        rustix::fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK).map_err(|e| self.io(relative, e))?;
        Ok(File::from(fd))
    }

    /// The entries of this directory (without `.` and `..`), by name, at most
    /// [`DIR_ENTRIES_MAX`]. Kinds come from the directory itself: a link is `Other`.
    pub fn entries(&self) -> Result<Vec<Entry>, BeneathError> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = self.openat(Path::new("."), flags, Mode::empty())?;
        let dir = rustix::fs::Dir::new(fd).map_err(|e| self.io(Path::new("."), e))?;
        let mut out = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|e| self.io(Path::new("."), e))?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            if out.len() >= DIR_ENTRIES_MAX {
                break;
            }
            let kind = match entry.file_type() {
                // Some filesystems leave the type out of the listing; ask without following.
                FileType::Unknown => self.kind_of(name)?,
                known => kind_of(known),
            };
            out.push(Entry {
                name: name.to_os_string(),
                kind,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn kind_of(&self, name: &OsStr) -> Result<EntryKind, BeneathError> {
        let stat = rustix::fs::statat(&self.dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| self.io(Path::new(name), e))?;
        Ok(kind_of(FileType::from_raw_mode(stat.st_mode)))
    }

    fn openat(&self, relative: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, BeneathError> {
        check_relative(relative)?;
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        rustix::fs::openat2(&self.dir, relative, flags, mode, resolve)
            .map_err(|e| classify(e, &self.shown(relative)))
    }

    fn regular(&self, fd: OwnedFd, relative: &Path) -> Result<File, BeneathError> {
        let stat = rustix::fs::fstat(&fd).map_err(|e| self.io(relative, e))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(BeneathError::NotRegular(self.shown(relative)));
        }
        // A hard link to a host file would be a way out that no path check sees.
        if stat.st_nlink > 1 {
            return Err(BeneathError::HardLinked(self.shown(relative)));
        }
        Ok(File::from(fd))
    }

    fn shown(&self, relative: &Path) -> String {
        self.path.join(relative).display().to_string()
    }

    fn io(&self, relative: &Path, e: Errno) -> BeneathError {
        BeneathError::Io {
            path: self.shown(relative),
            source: e.into(),
        }
    }
}

fn kind_of(t: FileType) -> EntryKind {
    match t {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        _ => EntryKind::Other,
    }
}

fn check_relative(relative: &Path) -> Result<(), BeneathError> {
    let plain = relative
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if relative.as_os_str().is_empty() || !plain {
        return Err(BeneathError::NotRelative(relative.display().to_string()));
    }
    Ok(())
}

fn classify(e: Errno, shown: &str) -> BeneathError {
    match e {
        Errno::NOENT => BeneathError::Missing(shown.to_string()),
        // ELOOP: a link on the way; EXDEV: a way out of the directory; ENOTDIR: a link or a
        // file where a directory was expected (with O_NOFOLLOW on the root).
        Errno::LOOP | Errno::XDEV | Errno::NOTDIR => BeneathError::Link(shown.to_string()),
        // ENXIO: a FIFO without a reader opened for writing.
        Errno::NXIO => BeneathError::NotRegular(shown.to_string()),
        other => BeneathError::Io {
            path: shown.to_string(),
            source: other.into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let outbox = tmp.path().join("outbox");
        std::fs::create_dir_all(outbox.join("progress")).unwrap();
        std::fs::write(outbox.join("progress/stdout.log"), b"hello\n").unwrap();
        std::fs::write(tmp.path().join("secret"), b"host secret").unwrap();
        (tmp, outbox)
    }

    fn read_all(mut f: File) -> String {
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        s
    }

    #[test]
    fn plain_files_open_and_links_anywhere_on_the_way_do_not() {
        let (tmp, outbox) = setup();
        let root = Beneath::open(&outbox).unwrap();
        let f = root.read(Path::new("progress/stdout.log")).unwrap();
        assert_eq!(read_all(f), "hello\n");

        symlink(
            tmp.path().join("secret"),
            outbox.join("progress/stderr.log"),
        )
        .unwrap();
        let e = root.read(Path::new("progress/stderr.log")).unwrap_err();
        assert!(matches!(e, BeneathError::Link(_)), "{e}");
        let e = root.append(Path::new("progress/stderr.log")).unwrap_err();
        assert!(matches!(e, BeneathError::Link(_)), "{e}");
        assert_eq!(
            std::fs::read(tmp.path().join("secret")).unwrap(),
            b"host secret"
        );

        // A linked directory on the way.
        symlink(tmp.path(), outbox.join("artifacts")).unwrap();
        let e = root.read(Path::new("artifacts/secret")).unwrap_err();
        assert!(matches!(e, BeneathError::Link(_)), "{e}");
        let e = root.dir(Path::new("artifacts")).unwrap_err();
        assert!(matches!(e, BeneathError::Link(_)), "{e}");
        // `..` and absolute names never resolve.
        for bad in ["../secret", "/etc/passwd", ""] {
            assert!(root.read(Path::new(bad)).is_err(), "{bad}");
        }
        let e = root.read(Path::new("progress/none.log")).unwrap_err();
        assert!(e.is_missing(), "{e}");
    }

    #[test]
    fn the_root_itself_must_not_be_a_link() {
        let (tmp, outbox) = setup();
        let linked = tmp.path().join("linked-outbox");
        symlink(&outbox, &linked).unwrap();
        let e = Beneath::open(&linked).unwrap_err();
        assert!(matches!(e, BeneathError::Link(_)), "{e}");
    }

    #[test]
    fn fifos_devices_and_hard_links_are_refused_without_blocking() {
        let (tmp, outbox) = setup();
        let root = Beneath::open(&outbox).unwrap();
        let fifo = outbox.join("progress/fifo.log");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let e = root.read(Path::new("progress/fifo.log")).unwrap_err();
        assert!(matches!(e, BeneathError::NotRegular(_)), "{e}");
        let e = root.append(Path::new("progress/fifo.log")).unwrap_err();
        assert!(matches!(e, BeneathError::NotRegular(_)), "{e}");

        std::fs::hard_link(tmp.path().join("secret"), outbox.join("progress/hard.log")).unwrap();
        let e = root.read(Path::new("progress/hard.log")).unwrap_err();
        assert!(matches!(e, BeneathError::HardLinked(_)), "{e}");
    }

    #[test]
    fn append_creates_and_appends_and_entries_list_kinds_from_the_directory() {
        let (tmp, outbox) = setup();
        let root = Beneath::open(&outbox).unwrap();
        for line in ["a\n", "b\n"] {
            let mut f = root.append(Path::new("progress/events.jsonl")).unwrap();
            f.write_all(line.as_bytes()).unwrap();
        }
        let events = std::fs::read_to_string(outbox.join("progress/events.jsonl")).unwrap();
        assert_eq!(events, "a\nb\n");

        symlink(tmp.path().join("secret"), outbox.join("progress/link")).unwrap();
        std::fs::create_dir(outbox.join("progress/sub")).unwrap();
        let progress = root.dir(Path::new("progress")).unwrap();
        let kinds: Vec<(String, EntryKind)> = progress
            .entries()
            .unwrap()
            .into_iter()
            .map(|e| (e.name.to_string_lossy().into_owned(), e.kind))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("events.jsonl".into(), EntryKind::File),
                ("link".into(), EntryKind::Other),
                ("stdout.log".into(), EntryKind::File),
                ("sub".into(), EntryKind::Dir),
            ]
        );
    }
}
