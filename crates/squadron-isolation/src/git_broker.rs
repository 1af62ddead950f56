//! The generation-fenced Git broker (ADR-0011 decision 6, INV-6, INV-11).
//!
//! Provider processes cannot write Git metadata: `.git` (or the common dir of the
//! project's worktrees) is read-only inside the boundary. A commit goes through the broker
//! over a local socket instead, carrying (profile, lease, generation), the HEAD the caller
//! expects, the exact path set, a message and an idempotency key. For each commit, under
//! the lock of the repository's common dir:
//!
//! 1. the input is checked (paths relative, no `.`/`..`, nothing under `.git`, no symlink on
//!    the way, bounded sizes) — errors name the field;
//! 2. the idempotency ledger is consulted: the same key with the same request digest gets
//!    the first answer (`replayed: true`) and nothing is written; the same key with another
//!    request is refused as `conflict`;
//! 3. the fence is checked with the control plane ([`FenceCheck`]): anything but `Current`
//!    is refused (`stale_generation`, or `fence_unavailable` when the control plane cannot
//!    answer) before anything is written;
//! 4. HEAD must equal `expected_head` (else `head_moved`, nothing written);
//! 5. the commit is HEAD's tree plus exactly the listed paths (additions, modifications,
//!    deletions), made with git2 on the HEAD branch, author and committer
//!    `profile-<id> <profile-<id>@squadron.invalid>`, with trailers `Squadron-Profile`,
//!    `Squadron-Lease`, `Squadron-Generation` and `Squadron-Request-Digest`;
//! 6. the key is recorded in the ledger (fsync'd) and the answer sent.
//!
//! # Why a fence check that is not atomic with the commit is safe enough here
//!
//! The fence check (3) and the commit (5) are two steps; the control plane may fence the
//! lease between them. That window cannot produce a commit from a generation that is not
//! current *while a newer generation writes*:
//!
//! - The lease cannot be re-granted to the next generation until the old one is fenced
//!   *and* its cgroup was reaped with `populated 0` (INV-8, INV-9). A request of the old
//!   generation comes from a process of that generation; once the newer generation exists,
//!   no such process is running, so no such request can still arrive. (A request already
//!   inside the broker when the reap finishes is the window below.)
//! - The check is made as late as possible — after the lock of the repository is taken,
//!   immediately before HEAD is compared and the commit is written — so the window is the
//!   duration of one local git2 commit (milliseconds), not the request's queueing time.
//! - Commits to one repository are serialised (one lock per common dir, shared by all the
//!   worktrees of the project), and every commit is a compare-and-swap on HEAD
//!   (`expected_head`, re-checked by libgit2 when it moves the ref). A newer generation
//!   starts from the HEAD it reads and cannot lose the older commit silently: if an old
//!   commit did slip in, the newer generation's next commit is refused as `head_moved`.
//! - After every commit the fence is checked a second time; if a newer generation was
//!   granted meanwhile (or the control plane names none) the commit is counted in
//!   `accepted_from_non_current` and logged at error level. The counter is the evidence for
//!   "zero dual writers"; by the argument above it stays 0. A lease that ended (a stop's
//!   release, a fence) while its commit was in flight, with no newer generation, is counted
//!   apart (`ended_during_commit`): no second writer existed — generations only rise, so the
//!   one the second check still finds was the current one when the commit was written. The
//!   chaos suite's takeover workload met this race (a stop right after a launch, while the
//!   provider's first commit was inside the broker).
//!
//! # What the broker never does
//!
//! It never touches the files of a worktree: no checkout, reset or clean. A profile's
//! worktree is reset only by its owner, and only after its lease is proved quiescent.
//!
//! # Protocol
//!
//! A Unix socket (mode 0660; the directory it lives in, and who can reach it, is the
//! caller's choice), one JSON request per line, one JSON answer per line; see
//! [`CommitRequest`], [`HeadRequest`], [`CommitOutcome`], [`HeadOutcome`] and [`Refusal`].
//! Every size and wait is bounded by a named constant.
//!
//! # Deployment note
//!
//! libgit2 refuses repositories owned by another user unless they are listed in
//! `safe.directory` of the broker's global Git configuration; a broker running as root over
//! worktrees owned by the sandbox user needs that entry.

mod broker_answer;
mod broker_error;
mod broker_request;
mod broker_server;
mod broker_stats;
mod commit_ledger;
mod commit_paths;
mod fence_check;
mod git_broker_client;
mod profile_worktree;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

pub use broker_answer::{CommitOutcome, HeadOutcome, Refusal, RefusalCode};
pub use broker_error::BrokerError;
pub use broker_request::{
    CommitRequest, HeadRequest, IDEMPOTENCY_KEY_BYTES_MAX, MESSAGE_BYTES_MAX, PATHS_PER_COMMIT_MAX,
};
pub use broker_server::{
    BrokerServer, ANSWER_WRITE_TIMEOUT_MS_MAX, CONNECTIONS_MAX, LINE_BYTES_MAX,
    REQUEST_READ_TIMEOUT_MS_MAX, SHUTDOWN_WAIT_MS_MAX,
};
pub use broker_stats::BrokerStats;
pub use commit_ledger::LEDGER_ENTRIES_MAX;
pub use commit_paths::{
    PATH_BYTES_MAX, PATH_COMPONENT_BYTES_MAX, STAGED_BYTES_PER_COMMIT_MAX, STAGED_FILE_BYTES_MAX,
};
pub use fence_check::{FenceCheck, FenceFuture, FenceVerdict};
pub use git_broker_client::{GitBrokerClient, CLIENT_ANSWER_TIMEOUT_MS_MAX};

pub(crate) use broker_request::BrokerRequest;

use broker_stats::BrokerCounters;
use commit_ledger::{CommitLedger, LedgerEntry};
use profile_worktree::{CommitStep, ProfileWorktree};

/// Waiting for the lock of a repository (other profiles' commits ahead in line).
pub const REPOSITORY_LOCK_WAIT_MS_MAX: u64 = 60_000;
/// Waiting for the control plane's answer to one fence check.
pub const FENCE_CHECK_TIMEOUT_MS_MAX: u64 = 10_000;
/// Profiles registered at once.
pub const PROFILES_MAX: usize = 4_096;

/// The broker: registered profile worktrees, the fence, the ledger and the counters.
/// Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct GitBroker {
    inner: Arc<BrokerInner>,
}

struct BrokerInner {
    fence: Arc<dyn FenceCheck>,
    profiles: RwLock<HashMap<u64, Arc<ProfileWorktree>>>,
    repository_locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
    ledger: Arc<Mutex<CommitLedger>>,
    counters: BrokerCounters,
}

impl fmt::Debug for GitBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let profiles = self
            .inner
            .profiles
            .read()
            .map(|p| p.len())
            .unwrap_or_default();
        f.debug_struct("GitBroker")
            .field("profiles", &profiles)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl GitBroker {
    /// A broker whose ledger lives in `state_dir` (created if missing; reloaded after a
    /// restart) and whose writes are fenced by `fence`.
    pub fn open(state_dir: &Path, fence: Arc<dyn FenceCheck>) -> Result<GitBroker, BrokerError> {
        let ledger = CommitLedger::open(state_dir)?;
        Ok(GitBroker {
            inner: Arc::new(BrokerInner {
                fence,
                profiles: RwLock::new(HashMap::new()),
                repository_locks: Mutex::new(HashMap::new()),
                ledger: Arc::new(Mutex::new(ledger)),
                counters: BrokerCounters::default(),
            }),
        })
    }

    /// Routes `profile`'s requests to `worktree`, whose Git dir is `git_dir`: a linked
    /// worktree and its admin dir (linked worktrees of one repository share its lock), or a
    /// repository's work dir and its `.git`. Both come from the caller's own layout, never from
    /// the worktree's `.git`, which the provider writes. Replaces an earlier registration of
    /// the profile.
    pub fn register_profile(
        &self,
        profile: u64,
        worktree: &Path,
        git_dir: &Path,
    ) -> Result<(), BrokerError> {
        let opened = ProfileWorktree::open(worktree, git_dir)?;
        let mut profiles = self
            .inner
            .profiles
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if !profiles.contains_key(&profile) && profiles.len() >= PROFILES_MAX {
            return Err(BrokerError::invalid(
                "profile",
                format!("more than {PROFILES_MAX} profiles registered"),
            ));
        }
        tracing::info!(
            profile,
            worktree = %opened.worktree.display(),
            common_dir = %opened.common_dir.display(),
            "git broker: profile registered"
        );
        profiles.insert(profile, Arc::new(opened));
        Ok(())
    }

    /// Stops serving `profile`; requests already past the lookup finish. Returns whether the
    /// profile was registered.
    pub fn unregister_profile(&self, profile: u64) -> bool {
        let mut profiles = self
            .inner
            .profiles
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(removed) = profiles.remove(&profile) else {
            return false;
        };
        let still_used = profiles
            .values()
            .any(|p| p.common_dir == removed.common_dir);
        drop(profiles);
        if !still_used {
            let mut locks = self
                .inner
                .repository_locks
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // A lock someone still holds or waits for stays; it is dropped with its last user.
            if locks
                .get(&removed.common_dir)
                .is_some_and(|lock| Arc::strong_count(lock) == 1)
            {
                locks.remove(&removed.common_dir);
            }
        }
        true
    }

    /// The counters since this broker was opened.
    pub fn stats(&self) -> BrokerStats {
        self.inner.counters.snapshot()
    }

    /// Binds `socket` and serves every registered profile on it, on the current tokio
    /// runtime; see [`BrokerServer`].
    pub fn serve(&self, socket: &Path) -> Result<BrokerServer, BrokerError> {
        BrokerServer::bind(self.clone(), socket, None)
    }

    /// Binds a socket that serves `profile` only: requests naming another profile are
    /// refused as `forbidden`. Mounting each profile's own socket into its boundary means
    /// a process can never act as a peer profile, even if it learns the peer's lease id.
    pub fn serve_profile(&self, socket: &Path, profile: u64) -> Result<BrokerServer, BrokerError> {
        BrokerServer::bind(self.clone(), socket, Some(profile))
    }

    /// Handles one commit request (what the socket does per `commit` line).
    pub async fn commit(&self, request: CommitRequest) -> CommitOutcome {
        let outcome = self.commit_counted(request).await;
        self.inner.counters.count_commit(&outcome);
        outcome
    }

    /// Handles one head request (what the socket does per `head` line).
    pub async fn head(&self, request: HeadRequest) -> HeadOutcome {
        let Some(worktree) = self.profile(request.profile) else {
            return HeadOutcome::Refused(unknown_profile(request.profile));
        };
        if let Err(refusal) = self
            .check_fence(request.profile, request.lease, request.generation)
            .await
        {
            return HeadOutcome::Refused(refusal);
        }
        let read = tokio::task::spawn_blocking(move || worktree.head()).await;
        match read {
            Ok(Ok(head)) => {
                self.inner.counters.count_head_read();
                HeadOutcome::Head {
                    head: head.oid.map(|oid| oid.to_string()),
                    branch: head.branch,
                }
            }
            Ok(Err(e)) => HeadOutcome::Refused(Refusal::new(RefusalCode::Internal, e.to_string())),
            Err(e) => HeadOutcome::Refused(Refusal::new(
                RefusalCode::Internal,
                format!("HEAD read task failed: {e}"),
            )),
        }
    }

    pub(crate) fn count_line_refusal(&self, code: RefusalCode) {
        self.inner.counters.count_refusal(code);
    }

    async fn commit_counted(&self, request: CommitRequest) -> CommitOutcome {
        if let Err(refusal) = request.check_syntax() {
            return CommitOutcome::Refused(refusal);
        }
        let Some(worktree) = self.profile(request.profile) else {
            return CommitOutcome::Refused(unknown_profile(request.profile));
        };
        let digest = request.digest();
        let lock = self.repository_lock(&worktree.common_dir);
        let wait = Duration::from_millis(REPOSITORY_LOCK_WAIT_MS_MAX);
        // An owned guard, moved into the blocking commit below: even if this future is
        // dropped, the repository stays locked until the commit and its ledger line are done.
        let Ok(guard) = tokio::time::timeout(wait, lock.lock_owned()).await else {
            return CommitOutcome::Refused(Refusal::new(
                RefusalCode::Timeout,
                format!("the repository stayed locked for {REPOSITORY_LOCK_WAIT_MS_MAX} ms"),
            ));
        };

        let recorded = {
            let ledger = self
                .inner
                .ledger
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            ledger
                .lookup(request.profile, &request.idempotency_key)
                .map(|entry| (entry.digest.clone(), entry.commit.clone()))
        };
        match recorded {
            Some((recorded_digest, commit)) if recorded_digest == digest => {
                return CommitOutcome::Committed {
                    commit,
                    replayed: true,
                };
            }
            Some(_) => {
                return CommitOutcome::Refused(
                    Refusal::new(
                        RefusalCode::Conflict,
                        "this idempotency key was used for a different request",
                    )
                    .with_field("idempotency_key"),
                );
            }
            None => {}
        }

        if let Err(refusal) = self
            .check_fence(request.profile, request.lease, request.generation)
            .await
        {
            return CommitOutcome::Refused(refusal);
        }

        let ledger = Arc::clone(&self.inner.ledger);
        let task_request = request.clone();
        let step = tokio::task::spawn_blocking(move || {
            let _repository = guard;
            let step = worktree.commit(&task_request, &digest);
            if let CommitStep::Committed(oid) | CommitStep::Recovered(oid) = &step {
                record(&ledger, &task_request, &digest, *oid);
            }
            step
        })
        .await;
        match step {
            Ok(CommitStep::Committed(oid)) => {
                self.measure_non_current(&request, oid).await;
                tracing::info!(
                    profile = request.profile,
                    lease = request.lease,
                    generation = request.generation,
                    commit = %oid,
                    "git broker: commit accepted"
                );
                CommitOutcome::Committed {
                    commit: oid.to_string(),
                    replayed: false,
                }
            }
            Ok(CommitStep::Recovered(oid)) => CommitOutcome::Committed {
                commit: oid.to_string(),
                replayed: true,
            },
            Ok(CommitStep::Refused(refusal)) => CommitOutcome::Refused(refusal),
            Err(e) => CommitOutcome::Refused(Refusal::new(
                RefusalCode::Internal,
                format!("commit task failed: {e}"),
            )),
        }
    }

    /// The fence, failing closed: `Err` is the refusal to send.
    async fn check_fence(&self, profile: u64, lease: u64, generation: u64) -> Result<(), Refusal> {
        let wait = Duration::from_millis(FENCE_CHECK_TIMEOUT_MS_MAX);
        match tokio::time::timeout(wait, self.inner.fence.check(profile, lease, generation)).await {
            Ok(Ok(FenceVerdict::Current)) => Ok(()),
            Ok(Ok(FenceVerdict::Stale {
                current_generation,
                reason,
            })) => {
                tracing::warn!(
                    profile,
                    lease,
                    generation,
                    ?current_generation,
                    %reason,
                    "git broker: stale generation refused"
                );
                let mut refusal = Refusal::new(
                    RefusalCode::StaleGeneration,
                    format!("lease {lease} generation {generation} is not current: {reason}"),
                )
                .with_field("generation");
                refusal.current_generation = current_generation;
                Err(refusal)
            }
            Ok(Err(e)) => Err(Refusal::new(RefusalCode::FenceUnavailable, e.to_string())),
            Err(_) => Err(Refusal::new(
                RefusalCode::FenceUnavailable,
                format!("no fence answer within {FENCE_CHECK_TIMEOUT_MS_MAX} ms"),
            )),
        }
    }

    /// The second fence check after a commit: the evidence for zero non-current writers.
    async fn measure_non_current(&self, request: &CommitRequest, oid: git2::Oid) {
        let wait = Duration::from_millis(FENCE_CHECK_TIMEOUT_MS_MAX);
        let verdict = tokio::time::timeout(
            wait,
            self.inner
                .fence
                .check(request.profile, request.lease, request.generation),
        )
        .await;
        match verdict {
            Ok(Ok(FenceVerdict::Current)) => {}
            // Generations only rise, and each has one lease: one still at the request's
            // after the commit was the current one while it was written, with no successor
            // to write beside it.
            Ok(Ok(
                ended @ FenceVerdict::Stale {
                    current_generation: Some(g),
                    ..
                },
            )) if g == request.generation => {
                self.inner.counters.count_ended_during_commit();
                tracing::warn!(
                    profile = request.profile,
                    lease = request.lease,
                    generation = request.generation,
                    commit = %oid,
                    verdict = %ended,
                    "git broker: the generation's lease ended while its commit was written (no newer generation)"
                );
            }
            Ok(Ok(stale @ FenceVerdict::Stale { .. })) => {
                self.inner.counters.count_non_current();
                tracing::error!(
                    profile = request.profile,
                    lease = request.lease,
                    generation = request.generation,
                    commit = %oid,
                    verdict = %stale,
                    "GIT BROKER: A COMMIT WAS ACCEPTED FROM A GENERATION THAT IS NO LONGER CURRENT"
                );
            }
            Ok(Err(e)) => tracing::warn!(
                profile = request.profile,
                commit = %oid,
                error = %e,
                "git broker: the post-commit fence check could not be made"
            ),
            Err(_) => tracing::warn!(
                profile = request.profile,
                commit = %oid,
                "git broker: the post-commit fence check timed out"
            ),
        }
    }

    fn profile(&self, profile: u64) -> Option<Arc<ProfileWorktree>> {
        self.inner
            .profiles
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&profile)
            .cloned()
    }

    fn repository_lock(&self, common_dir: &Path) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .inner
            .repository_locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(locks.entry(common_dir.to_path_buf()).or_default())
    }
}

/// Records an accepted commit. The commit already stands, so a ledger failure is logged,
/// not answered: a retry is still recognised by the commit's digest trailer.
fn record(ledger: &Mutex<CommitLedger>, request: &CommitRequest, digest: &str, oid: git2::Oid) {
    let entry = LedgerEntry {
        profile: request.profile,
        key: request.idempotency_key.clone(),
        digest: digest.to_string(),
        commit: oid.to_string(),
        recorded_ms: crate::clock::now_ms(),
    };
    let result = ledger
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .record(entry);
    if let Err(e) = result {
        tracing::error!(
            profile = request.profile,
            commit = %oid,
            error = %e,
            "git broker: commit made but its ledger line was not recorded"
        );
    }
}

fn unknown_profile(profile: u64) -> Refusal {
    Refusal::new(
        RefusalCode::UnknownProfile,
        format!("no worktree is registered for profile {profile}"),
    )
    .with_field("profile")
}
