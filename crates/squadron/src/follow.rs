//! `task submit --follow` and `task logs --follow`: state changes and live output, by polling
//! the task and reading its output from the offset reached so far.

use std::io::Write;
use std::time::Duration;

use squadron_client::{Consistency, SquadronClient};
use squadron_core::ids::TaskId;
use squadron_core::task::{Task, TaskState};

/// Pause between two polls of a followed task.
pub const FOLLOW_POLL_MS: u64 = 500;

/// Prints what changed since the last look.
#[derive(Debug)]
pub struct Follower {
    task: TaskId,
    state: Option<TaskState>,
    stdout_offset: u64,
    stderr_offset: u64,
}

impl Follower {
    pub fn new(task: TaskId) -> Self {
        Self {
            task,
            state: None,
            stdout_offset: 0,
            stderr_offset: 0,
        }
    }

    /// Prints a state change (on stderr) and new output (stdout to stdout, stderr to stderr).
    pub async fn show(&mut self, c: &SquadronClient, t: &Task) {
        if self.state != Some(t.state) {
            let mut line = format!("[task {}] {}", self.task, t.state);
            if let Some(code) = t.exit_code {
                line.push_str(&format!(" exit_code={code}"));
            }
            if let Some(e) = &t.error {
                line.push_str(&format!(" error={e}"));
            }
            eprintln!("{line}");
            self.state = Some(t.state);
        }
        if t.worker.is_none() {
            return;
        }
        if let Ok(bytes) = c
            .task_logs(self.task, "stdout", Some(self.stdout_offset), None)
            .await
        {
            self.stdout_offset += bytes.len() as u64;
            let _ = std::io::stdout().write_all(&bytes);
            let _ = std::io::stdout().flush();
        }
        if let Ok(bytes) = c
            .task_logs(self.task, "stderr", Some(self.stderr_offset), None)
            .await
        {
            self.stderr_offset += bytes.len() as u64;
            let _ = std::io::stderr().write_all(&bytes);
        }
    }
}

/// `task logs`: one read, or a follow until the task ends and its output is drained.
pub async fn logs(
    c: &SquadronClient,
    id: TaskId,
    stream: &str,
    tail: Option<u64>,
    follow: bool,
) -> anyhow::Result<()> {
    let first = c.task_logs(id, stream, None, tail).await?;
    std::io::stdout().write_all(&first)?;
    std::io::stdout().flush()?;
    if !follow {
        return Ok(());
    }
    // A tail started somewhere before the end: continue from the end.
    let mut offset = match tail {
        None => first.len() as u64,
        Some(_) => size_of(c, id, stream).await?,
    };
    loop {
        let t = c.get_task(id, Consistency::Linearizable).await?;
        let bytes = c.task_logs(id, stream, Some(offset), None).await?;
        offset += bytes.len() as u64;
        std::io::stdout().write_all(&bytes)?;
        std::io::stdout().flush()?;
        if t.state.is_terminal() && bytes.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(FOLLOW_POLL_MS)).await;
    }
}

/// The current size of a stream, found by reading from offset 0 in pages.
async fn size_of(c: &SquadronClient, id: TaskId, stream: &str) -> anyhow::Result<u64> {
    let mut offset = 0u64;
    loop {
        let bytes = c.task_logs(id, stream, Some(offset), None).await?;
        if bytes.is_empty() {
            return Ok(offset);
        }
        offset += bytes.len() as u64;
    }
}
