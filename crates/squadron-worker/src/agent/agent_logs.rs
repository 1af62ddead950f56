//! A profile's provider output, served like a task's (`output_server::serve_logs`): the
//! current generation's `state/{key}/logs/g{n}.stdout.log` and `.stderr.log`. The provider
//! can write that directory, so every open goes beneath it without following a link; while
//! the generation holds credentials, reads show the files through its redactor.

use std::path::PathBuf;

use squadron_api::LogStream;
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{Generation, ProfileId};

use crate::agent::credentials::live_redactor;
use crate::agent::error::AgentError;
use crate::agent::project_sandbox::ProfilePaths;
use crate::agent::state::AttemptStatus;
use crate::agent::supervisor::AgentSupervisor;
use crate::output_server::{source_of, LogFiles, LogSource};
use crate::task::outbox_reader::{open_beneath, OutboxError};

/// One generation's log files, and whether its provider may still write them.
#[derive(Clone)]
pub(crate) struct AgentLogs {
    supervisor: AgentSupervisor,
    profile: ProfileId,
    generation: Generation,
    paths: ProfilePaths,
}

impl AgentLogs {
    /// The logs of the profile's current (or last) generation on this worker; when `pinned`
    /// names a generation, only if that one is still it (a stream that goes on from a read
    /// must not apply the read's offsets to the next generation's files).
    pub(crate) fn current(
        supervisor: &AgentSupervisor,
        profile: ProfileId,
        pinned: Option<Generation>,
    ) -> Result<Self, AgentError> {
        let state = supervisor.state(profile)?;
        if let Some(asked) = pinned.filter(|g| *g != state.generation) {
            return Err(AgentError::new(
                ErrorCode::Conflict,
                format!(
                    "generation {asked} of profile {profile} is no longer its current one \
                     (now {}): read its output afresh",
                    state.generation
                ),
            ));
        }
        let sandbox = supervisor.sandbox_of_project(&state.tenant, &state.project)?;
        Ok(AgentLogs {
            supervisor: supervisor.clone(),
            profile,
            generation: state.generation,
            paths: sandbox.profile_paths(&state.key),
        })
    }

    fn file_name(&self, stream: LogStream) -> Result<PathBuf, OutboxError> {
        let suffix = match stream {
            LogStream::Stdout | LogStream::All => "stdout",
            LogStream::Stderr => "stderr",
            LogStream::Events => {
                return Err(OutboxError::BadName(
                    "a provider has no events log: stream=stdout or stderr".into(),
                ))
            }
        };
        Ok(PathBuf::from(format!("g{}.{suffix}.log", self.generation)))
    }

    pub(crate) fn generation(&self) -> Generation {
        self.generation
    }
}

impl LogFiles for AgentLogs {
    async fn open(&self, stream: LogStream) -> Result<(LogSource, u64), OutboxError> {
        let name = self.file_name(stream)?;
        let (paths, generation) = (self.paths.clone(), self.generation);
        let (file, redactor) = tokio::task::spawn_blocking(move || {
            (
                open_beneath(&paths.logs, &name),
                live_redactor(&paths, generation),
            )
        })
        .await
        .map_err(|e| OutboxError::Io(format!("reading the provider's log: {e}")))?;
        let redactor = redactor.map_err(OutboxError::Refused)?;
        source_of(
            file?,
            redactor.map(std::sync::Arc::new),
            "the provider's log",
        )
        .await
    }

    /// While it runs, and while a stop or takeover gives it its grace: what it writes then
    /// (its last words, its capsule) is output too.
    fn writing(&self) -> bool {
        self.supervisor.state(self.profile).is_ok_and(|s| {
            s.generation == self.generation
                && matches!(s.status, AttemptStatus::Running | AttemptStatus::Stopping)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The provider owns its logs directory: a link it plants in place of its log is refused,
    /// never followed to the file it names; a log not written yet is no error.
    #[test]
    fn a_link_in_place_of_a_providers_log_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, "not for the provider").unwrap();
        let logs = tmp.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        std::os::unix::fs::symlink(&secret, logs.join("g1.stdout.log")).unwrap();
        let refused = open_beneath(&logs, Path::new("g1.stdout.log"));
        assert!(
            matches!(refused, Err(OutboxError::Refused(_))),
            "{:?}",
            refused.map(|f| f.is_some())
        );
        let missing = open_beneath(&logs, Path::new("g1.stderr.log")).unwrap();
        assert!(missing.is_none());
        std::fs::write(logs.join("g2.stdout.log"), "hello").unwrap();
        assert!(open_beneath(&logs, Path::new("g2.stdout.log"))
            .unwrap()
            .is_some());
    }
}
