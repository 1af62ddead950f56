//! Counts a task's output from its progress files (bytes, lines, events) without holding the
//! output in memory: only the bytes appended since the last look are read. The counters go to
//! the control plane; the output itself never does.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use squadron_isolation::beneath::Beneath;

use crate::task::task_dir::{TaskDir, EVENTS_LOG, STDERR_LOG, STDOUT_LOG};

/// Most bytes read from one file per look; the rest is read next time.
pub(crate) const COUNT_READ_BYTES_MAX: u64 = 4 * 1024 * 1024;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OutputCounts {
    pub(crate) stdout_bytes: u64,
    pub(crate) stderr_bytes: u64,
    pub(crate) lines: u64,
    pub(crate) events: u64,
}

#[derive(Debug)]
struct CountedFile {
    /// The outbox; `name` beneath it (the sandbox writes there: no link is followed).
    outbox: PathBuf,
    name: &'static str,
    offset: u64,
    newlines: u64,
}

impl CountedFile {
    fn new(dir: &TaskDir, name: &'static str) -> Self {
        Self {
            outbox: dir.outbox(),
            name,
            offset: 0,
            newlines: 0,
        }
    }

    /// Reads what was appended since the last call. A file that shrank (replaced) is
    /// counted again from its start.
    fn advance(&mut self) -> u64 {
        let opened = Beneath::open(&self.outbox).and_then(|o| o.read(Path::new(self.name)));
        let Ok(mut f) = opened else {
            return self.offset;
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            self.offset = 0;
            self.newlines = 0;
        }
        let want = (len - self.offset).min(COUNT_READ_BYTES_MAX);
        if want == 0 || f.seek(SeekFrom::Start(self.offset)).is_err() {
            return self.offset;
        }
        let mut buf = Vec::new();
        if let Ok(n) = f.take(want).read_to_end(&mut buf) {
            self.newlines += buf[..n].iter().filter(|b| **b == b'\n').count() as u64;
            self.offset += n as u64;
        }
        self.offset
    }
}

/// Incremental counters over one task's progress files.
#[derive(Debug)]
pub(crate) struct OutputCounter {
    stdout: CountedFile,
    stderr: CountedFile,
    events: CountedFile,
}

impl OutputCounter {
    pub(crate) fn new(dir: &TaskDir) -> Self {
        Self {
            stdout: CountedFile::new(dir, STDOUT_LOG),
            stderr: CountedFile::new(dir, STDERR_LOG),
            events: CountedFile::new(dir, EVENTS_LOG),
        }
    }

    pub(crate) fn look(&mut self) -> OutputCounts {
        let stdout_bytes = self.stdout.advance();
        let stderr_bytes = self.stderr.advance();
        self.events.advance();
        OutputCounts {
            stdout_bytes,
            stderr_bytes,
            lines: self.stdout.newlines + self.stderr.newlines,
            events: self.events.newlines,
        }
    }
}

/// Appends one structured event line to `events.jsonl` (never through a link the sandbox
/// put in its place).
pub(crate) fn append_event(dir: &TaskDir, event: &serde_json::Value) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = dir
        .outbox_beneath()
        .and_then(|o| o.append(Path::new(EVENTS_LOG)))
        .map_err(std::io::Error::other)?;
    let mut line = serde_json::to_vec(event).map_err(std::io::Error::other)?;
    line.push(b'\n');
    f.write_all(&line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use squadron_core::ids::TaskId;
    use std::io::Write;

    #[test]
    fn counts_grow_with_appended_output_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = TaskDir::new(tmp.path(), TaskId::new(3).unwrap());
        std::fs::create_dir_all(dir.progress()).unwrap();
        let mut c = OutputCounter::new(&dir);
        assert_eq!(c.look(), OutputCounts::default());
        let mut out = std::fs::File::create(dir.stdout_log()).unwrap();
        out.write_all(b"one\ntwo\nthr").unwrap();
        std::fs::write(dir.stderr_log(), b"err\n").unwrap();
        append_event(&dir, &serde_json::json!({"event": "x"})).unwrap();
        let a = c.look();
        assert_eq!(
            (a.stdout_bytes, a.stderr_bytes, a.lines, a.events),
            (11, 4, 3, 1)
        );
        out.write_all(b"ee\n").unwrap();
        let b = c.look();
        assert_eq!((b.stdout_bytes, b.lines), (14, 4));
        assert_eq!(
            c.look(),
            b,
            "a second look without new output changes nothing"
        );
    }
}
