//! A warm sandbox's wait for its task: the container started before any task was known
//! (the worker's pool), so the agent waits for the launch file the worker writes once it
//! claimed the container and bound the task's directories into it, then runs that launch.

use std::path::Path;
use std::time::Duration;

use squadron_api::agent_channel::{PooledLaunch, POOLED_LAUNCH_BYTES_MAX};
use tokio::signal::unix::{signal, SignalKind};

use crate::agent_env::read_bounded;
use crate::error::AgentError;

/// How often a waiting agent looks for its launch file. A look is one `stat` of a file in a
/// directory the host binds in, which inotify would not report (the mount, not a write,
/// makes it appear), so the agent polls.
pub const LAUNCH_POLL_MS: u64 = 10;

/// Waits for the launch file (in the task's `run/`, which the sandbox cannot write: the
/// worker alone says what runs) and reads it; `None` when SIGTERM came first (the pool was
/// emptied).
pub async fn wait(path: &Path) -> Result<Option<PooledLaunch>, AgentError> {
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|e| AgentError::Launch(e.to_string()))?;
    let mut tick = tokio::time::interval(Duration::from_millis(LAUNCH_POLL_MS));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = terminate.recv() => return Ok(None),
        }
        match std::fs::symlink_metadata(path) {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(AgentError::io("look for", path, e)),
        }
    }
    let text = read_bounded(path, POOLED_LAUNCH_BYTES_MAX)?;
    let launch: PooledLaunch = serde_json::from_str(&text).map_err(|e| AgentError::Env {
        path: path.to_path_buf(),
        message: format!("not a launch: {e}"),
    })?;
    if launch.argv.is_empty() {
        return Err(AgentError::Env {
            path: path.to_path_buf(),
            message: "argv is empty".into(),
        });
    }
    Ok(Some(launch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_launch_is_read_once_it_appears() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("launch.json");
        let writer = {
            let path = path.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let launch = PooledLaunch {
                    argv: vec!["/bin/true".into()],
                    workdir: "/mnt/inbox".into(),
                    env: [("HOME".to_string(), "/tmp".to_string())].into(),
                };
                std::fs::write(&path, serde_json::to_vec(&launch).unwrap()).unwrap();
            })
        };
        let launch = wait(&path).await.unwrap().unwrap();
        writer.await.unwrap();
        assert_eq!(launch.argv, ["/bin/true"]);
        assert_eq!(launch.workdir, "/mnt/inbox");
        assert_eq!(launch.env["HOME"], "/tmp");
    }

    #[tokio::test]
    async fn a_launch_file_that_is_not_one_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for (text, why) in [
            (r#"{"argv":[],"workdir":"/","env":{}}"#, "argv is empty"),
            (r#"{"argv":["/bin/true"],"workdir":"/"}"#, "not a launch"),
            (
                r#"{"argv":["/bin/true"],"workdir":"/","env":{},"user":"root"}"#,
                "not a launch",
            ),
        ] {
            let path = dir.path().join("launch.json");
            std::fs::write(&path, text).unwrap();
            let err = wait(&path).await.unwrap_err().to_string();
            assert!(err.contains(why) && err.contains("launch.json"), "{err}");
        }
    }
}
