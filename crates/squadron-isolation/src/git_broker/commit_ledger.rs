//! The idempotency ledger: which (profile, key) produced which commit, kept across broker
//! restarts (INV-11).
//!
//! A JSON-lines file, `commit-ledger.jsonl` in the broker's state directory. Each accepted
//! commit appends one line and `fdatasync`s it before the answer leaves the broker. The
//! ledger remembers the newest [`LEDGER_ENTRIES_MAX`] entries; the file is rewritten with
//! just those (temporary file, fsync, rename, fsync of the directory) when it holds twice
//! as many lines, so it stays under about `2 × LEDGER_ENTRIES_MAX × 400` bytes. A torn or
//! unreadable line (a crash mid-append) is skipped with a warning and the file rewritten.
//!
//! Forgetting an old entry cannot cause a second commit: the forgotten request names an
//! `expected_head` that its own commit moved past, so a late retry is refused as
//! `head_moved` (or recognised by its digest trailer when its commit is still HEAD).
//! Refusals are not recorded: they wrote nothing, and re-evaluating them cannot accept a
//! stale generation, because generations only rise.

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use atomic_write_file::AtomicWriteFile;
use serde::{Deserialize, Serialize};

use super::broker_error::BrokerError;

/// Entries the ledger remembers; older ones are dropped.
pub const LEDGER_ENTRIES_MAX: usize = 10_000;
/// A ledger line longer than this is treated as corrupt.
const LEDGER_LINE_BYTES_MAX: usize = 4 * 1024;
const LEDGER_FILE: &str = "commit-ledger.jsonl";

/// One accepted commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LedgerEntry {
    pub profile: u64,
    pub key: String,
    /// The request digest (`CommitRequest::digest`).
    pub digest: String,
    pub commit: String,
    pub recorded_ms: u64,
}

type LedgerKey = (u64, String);

/// The ledger; callers serialise access (the broker keeps it behind a mutex).
#[derive(Debug)]
pub(crate) struct CommitLedger {
    dir: PathBuf,
    file: File,
    entries: HashMap<LedgerKey, LedgerEntry>,
    order: VecDeque<LedgerKey>,
    lines_in_file: usize,
}

impl CommitLedger {
    /// Opens (creating) the ledger in `state_dir` and loads its entries.
    pub(crate) fn open(state_dir: &Path) -> Result<CommitLedger, BrokerError> {
        fs::create_dir_all(state_dir)
            .map_err(|e| BrokerError::io("create the broker state dir", state_dir, e))?;
        let path = state_dir.join(LEDGER_FILE);
        let mut entries = HashMap::new();
        let mut order = VecDeque::new();
        let mut needs_rewrite = false;
        let mut lines = 0usize;
        match fs::read(&path) {
            Ok(bytes) => {
                needs_rewrite = !bytes.is_empty() && bytes.last() != Some(&b'\n');
                for (number, line) in bytes.split(|b| *b == b'\n').enumerate() {
                    if line.is_empty() {
                        continue;
                    }
                    lines += 1;
                    match parse_line(line) {
                        Some(entry) => insert(&mut entries, &mut order, entry),
                        None => {
                            tracing::warn!(
                                ledger = %path.display(),
                                line = number + 1,
                                "skipping an unreadable ledger line (torn write?)"
                            );
                            needs_rewrite = true;
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(BrokerError::io("read the commit ledger", &path, e)),
        }
        while order.len() > LEDGER_ENTRIES_MAX {
            if let Some(oldest) = order.pop_front() {
                entries.remove(&oldest);
            }
        }
        let file = open_append(&path)?;
        sync_dir(state_dir)?;
        let mut ledger = CommitLedger {
            dir: state_dir.to_path_buf(),
            file,
            entries,
            order,
            lines_in_file: lines,
        };
        if needs_rewrite || ledger.lines_in_file > ledger.order.len() {
            ledger.rewrite()?;
        }
        Ok(ledger)
    }

    /// The entry recorded for `key` of `profile`, if the ledger still remembers it.
    pub(crate) fn lookup(&self, profile: u64, key: &str) -> Option<&LedgerEntry> {
        self.entries.get(&(profile, key.to_string()))
    }

    /// Appends and syncs `entry`; it is durable when this returns `Ok`.
    pub(crate) fn record(&mut self, entry: LedgerEntry) -> Result<(), BrokerError> {
        let mut line = serde_json::to_vec(&entry)
            .map_err(|e| BrokerError::invalid("ledger entry", e.to_string()))?;
        line.push(b'\n');
        let path = self.dir.join(LEDGER_FILE);
        self.file
            .write_all(&line)
            .map_err(|e| BrokerError::io("append to the commit ledger", &path, e))?;
        self.file
            .sync_data()
            .map_err(|e| BrokerError::io("sync the commit ledger", &path, e))?;
        self.lines_in_file += 1;
        insert(&mut self.entries, &mut self.order, entry);
        while self.order.len() > LEDGER_ENTRIES_MAX {
            if let Some(oldest) = self.order.pop_front() {
                self.entries.remove(&oldest);
            }
        }
        if self.lines_in_file > 2 * LEDGER_ENTRIES_MAX {
            self.rewrite()?;
        }
        Ok(())
    }

    /// Entries remembered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }

    /// Replaces the file with the remembered entries, oldest first.
    fn rewrite(&mut self) -> Result<(), BrokerError> {
        let path = self.dir.join(LEDGER_FILE);
        let mut bytes = Vec::new();
        for key in &self.order {
            if let Some(entry) = self.entries.get(key) {
                let line = serde_json::to_vec(entry)
                    .map_err(|e| BrokerError::invalid("ledger entry", e.to_string()))?;
                bytes.extend_from_slice(&line);
                bytes.push(b'\n');
            }
        }
        // A temporary file, fsynced, renamed over the ledger, and the directory fsynced.
        (|| {
            let mut out = AtomicWriteFile::open(&path)?;
            out.write_all(&bytes)?;
            out.commit()
        })()
        .map_err(|e| BrokerError::io("replace the commit ledger", &path, e))?;
        self.file = open_append(&path)?;
        self.lines_in_file = self.order.len();
        Ok(())
    }
}

fn parse_line(line: &[u8]) -> Option<LedgerEntry> {
    if line.len() > LEDGER_LINE_BYTES_MAX {
        return None;
    }
    serde_json::from_slice(line).ok()
}

fn insert(
    entries: &mut HashMap<LedgerKey, LedgerEntry>,
    order: &mut VecDeque<LedgerKey>,
    entry: LedgerEntry,
) {
    let key = (entry.profile, entry.key.clone());
    if entries.insert(key.clone(), entry).is_some() {
        order.retain(|k| k != &key);
    }
    order.push_back(key);
}

fn open_append(path: &Path) -> Result<File, BrokerError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| BrokerError::io("open the commit ledger", path, e))
}

fn sync_dir(dir: &Path) -> Result<(), BrokerError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| BrokerError::io("sync the broker state dir", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(profile: u64, key: &str, commit: &str) -> LedgerEntry {
        LedgerEntry {
            profile,
            key: key.into(),
            digest: format!("d-{key}"),
            commit: commit.into(),
            recorded_ms: 1,
        }
    }

    #[test]
    fn entries_survive_reopen_and_a_torn_line_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut ledger = CommitLedger::open(dir.path()).unwrap();
            ledger.record(entry(1, "a", "c1")).unwrap();
            ledger.record(entry(2, "a", "c2")).unwrap();
        }
        let path = dir.path().join(LEDGER_FILE);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"profile":3,"key":"tor"#).unwrap();
        drop(file);

        let mut ledger = CommitLedger::open(dir.path()).unwrap();
        assert_eq!(ledger.lookup(1, "a").unwrap().commit, "c1");
        assert_eq!(ledger.lookup(2, "a").unwrap().commit, "c2");
        assert!(ledger.lookup(3, "tor").is_none());
        assert!(
            fs::read(&path).unwrap().ends_with(b"\n"),
            "torn line not rewritten"
        );
        ledger.record(entry(3, "b", "c3")).unwrap();
        drop(ledger);
        let ledger = CommitLedger::open(dir.path()).unwrap();
        assert_eq!(ledger.len(), 3);
        assert_eq!(ledger.lookup(3, "b").unwrap().commit, "c3");
    }

    #[test]
    fn the_ledger_is_bounded_and_drops_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = CommitLedger::open(dir.path()).unwrap();
        let total = 2 * LEDGER_ENTRIES_MAX + 5;
        // One fsync per record would make this slow; the bound is what is under test, so
        // entries go in through the same insert the loader uses, then one record syncs.
        for i in 0..total {
            insert(
                &mut ledger.entries,
                &mut ledger.order,
                entry(1, &format!("k{i}"), "c"),
            );
            ledger.lines_in_file += 1;
        }
        ledger.record(entry(1, "last", "c")).unwrap();
        assert_eq!(ledger.len(), LEDGER_ENTRIES_MAX);
        assert!(ledger.lookup(1, "k0").is_none());
        assert!(ledger.lookup(1, "last").is_some());
        let lines = fs::read_to_string(dir.path().join(LEDGER_FILE))
            .unwrap()
            .lines()
            .count();
        assert_eq!(lines, LEDGER_ENTRIES_MAX);
    }
}
