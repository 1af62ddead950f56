//! One logical client: records each operation's invocation and completion, takes a fresh
//! process id after an unknown outcome (as Jepsen does), and paces itself to the run's rate.

use std::future::Future;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::Value;
use tokio::time::Instant;

use crate::event::EventType;
use crate::recorder::Recorder;

/// A client's recorder handle and its pacing.
#[derive(Debug)]
pub struct Driver {
    pub process: u64,
    /// Added to the process id after each unknown outcome, so ids never collide.
    stride: u64,
    recorder: Recorder,
    /// Mean pause between this client's operations.
    mean_gap: Duration,
    pub deadline: Instant,
    pub rng: StdRng,
}

impl Driver {
    pub fn new(
        process: u64,
        stride: u64,
        recorder: Recorder,
        mean_gap: Duration,
        deadline: Instant,
        rng: StdRng,
    ) -> Self {
        Self {
            process,
            stride,
            recorder,
            mean_gap,
            deadline,
            rng,
        }
    }

    pub fn done(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Sleeps a random gap (uniform in 0..2×mean), so the clients together run at the rate.
    pub async fn pace(&mut self) {
        let max = (self.mean_gap.as_micros() as u64).saturating_mul(2).max(1);
        let gap = Duration::from_micros(self.rng.gen_range(0..max));
        tokio::time::sleep(gap).await;
    }

    /// Runs one operation: records the invocation, awaits `call`, records the completion.
    /// `call` answers `Ok(output)` or `Err((ok|fail|info, output))`.
    pub async fn op<Fut>(
        &mut self,
        f: &str,
        key: &str,
        input: Value,
        call: Fut,
    ) -> (EventType, Value)
    where
        Fut: Future<Output = Result<Value, (EventType, Value)>>,
    {
        self.recorder.invoke(self.process, f, key, input);
        let (kind, value) = match call.await {
            Ok(v) => (EventType::Ok, v),
            Err(kv) => kv,
        };
        self.recorder
            .complete(self.process, kind, f, key, value.clone());
        if kind == EventType::Info {
            self.process += self.stride;
        }
        (kind, value)
    }
}
