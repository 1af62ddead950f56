//! The attempt's side of the task directory's disk quota: its size, its stop, its retirement.

use super::TaskDriver;
use squadron_core::task::TaskState;

use crate::runtime::RunStatus;
use crate::task::task_volume::TaskVolume;

impl TaskDriver {
    pub(super) fn volume(&self) -> TaskVolume {
        TaskVolume::of(&self.ctx.config.data_dir, &self.dir)
    }

    /// The task directory's quota: the manifest's `disk`, else the worker's default.
    pub(super) fn disk_quota_bytes(&self) -> u64 {
        self.spec
            .sandbox
            .disk_bytes
            .unwrap_or(self.ctx.config.sandbox_defaults.disk_bytes)
    }

    /// Mounts the quota before anything is written in the task directory (the whole
    /// directory lives inside it), unless the operator turned quotas off.
    pub(super) async fn ensure_volume(&self) -> Result<(), String> {
        if !self.ctx.config.disk_quota {
            self.event(serde_json::json!({"event": "disk_quota_off"}));
            return Ok(());
        }
        let (volume, bytes) = (self.volume(), self.disk_quota_bytes());
        match tokio::task::spawn_blocking(move || volume.ensure(bytes)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(format!("disk quota: {e}")),
        }
    }

    /// Retires the volume once the sandbox is gone: with one still running (a destroy that
    /// failed), walking its outbox could race what it writes, so the volume stays for the
    /// next start's sweep. Whether the task's files are out of it (a task without a volume:
    /// yes).
    pub(super) async fn retire_volume(&self) -> bool {
        if self.sandbox_still_runs().await {
            tracing::error!(task = %self.task, "the sandbox still runs: its volume is not retired");
            return false;
        }
        let volume = self.volume();
        let task = self.task;
        match tokio::task::spawn_blocking(move || volume.retire()).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::error!(%task, error = %e, "cannot retire the task's volume");
                false
            }
            Err(e) => {
                tracing::error!(%task, error = %e, "the volume's retirement panicked");
                false
            }
        }
    }

    /// The task's committed end, if it has one: the checkpoint's record of it, or else (the
    /// checkpoint could not be written, or the control plane ended the task) its own word.
    pub(super) async fn ended(&self) -> Option<TaskState> {
        match self.load_checkpoint().map(|c| c.state) {
            Some(s) if s.is_terminal() => Some(s),
            _ => self
                .ctx
                .control
                .task(self.task)
                .await
                .ok()
                .map(|t| t.state)
                .filter(|s| s.is_terminal()),
        }
    }

    async fn sandbox_still_runs(&self) -> bool {
        let Ok(runtime) = self.runtime() else {
            return false;
        };
        match self.sandbox(&runtime).await {
            Ok(Some(handle)) => matches!(
                runtime.status(&handle).await,
                Ok(RunStatus::Running | RunStatus::Created) | Err(_)
            ),
            Ok(None) => false,
            Err(_) => true,
        }
    }

    /// The error of a task stopped by its disk quota.
    pub(super) fn disk_full_error(&self, bytes: u64) -> String {
        format!(
            "disk quota exceeded: the task's directory used up its {bytes} bytes or its \
             files (sandbox.disk, or the worker's --sandbox-disk)"
        )
    }
}
