//! The attempt's side of the task directory's disk quota: its size, its stop, its retirement.

use super::TaskDriver;
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

    pub(super) async fn retire_volume(&self) {
        let volume = self.volume();
        let task = self.task;
        match tokio::task::spawn_blocking(move || volume.retire()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(%task, error = %e, "cannot retire the task's volume"),
            Err(e) => tracing::error!(%task, error = %e, "the volume's retirement panicked"),
        }
    }

    /// The error of a task stopped by its disk quota.
    pub(super) fn disk_full_error(&self, bytes: u64) -> String {
        format!(
            "disk quota exceeded: the task's directory used up its {bytes} bytes \
             (sandbox.disk, or the worker's --sandbox-disk)"
        )
    }
}
