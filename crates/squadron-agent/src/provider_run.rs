//! Runs the provider launcher the worker prepared (`/mnt/run/launch.sh`, which sends the
//! provider's output to the task's progress files itself, so the output survives the agent and
//! the worker alike) and hands on a stop: SIGTERM to the agent goes to the launcher's whole
//! process group.

use std::process::ExitStatus;

use squadron_api::agent_channel::{PooledLaunch, AGENT_LIBRARY_DIR};
use tokio::signal::unix::{signal, SignalKind};

use crate::error::AgentError;

/// The exit code of a run; 128 + n when the launcher was killed by signal n, as a shell says.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// What the provider runs.
#[derive(Debug, Clone)]
pub enum Launch {
    /// The command line's launcher, in the sandbox's own environment and directory.
    CommandLine(Vec<String>),
    /// A warm sandbox's launch file: the task's environment over the container's, and the
    /// task's directory.
    Pooled(PooledLaunch),
}

impl Launch {
    fn argv(&self) -> &[String] {
        match self {
            Launch::CommandLine(argv) => argv,
            Launch::Pooled(p) => &p.argv,
        }
    }
}

pub async fn run(launch: &Launch) -> Result<i32, AgentError> {
    let (program, args) = launch
        .argv()
        .split_first()
        .ok_or_else(|| AgentError::Launch("no launcher given".into()))?;
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|e| AgentError::Launch(e.to_string()))?;
    let mut command = tokio::process::Command::new(program);
    // The worker's libraries are the agent's (the sandbox's `LD_LIBRARY_PATH` names them for
    // it alone); the provider gets the image's own.
    if std::env::var_os("LD_LIBRARY_PATH").is_some_and(|v| v == AGENT_LIBRARY_DIR) {
        command.env_remove("LD_LIBRARY_PATH");
    }
    // The task's environment over the container's own (the image's, as a cold container's
    // provider has it), in the task's directory.
    if let Launch::Pooled(p) = launch {
        command.envs(&p.env).current_dir(&p.workdir);
    }
    let mut child = command
        .args(args)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| AgentError::Launch(format!("{program}: {e}")))?;
    let group = child
        .id()
        .and_then(|id| rustix::process::Pid::from_raw(id as i32))
        .ok_or_else(|| AgentError::Launch("the launcher has no pid".into()))?;
    tracing::info!(%program, pid = group.as_raw_nonzero().get(), "provider launcher started");
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| AgentError::Launch(e.to_string()))?;
                return Ok(exit_code(status));
            }
            _ = terminate.recv() => {
                tracing::info!("SIGTERM: stopping the provider");
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::TERM);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_launchers_exit_code_is_the_agents() {
        let sh =
            |script: &str| Launch::CommandLine(vec!["/bin/sh".into(), "-c".into(), script.into()]);
        assert_eq!(run(&sh("exit 7")).await.unwrap(), 7);
        assert_eq!(run(&sh("kill -9 $$")).await.unwrap(), 137);
        let err = run(&Launch::CommandLine(vec!["/nonexistent/launcher".into()]))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/launcher"), "{err}");
    }

    #[tokio::test]
    async fn a_pooled_launch_runs_in_its_directory_with_its_environment_over_the_sandboxs() {
        let dir = tempfile::tempdir().unwrap();
        let workdir = dir.path().canonicalize().unwrap();
        // The container's own environment (here the test runner's, CARGO_*) stays, as a cold
        // container's image environment does.
        let script = format!(
            r#"[ "$(pwd)" = "{}" ] && [ "$TASK_VALUE" = given ] && [ -n "$CARGO_PKG_NAME" ] || exit 3"#,
            workdir.display()
        );
        let launch = Launch::Pooled(PooledLaunch {
            argv: vec!["/bin/sh".into(), "-c".into(), script],
            workdir: workdir.display().to_string(),
            env: [("TASK_VALUE".to_string(), "given".to_string())].into(),
        });
        assert_eq!(run(&launch).await.unwrap(), 0);
    }
}
