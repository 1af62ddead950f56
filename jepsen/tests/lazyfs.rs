//! The lazy fault filesystem on a real FUSE mount: unsynced data is readable until a crash
//! and gone after it; fsynced data, renames and truncations behave as on a disk that lost
//! power; a crashed process's late writes are refused.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

use squadron_jepsen::lazyfs::LazyMount;

fn mounted() -> (tempfile::TempDir, LazyMount, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("data");
    let lazy = LazyMount::mount(&dir.path().join("disk"), &mnt).expect("mount (root, /dev/fuse)");
    (dir, lazy, mnt)
}

fn read(path: &std::path::Path) -> Vec<u8> {
    let mut v = Vec::new();
    File::open(path)
        .expect("open")
        .read_to_end(&mut v)
        .expect("read");
    v
}

#[test]
fn unsynced_writes_are_read_back_then_lost_in_a_crash() {
    let (dir, lazy, mnt) = mounted();
    let mut a = File::create(mnt.join("a")).expect("create a");
    a.write_all(b"synced").expect("write");
    a.sync_data().expect("fdatasync");
    a.write_all(b"+lost").expect("append");
    std::fs::write(mnt.join("b"), b"never synced").expect("write b");
    assert_eq!(read(&mnt.join("a")), b"synced+lost");
    assert_eq!(read(&mnt.join("b")), b"never synced");
    // Nothing unsynced has reached the disk underneath.
    assert_eq!(read(&dir.path().join("disk/a")), b"synced");
    assert_eq!(read(&dir.path().join("disk/b")), b"");
    drop(a);

    let (files, bytes) = lazy.crash();
    assert_eq!((files, bytes), (2, 5 + 12));
    assert_eq!(read(&mnt.join("a")), b"synced");
    assert_eq!(std::fs::metadata(mnt.join("a")).expect("stat").len(), 6);
    // Metadata is durable at once: b exists, empty.
    assert_eq!(read(&mnt.join("b")), b"");
    let stats = lazy.stats();
    assert_eq!((stats.crashes, stats.lost_files, stats.fsyncs), (1, 2, 1));
}

#[test]
fn a_crashed_process_cannot_write_until_restart() {
    let (_dir, lazy, mnt) = mounted();
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(mnt.join("wal"))
        .expect("create");
    lazy.crash();
    let err = f.write_at(b"late", 0).expect_err("a write after the crash");
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert_eq!(lazy.stats().fenced_writes, 1);
    lazy.restart();
    f.write_at(b"fresh", 0).expect("a write after restart");
    f.sync_all().expect("fsync");
    lazy.crash();
    assert_eq!(read(&mnt.join("wal")), b"fresh");
}

#[test]
fn a_renamed_file_keeps_its_unsynced_data_and_a_truncation_is_undone_by_a_crash() {
    let (_dir, lazy, mnt) = mounted();
    std::fs::write(mnt.join("tmp"), b"0123456789").expect("write");
    File::open(mnt.join("tmp"))
        .expect("open")
        .sync_all()
        .expect("fsync");
    // Write-then-rename without a sync: the classic lost-file bug.
    std::fs::write(mnt.join("tmp2"), b"replacement").expect("write");
    std::fs::rename(mnt.join("tmp2"), mnt.join("current")).expect("rename");
    assert_eq!(read(&mnt.join("current")), b"replacement");
    let f = OpenOptions::new()
        .write(true)
        .open(mnt.join("tmp"))
        .expect("open");
    f.set_len(4).expect("truncate");
    assert_eq!(read(&mnt.join("tmp")), b"0123");
    drop(f);
    lazy.crash();
    assert_eq!(
        read(&mnt.join("current")),
        b"",
        "the rename survived, the data did not"
    );
    assert_eq!(read(&mnt.join("tmp")), b"0123456789");
    let names: Vec<String> = std::fs::read_dir(&mnt)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn an_unlinked_file_takes_its_unsynced_data_with_it() {
    let (_dir, lazy, mnt) = mounted();
    std::fs::write(mnt.join("gone"), vec![7u8; 4096]).expect("write");
    std::fs::remove_file(mnt.join("gone")).expect("unlink");
    assert_eq!(lazy.crash(), (0, 0));
    lazy.restart();
    std::fs::create_dir(mnt.join("sub")).expect("mkdir");
    std::fs::write(mnt.join("sub/x"), b"x").expect("write in a subdirectory");
    std::fs::rename(mnt.join("sub"), mnt.join("moved")).expect("rename a directory");
    let f = OpenOptions::new()
        .append(true)
        .open(mnt.join("moved/x"))
        .expect("open under the new name");
    f.sync_all().expect("fsync");
    lazy.crash();
    assert_eq!(
        read(&mnt.join("moved/x")),
        b"x",
        "the fsync under the new name kept it"
    );
}

/// As on a disk, a file open when it is renamed over or unlinked stays readable through its
/// handle, unsynced bytes included, until it is closed. A node reading its snapshot file to
/// send it while a newer snapshot replaced it met ENOENT here and stopped its Raft core (the
/// 1,000 ops/s chaos matrix's `crash` and `mix` runs).
#[test]
fn a_file_renamed_over_or_unlinked_while_open_stays_readable_through_its_handle() {
    let (_dir, _lazy, mnt) = mounted();
    let mut old = File::create(mnt.join("current.snap")).expect("create");
    old.write_all(b"old snapshot").expect("write");
    old.sync_all().expect("fsync");
    old.write_all(b", unsynced tail").expect("append");
    let reader = File::open(mnt.join("current.snap")).expect("open for reading");

    let mut new = File::create(mnt.join("current.snap.tmp")).expect("create new");
    new.write_all(b"new snapshot").expect("write new");
    new.sync_all().expect("fsync new");
    std::fs::rename(mnt.join("current.snap.tmp"), mnt.join("current.snap")).expect("rename");

    let mut buf = vec![0u8; 64];
    let n = reader.read_at(&mut buf, 0).expect("read the replaced file");
    assert_eq!(&buf[..n], b"old snapshot, unsynced tail");
    assert_eq!(reader.metadata().expect("fstat").len(), 27);
    assert_eq!(read(&mnt.join("current.snap")), b"new snapshot");

    let doomed = File::open(mnt.join("current.snap")).expect("open the new one");
    std::fs::remove_file(mnt.join("current.snap")).expect("unlink");
    let n = doomed.read_at(&mut buf, 0).expect("read the unlinked file");
    assert_eq!(&buf[..n], b"new snapshot");
    assert!(!mnt.join("current.snap").exists());
    drop((old, reader, new, doomed));

    // Closed, the orphans are gone: a new file by the old name starts empty.
    std::fs::write(mnt.join("current.snap"), b"").expect("recreate");
    assert_eq!(read(&mnt.join("current.snap")), b"");
}
