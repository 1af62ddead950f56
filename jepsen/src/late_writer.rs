//! The `worker-pause` fault's late writers: the generations whose worker was paused, each
//! trying to commit once the worker runs again — a capsule to the control plane
//! (`late-commit`), and a Git commit through the worker's own broker socket, as the paused
//! generation's provider would (`late-git-commit`). The pause lasts until the leader has
//! fenced every such lease for its expiry, so each of those commits comes from a writer past
//! its lease, and must be refused (INV-6; `invariants.rs` counts any success as a dual
//! writer). They are sent at once after SIGCONT: the window in which the worker has not yet
//! noticed its leases ran out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};
use squadron_client::{Consistency, SquadronClient};
use squadron_core::ids::{Generation, LeaseId, ProfileId, ProfileKey};
use squadron_core::lease::LeaseState;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client_takeover::{takeover_key, TakeoverClient};
use crate::driver::Driver;
use crate::event::EventType;
use crate::recorder::Recorder;
use crate::workload_context::WorkloadContext;

/// Process ids of the late commits start here (clients use small ids, the final reads
/// `FINAL_PROCESS_BASE`); each heal's commits take ids from `now_ms × LATE_IDS_PER_HEAL`.
pub const LATE_PROCESS_BASE: u64 = 2_000_000;
/// Ids one heal's late commits may use: two per writer (Git, capsule).
const LATE_IDS_PER_HEAL: u64 = 64;
/// The most writers one heal captures, so their ids stay within `LATE_IDS_PER_HEAL`.
const WRITERS_MAX: usize = (LATE_IDS_PER_HEAL / 2) as usize;
/// Most time the pause is held past the fault's length for the leader to fence the leases.
pub const FENCE_WAIT_MS_MAX: u64 = 30_000;
/// Poll interval of that wait.
const FENCE_POLL_MS: u64 = 250;
/// How long one broker request may take before its outcome is unknown.
const BROKER_ANSWER_MS_MAX: u64 = 10_000;
/// The longest broker answer read.
const BROKER_ANSWER_BYTES_MAX: u64 = 64 * 1024;

/// One paused generation.
#[derive(Debug, Clone)]
struct Writer {
    profile: ProfileId,
    key: ProfileKey,
    lease: LeaseId,
    generation: Generation,
}

/// The live leases of the profiles when their worker was paused.
#[derive(Debug, Default)]
pub struct LateWriters {
    writers: Vec<Writer>,
    /// The worker's data directory (its broker sockets and the project's worktrees).
    worker_data: PathBuf,
    /// The project's sandbox directory under it.
    project_dir: PathBuf,
}

impl LateWriters {
    /// Reads every profile's live lease from the replicated state (the worker is paused; the
    /// cluster answers). `worker_data` is the paused worker's data directory.
    pub async fn capture(
        client: &SquadronClient,
        ctx: &WorkloadContext,
        worker_data: &Path,
    ) -> Self {
        let mut writers = Vec::new();
        for p in ctx.profiles.iter().take(WRITERS_MAX) {
            if let Ok(profile) = client.get_profile(*p, Consistency::Linearizable).await {
                if let Some(lease) = profile.live_lease {
                    writers.push(Writer {
                        profile: *p,
                        key: profile.key,
                        lease,
                        generation: profile.generation,
                    });
                }
            }
        }
        Self {
            writers,
            worker_data: worker_data.into(),
            project_dir: worker_data
                .join("projects")
                .join(ctx.tenant.as_str())
                .join(ctx.project.as_str()),
        }
    }

    pub fn len(&self) -> usize {
        self.writers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.writers.is_empty()
    }

    /// Waits until the leader has ended every captured lease (fenced for its expiry, or
    /// reaped), then keeps only those writers: a lease still active past the bound (a heal
    /// that failed, a skewed clock) may rightly be renewed by the resumed worker, and its
    /// commit would be no dual writer. Returns the leases left out.
    pub async fn keep_fenced(&mut self, client: &SquadronClient) -> Vec<LeaseId> {
        let deadline = Instant::now() + Duration::from_millis(FENCE_WAIT_MS_MAX);
        loop {
            let mut active = Vec::new();
            for w in &self.writers {
                let ended = client
                    .get_lease(w.lease, Consistency::Linearizable)
                    .await
                    .is_ok_and(|l| l.state != LeaseState::Active);
                if !ended {
                    active.push(w.lease);
                }
            }
            if active.is_empty() || Instant::now() >= deadline {
                self.writers.retain(|w| !active.contains(&w.lease));
                return active;
            }
            tokio::time::sleep(Duration::from_millis(FENCE_POLL_MS)).await;
        }
    }

    /// Each captured generation's Git commit, sent through the worker's broker socket while
    /// the worker is still stopped — as a provider's last request would sit in the socket's
    /// backlog — and answered once it runs again. Returns the requests' tasks.
    pub async fn send_git_commits(&self, recorder: &Recorder) -> Vec<JoinHandle<String>> {
        let base = LATE_PROCESS_BASE + recorder.now_ms() as u64 * LATE_IDS_PER_HEAL;
        let mut sent = Vec::new();
        let tasks = self
            .writers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let socket = self
                    .worker_data
                    .join("agent-sockets")
                    .join(format!("p{}", w.profile.get()))
                    .join("git.sock");
                let worktree = self.project_dir.join("worktrees").join(w.key.as_str());
                let driver = late_driver(recorder, base + 2 * i as u64, i);
                let (tx, rx) = tokio::sync::oneshot::channel();
                sent.push(rx);
                tokio::spawn(git_commit(driver, w.clone(), socket, worktree, tx))
            })
            .collect();
        // Every request in its socket before the worker runs again (a request that failed
        // to go drops its sender, which ends the wait as well).
        for rx in sent {
            let _ = tokio::time::timeout(Duration::from_millis(BROKER_ANSWER_MS_MAX), rx).await;
        }
        tasks
    }

    /// After the worker runs again: each captured generation's capsule commit to the control
    /// plane, then the Git commits' answers. Returns the counts.
    pub async fn commit(
        &self,
        client: &SquadronClient,
        recorder: &Recorder,
        git: Vec<JoinHandle<String>>,
    ) -> Value {
        let base = LATE_PROCESS_BASE + recorder.now_ms() as u64 * LATE_IDS_PER_HEAL + 1;
        let mut refused = 0;
        for (i, w) in self.writers.iter().enumerate() {
            let driver = late_driver(recorder, base + 2 * i as u64, i);
            let mut c = TakeoverClient::new(client.clone(), driver, Vec::new(), Vec::new());
            let kind = c
                .stale_commit("late-commit", w.profile, w.lease, w.generation)
                .await;
            if kind == Some(EventType::Fail) {
                refused += 1;
            }
        }
        // By answer: `accepted`, the broker's refusal code, `unreachable` (no listener: the
        // worker had already ended the attempt), `unknown` (no answer).
        let mut git_answers = BTreeMap::<String, u32>::new();
        for task in git {
            let answer = task.await.unwrap_or_else(|_| "unknown".into());
            *git_answers.entry(answer).or_default() += 1;
        }
        json!({
            "late_commits": self.writers.len(),
            "refused": refused,
            "git": git_answers,
        })
    }
}

fn late_driver(recorder: &Recorder, process: u64, seed: usize) -> Driver {
    Driver::new(
        process,
        1,
        recorder.clone(),
        Duration::ZERO,
        Instant::now() + Duration::from_secs(3600),
        StdRng::seed_from_u64(seed as u64),
    )
}

/// A file changed in the generation's worktree, then a commit of it through the broker
/// socket under the paused generation's fence: `late-git-commit` on the profile's key.
async fn git_commit(
    mut driver: Driver,
    w: Writer,
    socket: PathBuf,
    worktree: PathBuf,
    sent: tokio::sync::oneshot::Sender<()>,
) -> String {
    let input = json!({"lease": w.lease.get(), "generation": w.generation.get()});
    let (kind, out) = driver
        .op("late-git-commit", &takeover_key(w.profile), input, async {
            let file = format!("late-g{}.txt", w.generation.get());
            std::fs::write(worktree.join(&file), "written by a paused generation\n")
                .map_err(|e| unreachable_answer(format!("writing {file}: {e}")))?;
            let request = json!({
                "op": "commit",
                "profile": w.profile.get(),
                "lease": w.lease.get(),
                "generation": w.generation.get(),
                "expected_head": head_of(&worktree),
                "paths": [file],
                "message": format!("late commit of generation {}", w.generation.get()),
                "idempotency_key": format!("late-g{}", w.generation.get()),
            });
            let answer = ask_broker(&socket, &request, sent).await?;
            if answer["ok"] == json!(true) {
                Ok(answer)
            } else {
                let error = answer["code"].clone();
                Err((EventType::Fail, json!({"error": error, "answer": answer})))
            }
        })
        .await;
    match kind {
        EventType::Ok => "accepted".into(),
        EventType::Fail => out["error"].as_str().unwrap_or("refused").into(),
        _ => "unknown".into(),
    }
}

/// A failure that says nothing: the request never reached the broker.
fn unreachable_answer(message: String) -> (EventType, Value) {
    (
        EventType::Fail,
        json!({"error": "unreachable", "message": message}),
    )
}

/// The worktree's HEAD (`git rev-parse`, as root over the sandbox user's files).
fn head_of(worktree: &Path) -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["-c", "safe.directory=*", "-C"])
        .arg(worktree)
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// One request line to the broker and its answer line; `sent` fires once the line is in the
/// socket. A request that may have been read but got no answer is unknown.
async fn ask_broker(
    socket: &Path,
    request: &Value,
    sent: tokio::sync::oneshot::Sender<()>,
) -> Result<Value, (EventType, Value)> {
    let mut stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| unreachable_answer(format!("{}: {e}", socket.display())))?;
    let line = format!("{request}\n");
    let exchange = async {
        stream.write_all(line.as_bytes()).await?;
        let _ = sent.send(());
        let mut answer = String::new();
        BufReader::new(AsyncReadExt::take(&mut stream, BROKER_ANSWER_BYTES_MAX))
            .read_line(&mut answer)
            .await?;
        Ok::<String, std::io::Error>(answer)
    };
    let unknown = |message: String| {
        (
            EventType::Info,
            json!({"error": "unknown", "message": message}),
        )
    };
    let answer = tokio::time::timeout(Duration::from_millis(BROKER_ANSWER_MS_MAX), exchange)
        .await
        .map_err(|_| unknown("no answer in time".into()))?
        .map_err(|e| unknown(e.to_string()))?;
    serde_json::from_str(&answer).map_err(|e| unknown(format!("{e}: {answer:?}")))
}
