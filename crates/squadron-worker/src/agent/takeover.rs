//! Takeover: the next generation of a profile replaces the current one, gracefully (the old
//! provider stops and hands over a capsule, INV-8) or after a crash (its lease expires and
//! its leaf is proved empty, INV-9). Both end in one tail, `finish`, from the control
//! plane's answer on.

use std::fs;
use std::sync::Arc;
use std::time::Duration;

use squadron_client::types::{CrashTakeover, GracefulTakeover};
use squadron_client::{LaunchAgent, TakeoverAgent, TakeoverKind};
use squadron_core::capsule::{CapsuleDraft, CapsulePayload, ContinuityCapsule};
use squadron_core::command::NextHolder;
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{Digest, Generation, ProfileId};
use squadron_core::lease::{FencingToken, LeaseState, RuntimeLease};
use squadron_core::limits::CAPSULE_SCHEMA_VERSION_CURRENT;
use squadron_core::profile::AgentProfile;
use squadron_core::provider::Provider;
use squadron_core::{Outcome, Rejection};

use crate::agent::error::AgentError;
use crate::agent::launch::GrantedAttempt;
use crate::agent::project_sandbox::ProjectSandbox;
use crate::agent::state::{AgentState, ReapProof};
use crate::agent::stream_capsule::{capsule_from_stream, Ending};
use crate::agent::supervisor::{blocking, check_prompt, grant_token, unexpected, AgentSupervisor};
use crate::control_link::CallError;

/// Longest a crash takeover waits for the old lease to expire.
pub(crate) const WAIT_FOR_EXPIRY_MS_MAX: u64 = 120_000;
/// Added to the lease TTL when a crash takeover does not say how long to wait.
pub(crate) const WAIT_FOR_EXPIRY_MARGIN_MS: u64 = 5_000;
/// Pause between the reads of a lease a crash takeover waits on.
pub(crate) const EXPIRY_POLL_MS: u64 = 200;
/// Largest `/state/capsule.json` read at a graceful takeover.
pub(crate) const CAPSULE_FILE_BYTES_MAX: u64 = 256 * 1024;

/// What a takeover answers: the new generation's attempt and the proof the old one is gone.
#[derive(Debug, Clone)]
pub(crate) struct TakeoverOutcome {
    pub(crate) agent: AgentState,
    /// `None` when the control plane accepted evidence recorded earlier.
    pub(crate) replaced: Option<ReapProof>,
}

/// A takeover the control plane was asked for, and what its new generation starts with.
struct Takeover<'a> {
    profile: &'a AgentProfile,
    sandbox: Arc<ProjectSandbox>,
    provider: Provider,
    /// Read before the takeover; replaced by the committed one when the takeover commits a
    /// capsule.
    capsule: Option<ContinuityCapsule>,
    prompt: Option<String>,
    sent_at: u64,
    replaced: Option<ReapProof>,
}

impl AgentSupervisor {
    pub(crate) async fn takeover(
        &self,
        id: ProfileId,
        req: TakeoverAgent,
    ) -> Result<TakeoverOutcome, AgentError> {
        let _op = self.inner.ops.lock().await;
        if let Some(prompt) = &req.prompt {
            check_prompt(prompt)?;
        }
        if let Some(wait) = req.wait_for_expiry_ms {
            if wait > WAIT_FOR_EXPIRY_MS_MAX {
                return Err(AgentError::invalid(
                    "wait_for_expiry_ms",
                    format!("must be at most {WAIT_FOR_EXPIRY_MS_MAX}, got {wait}"),
                ));
            }
        }
        match req.kind {
            TakeoverKind::Graceful => self.graceful(id, req).await,
            TakeoverKind::Crash => self.crash(id, req).await,
        }
    }

    async fn graceful(
        &self,
        id: ProfileId,
        req: TakeoverAgent,
    ) -> Result<TakeoverOutcome, AgentError> {
        let profile = self.profile(id).await?;
        let Some(old) = self.registry().replaceable(id, profile.generation) else {
            return Err(AgentError::precondition(format!(
                "profile {id} has no running provider here at generation {}; a graceful \
                 takeover needs one (use kind crash for a dead one)",
                profile.generation
            )));
        };
        let provider = self.choose_provider(&profile, req.provider, Some(old.provider))?;
        self.check_capabilities(&profile)?;
        // The old provider stops first (its TERM trap writes the capsule): the capsule must
        // describe a generation that no longer changes anything.
        let grace = Duration::from_millis(self.inner.config.stop_grace_ms);
        let proof = self
            .stop_with_grace(id, &old.attempt, old.token.lease, grace, true)
            .await
            .map_err(|e| e.context("stopping the old provider"))?;
        let cursor = self
            .registry()
            .state(id)
            .map_or(0, |s| s.mailbox_delivered_through);
        let (sb, p, generation, provider_was) = (
            old.sandbox.clone(),
            profile.clone(),
            old.token.generation,
            old.provider,
        );
        let payload =
            blocking(move || Ok(handover_payload(&sb, &p, generation, provider_was, cursor)))
                .await?;
        let next = old.token.generation.successor();
        let holder = self.holder(&old.sandbox, &profile, provider, next);
        let sent_at = squadron_client::now_ms();
        let command = GracefulTakeover {
            lease: old.token.lease,
            generation: old.token.generation,
            capsule: capsule_draft(&profile, payload),
            next: NextHolder {
                provider,
                holder,
                ttl_ms: self.inner.config.lease_ttl_ms,
            },
            old_reap_evidence: Some(proof.takeover_evidence()),
        };
        let outcome = match self.inner.control.takeover_graceful(id, &command).await {
            Ok(o) => o,
            Err(e) => {
                // The old provider is gone; keep its evidence so the slot is freed once the
                // lease can take it (release below, or expiry).
                self.registry().queue_evidence(id, proof);
                self.release_or_queue(old.token).await;
                return Err(AgentError::from(e).context("graceful takeover"));
            }
        };
        let takeover = Takeover {
            profile: &profile,
            sandbox: old.sandbox,
            provider,
            capsule: None,
            prompt: req.prompt,
            sent_at,
            replaced: Some(proof),
        };
        self.finish(takeover, outcome).await
    }

    async fn crash(
        &self,
        id: ProfileId,
        req: TakeoverAgent,
    ) -> Result<TakeoverOutcome, AgentError> {
        let profile = self.profile(id).await?;
        if let Some(generation) = self.registry().running_generation(id) {
            return Err(AgentError::precondition(format!(
                "generation {generation} of profile {id} is running and renewed here; a crash \
                 takeover is for a dead provider (use kind graceful, or stop it)"
            )));
        }
        let old = if profile.live_lease.is_none() && profile.fenced_unreaped.is_empty() {
            // The dead generation was already proved gone (evidence recorded, e.g. by this
            // worker's adoption after a restart): the takeover names its reaped lease and
            // sends no evidence, so it is still recorded (and counted) as a crash takeover.
            // A profile whose last generation ended otherwise (released) is launched.
            match self.reaped_target(&profile).await? {
                Some(old) => old,
                None => return self.launch_instead(id, req).await,
            }
        } else {
            self.takeover_target(&profile).await?
        };
        let provider = self.choose_provider(&profile, req.provider, Some(old.provider))?;
        self.check_capabilities(&profile)?;
        // INV-9: expiry first. Nothing of the old generation is touched before it.
        let wait = req
            .wait_for_expiry_ms
            .unwrap_or(self.inner.config.lease_ttl_ms + WAIT_FOR_EXPIRY_MARGIN_MS);
        self.wait_for_expiry(&old, wait).await?;
        let sandbox = self.sandbox_of(&profile.tenant, &profile.project).await?;
        let proof = if old.holder.worker == self.inner.worker && old.state.holds_slot() {
            Some(
                self.reap_generation(&sandbox, &profile, old.generation)
                    .await?,
            )
        } else {
            None
        };
        let capsule = self.latest_capsule(id).await?;
        let next = old.generation.successor();
        let holder = self.holder(&sandbox, &profile, provider, next);
        let sent_at = squadron_client::now_ms();
        let command = CrashTakeover {
            lease: old.id,
            generation: old.generation,
            next: NextHolder {
                provider,
                holder,
                ttl_ms: self.inner.config.lease_ttl_ms,
            },
            reap_evidence: proof.as_ref().map(ReapProof::takeover_evidence),
        };
        let outcome = match self.inner.control.takeover_crash(id, &command).await {
            Ok(outcome) => outcome,
            // Once more, naming the lease as reaped: at most once, as evidence is not sent then.
            Err(e) if self.reaped_meanwhile(&e, id).await => {
                return Box::pin(self.crash(id, req)).await
            }
            Err(e) => return Err(self.crash_refused(e, &old)),
        };
        let takeover = Takeover {
            profile: &profile,
            sandbox,
            provider,
            capsule,
            prompt: req.prompt,
            sent_at,
            replaced: proof,
        };
        self.finish(takeover, outcome).await
    }

    /// A crash takeover with nothing left to take over: the next generation is launched.
    async fn launch_instead(
        &self,
        id: ProfileId,
        req: TakeoverAgent,
    ) -> Result<TakeoverOutcome, AgentError> {
        let launch = LaunchAgent {
            provider: req.provider,
            prompt: req.prompt,
            ..LaunchAgent::default()
        };
        let agent = self.launch_locked(id, launch).await?;
        Ok(TakeoverOutcome {
            agent,
            replaced: None,
        })
    }

    /// The one tail of both takeovers: the granted generation starts, with the capsule the
    /// takeover committed (read back and verified) or the one read before; a lease it cannot
    /// start under is released.
    async fn finish(
        &self,
        t: Takeover<'_>,
        outcome: Outcome,
    ) -> Result<TakeoverOutcome, AgentError> {
        let Outcome::TookOver {
            capsule: committed,
            grant,
            ..
        } = outcome
        else {
            return Err(unexpected("takeover", &outcome));
        };
        let token = grant_token(t.profile.id, &grant);
        let capsule = match committed {
            Some(committed) => self.committed_capsule(token, committed).await?,
            None => t.capsule,
        };
        let agent = self
            .start_or_release(GrantedAttempt {
                profile: t.profile,
                sandbox: t.sandbox,
                token,
                provider: t.provider,
                capsule,
                prompt: t.prompt,
                sent_at: t.sent_at,
            })
            .await?;
        Ok(TakeoverOutcome {
            agent,
            replaced: t.replaced,
        })
    }

    /// The capsule a graceful takeover committed, read back; the new lease is released when
    /// it cannot be read or does not verify.
    async fn committed_capsule(
        &self,
        token: FencingToken,
        committed: (u64, Digest),
    ) -> Result<Option<ContinuityCapsule>, AgentError> {
        let read = self.read_back(token.profile, committed).await;
        if read.is_err() {
            self.release_or_queue(token).await;
        }
        read
    }

    /// The newest capsule of profile `id`, which must be the one just committed (`sequence`,
    /// `digest`) and verify.
    pub(super) async fn read_back(
        &self,
        id: ProfileId,
        (sequence, digest): (u64, Digest),
    ) -> Result<Option<ContinuityCapsule>, AgentError> {
        let capsule = self
            .latest_capsule(id)
            .await
            .map_err(|e| e.context("reading the committed capsule"))?;
        if let Some(c) = &capsule {
            if c.sequence != sequence || c.digest != digest || !c.verify() {
                return Err(AgentError::new(
                    ErrorCode::Internal,
                    format!("capsule {sequence} of profile {id} does not verify after commit"),
                ));
            }
        }
        Ok(capsule)
    }

    /// The control plane's refusal of a crash takeover, with what to do when the old
    /// generation ran on another worker (only it can prove its cgroup empty).
    /// Whether a crash takeover's evidence was refused because the old generation was proved
    /// gone meanwhile — by this worker's own adoption of it after a restart, whose evidence
    /// is retried by the tick — so that the takeover is sent again without evidence, as when
    /// it starts after that evidence.
    async fn reaped_meanwhile(&self, e: &CallError, id: ProfileId) -> bool {
        let CallError::Refused(body) = e else {
            return false;
        };
        if !matches!(body.rejection, Some(Rejection::EvidenceRefused { .. })) {
            return false;
        }
        self.profile(id)
            .await
            .is_ok_and(|p| p.live_lease.is_none() && p.fenced_unreaped.is_empty())
    }

    fn crash_refused(&self, e: CallError, old: &RuntimeLease) -> AgentError {
        let e = AgentError::from(e).context("crash takeover");
        if old.holder.worker == self.inner.worker {
            return e;
        }
        let worker = &old.holder.worker;
        AgentError {
            message: format!(
                "{}; generation {} ran on worker {worker}, whose cgroup only it can prove \
                 empty: restart it, or run `squadron worker decommission {worker}` if it is \
                 gone for good",
                e.message, old.generation
            ),
            ..e
        }
    }

    /// The current generation's lease when it was already reaped, the last the profile had.
    async fn reaped_target(
        &self,
        profile: &AgentProfile,
    ) -> Result<Option<RuntimeLease>, AgentError> {
        let Some(&id) = profile.past_leases.back() else {
            return Ok(None);
        };
        let lease = self.inner.control.get_lease(id).await?;
        let reaped = matches!(lease.state, LeaseState::Reaped { .. });
        Ok((reaped && lease.generation == profile.generation).then_some(lease))
    }

    /// The lease a crash takeover or reap acts on: the current generation's, active or
    /// fenced and not yet reaped.
    pub(super) async fn takeover_target(
        &self,
        profile: &AgentProfile,
    ) -> Result<RuntimeLease, AgentError> {
        let candidates = profile
            .live_lease
            .into_iter()
            .chain(profile.fenced_unreaped.iter().rev().copied());
        for id in candidates {
            let lease = self.inner.control.get_lease(id).await?;
            if lease.generation == profile.generation && lease.state.holds_slot() {
                return Ok(lease);
            }
        }
        Err(AgentError::precondition(format!(
            "profile {} has no active or unreaped lease at generation {}; launch it instead",
            profile.id, profile.generation
        )))
    }

    /// Polls until the control plane shows the lease expired or fenced.
    async fn wait_for_expiry(&self, lease: &RuntimeLease, wait_ms: u64) -> Result<(), AgentError> {
        let started = squadron_client::now_ms();
        loop {
            let now = self.inner.control.get_lease(lease.id).await?;
            // Expiry is the leader's to judge (its sweep fences an expired lease); this
            // host's clock only says when to ask again.
            if now.state != LeaseState::Active {
                return Ok(());
            }
            if squadron_client::now_ms().saturating_sub(started) >= wait_ms {
                return Err(AgentError::precondition(format!(
                    "lease {} of generation {} is still active (expires at {} ms) after \
                     {wait_ms} ms of waiting; a crash takeover waits until the leader has \
                     fenced it as expired (INV-9)",
                    lease.id, lease.generation, now.expires_at_ms
                )));
            }
            tokio::time::sleep(Duration::from_millis(EXPIRY_POLL_MS)).await;
        }
    }
}

/// The next capsule of the profile's chain, holding what the stopped provider left.
fn capsule_draft(profile: &AgentProfile, payload: CapsulePayload) -> CapsuleDraft {
    let head = profile.capsule_head;
    CapsuleDraft {
        sequence: head.map_or(1, |h| h.sequence + 1),
        previous: head.map(|h| h.digest),
        schema_version: CAPSULE_SCHEMA_VERSION_CURRENT,
        payload,
        expected_digest: None,
    }
}

/// What the stopped generation hands over: the capsule it wrote at `/state/capsule.json`,
/// else the one its own structured stream gives (`stream_capsule`), else a note of why there
/// is none.
fn handover_payload(
    sandbox: &ProjectSandbox,
    profile: &AgentProfile,
    generation: Generation,
    provider: Provider,
    mailbox_cursor: u64,
) -> CapsulePayload {
    let why = match read_capsule_file(sandbox, profile) {
        Ok(payload) => return payload,
        Err(why) => why,
    };
    let paths = sandbox.profile_paths(&profile.key);
    let revision = branch_tip(&sandbox.git_dir(), &paths.branch);
    let ending = Ending::Takeover;
    if let Some(mut payload) = capsule_from_stream(
        &paths,
        generation,
        provider,
        ending,
        revision,
        mailbox_cursor,
    ) {
        if payload.context_ref.is_empty() {
            payload.context_ref = profile.context_ref.clone().unwrap_or_default();
        }
        return payload;
    }
    CapsulePayload {
        task_state: format!("generation {generation} stopped for a takeover; {why}"),
        context_ref: profile.context_ref.clone().unwrap_or_default(),
        ..CapsulePayload::default()
    }
}

/// The capsule the stopped provider left at `/state/capsule.json`, or why there is none. The
/// file is the provider's: it is read without following a symlink, bounded, and parsed
/// strictly.
fn read_capsule_file(
    sandbox: &ProjectSandbox,
    profile: &AgentProfile,
) -> Result<CapsulePayload, String> {
    let path = sandbox
        .profile_paths(&profile.key)
        .state
        .join("capsule.json");
    let Ok(meta) = fs::symlink_metadata(&path) else {
        return Err("it wrote no /state/capsule.json".into());
    };
    if !meta.is_file() || meta.len() > CAPSULE_FILE_BYTES_MAX {
        return Err(format!(
            "/state/capsule.json was not a regular file of at most {CAPSULE_FILE_BYTES_MAX} bytes"
        ));
    }
    match fs::read(&path).map(|b| serde_json::from_slice::<CapsulePayload>(&b)) {
        Ok(Ok(payload)) => Ok(payload),
        Ok(Err(e)) => Err(format!(
            "/state/capsule.json was not a capsule payload: {e}"
        )),
        Err(e) => Err(format!("/state/capsule.json could not be read: {e}")),
    }
}

/// The commit the profile's branch points at in the sandbox's repository, if it has one.
pub(super) fn branch_tip(git_dir: &std::path::Path, branch: &str) -> Option<String> {
    let repo = git2::Repository::open_bare(git_dir).ok()?;
    let tip = repo
        .find_reference(&format!("refs/heads/{branch}"))
        .and_then(|r| r.peel_to_commit())
        .ok()?;
    Some(tip.id().to_string())
}
