//! PROVISIONING's loop: adopt or provision, retrying a refusal per the task's table.

use std::time::Duration;

use backon::Retryable;

use crate::error::WorkerError;
use crate::runtime::{LaunchSpec, Runtime, SandboxHandle};

/// Why provisioning gave up.
#[derive(Debug)]
pub(super) enum ProvisionFailure {
    /// Looking for a sandbox of an earlier life failed; not retried.
    Adopt(WorkerError),
    /// The runtime refused on the first try and on every retry.
    Failed(WorkerError),
    /// One try outlived the provision timeout; not retried.
    TimedOut,
}

/// PROVISIONING: adopts the attempt's sandbox if an earlier life made it, else provisions
/// one, each try bounded by `limit`. A refusal is retried after the next of `pauses` (the
/// task's `lifecycle.retries.provision` table); `on_retry` hears of each retry (its number
/// from 1, the error, the pause in ms) before `sleeper` waits.
pub(super) async fn provision_sandbox(
    runtime: &dyn Runtime,
    spec: &LaunchSpec,
    limit: Duration,
    pauses: impl backon::Backoff,
    sleeper: impl backon::Sleeper,
    mut on_retry: impl FnMut(u32, &WorkerError, u64),
) -> Result<SandboxHandle, ProvisionFailure> {
    let mut retry = 0u32;
    let once = || async {
        let adopted = runtime
            .adopt(spec.task, spec.attempt, &spec.dir)
            .await
            .map_err(ProvisionFailure::Adopt)?;
        if let Some(h) = adopted {
            return Ok(h);
        }
        match tokio::time::timeout(limit, runtime.provision(spec)).await {
            Ok(Ok(h)) => Ok(h),
            Ok(Err(e)) => Err(ProvisionFailure::Failed(e)),
            Err(_) => Err(ProvisionFailure::TimedOut),
        }
    };
    once.retry(pauses)
        .sleep(sleeper)
        .when(|f| matches!(f, ProvisionFailure::Failed(_)))
        .notify(|f, pause| {
            if let ProvisionFailure::Failed(e) = f {
                retry += 1;
                on_retry(retry, e, pause.as_millis() as u64);
            }
        })
        .await
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use squadron_core::ids::TaskId;
    use squadron_core::manifest::{NetworkMode, RetryPolicy, RuntimeKind};

    use super::*;
    use crate::retry;
    use crate::runtime::{ReapReport, RunStatus, SandboxLimits};
    use crate::task::task_dir::TaskDir;

    /// Refuses the first `refusals` provisions, then hands out a sandbox.
    #[derive(Debug)]
    struct FlakyRuntime {
        refusals: u32,
        provisions: AtomicU32,
    }

    #[async_trait]
    impl Runtime for FlakyRuntime {
        fn kind(&self) -> RuntimeKind {
            RuntimeKind::Process
        }
        async fn provision(&self, _: &LaunchSpec) -> Result<SandboxHandle, WorkerError> {
            let n = self.provisions.fetch_add(1, Ordering::SeqCst);
            if n < self.refusals {
                return Err(WorkerError::runtime("flaky", format!("refusal {}", n + 1)));
            }
            Ok(SandboxHandle {
                runtime: RuntimeKind::Process,
                id: "sandbox".into(),
            })
        }
        async fn start(&self, _: &SandboxHandle, _: &LaunchSpec) -> Result<(), WorkerError> {
            Err(WorkerError::runtime("flaky", "not used"))
        }
        async fn sandboxes(&self) -> Result<Vec<String>, WorkerError> {
            Err(WorkerError::runtime("flaky", "not used"))
        }
        async fn status(&self, _: &SandboxHandle) -> Result<RunStatus, WorkerError> {
            Err(WorkerError::runtime("flaky", "not used"))
        }
        async fn terminate(&self, _: &SandboxHandle, _: Duration) -> Result<(), WorkerError> {
            Err(WorkerError::runtime("flaky", "not used"))
        }
        async fn destroy(&self, _: &SandboxHandle) -> Result<ReapReport, WorkerError> {
            Err(WorkerError::runtime("flaky", "not used"))
        }
        async fn adopt(
            &self,
            _: TaskId,
            _: u32,
            _: &TaskDir,
        ) -> Result<Option<SandboxHandle>, WorkerError> {
            Ok(None)
        }
        async fn break_glass(&self, _: &SandboxHandle) -> String {
            String::new()
        }
        fn sandbox_owner(&self, _: &LaunchSpec) -> Result<(u32, u32), WorkerError> {
            Err(WorkerError::runtime("flaky", "not used"))
        }
    }

    fn launch_spec(tmp: &std::path::Path) -> LaunchSpec {
        let task = TaskId::new(1).unwrap();
        LaunchSpec {
            task,
            attempt: 1,
            dir: TaskDir::new(tmp, task),
            argv: vec!["/bin/true".into()],
            workdir: "/mnt/inbox".into(),
            env: BTreeMap::new(),
            limits: SandboxLimits::default(),
            network: NetworkMode::Isolated,
            full_control: false,
            global_dir: None,
            credentials: None,
            egress: None,
            keep_after_exit: false,
        }
    }

    /// Provisions against a runtime refusing `refusals` times under the seed's default
    /// policy; returns the outcome, the pauses taken and the retries heard of.
    async fn provision_refused(
        refusals: u32,
    ) -> (
        Result<SandboxHandle, ProvisionFailure>,
        Vec<Duration>,
        Vec<(u32, u64)>,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let runtime = FlakyRuntime {
            refusals,
            provisions: AtomicU32::new(0),
        };
        let policy = RetryPolicy::default().provision;
        let slept = Arc::new(Mutex::new(Vec::new()));
        let recorder = slept.clone();
        let mut heard = Vec::new();
        let outcome = provision_sandbox(
            &runtime,
            &launch_spec(tmp.path()),
            Duration::from_secs(5),
            retry::table(&policy, None),
            move |d| {
                recorder.lock().unwrap().push(d);
                std::future::ready(())
            },
            |retry, _, delay_ms| heard.push((retry, delay_ms)),
        )
        .await;
        let slept = slept.lock().unwrap().clone();
        (outcome, slept, heard)
    }

    /// The seed's retry table: "VM provision — 2 retries — 10s, 30s".
    #[tokio::test]
    async fn provisioning_retries_wait_ten_then_thirty_seconds() {
        let (outcome, slept, heard) = provision_refused(2).await;
        assert_eq!(outcome.unwrap().id, "sandbox");
        assert_eq!(slept, [Duration::from_secs(10), Duration::from_secs(30)]);
        assert_eq!(heard, [(1, 10_000), (2, 30_000)]);

        let (outcome, slept, _) = provision_refused(3).await;
        match outcome {
            Err(ProvisionFailure::Failed(e)) => assert!(e.to_string().contains("refusal 3"), "{e}"),
            other => panic!("a third refusal must end provisioning: {other:?}"),
        }
        assert_eq!(slept, [Duration::from_secs(10), Duration::from_secs(30)]);
    }
}
