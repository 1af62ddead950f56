//! One cycle of ADR-0011's canary, through the operator API: eight profiles launched at once
//! into four slots, a graceful takeover, the replaced generation's capsule commit (a stale
//! writer, which must be refused), a crash takeover (the generation's processes killed on
//! this host), every agent stopped, then one task per runtime run to its end.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use squadron_api::agents::{
    AgentStatus, AgentView, LaunchAgent, SandboxRepository, StopAgent, TakeoverAgent, TakeoverKind,
};
use squadron_api::leases::CommitCapsule;
use squadron_client::{Consistency, SquadronClient};
use squadron_core::capsule::{CapsuleDraft, CapsulePayload};
use squadron_core::ids::{ProfileId, TaskId, WorkerId};
use squadron_core::manifest::{Keyword as _, RuntimeKind};
use squadron_core::task::TaskState;
use squadron_core::Outcome;

/// The ADR's figures: eight profiles, four of them active at once.
pub const PROFILES: usize = 8;
pub const ACTIVE_MAX: u32 = 4;
/// How often a wait looks again.
const POLL_MS: u64 = 500;
/// How long the worker may take to see a killed generation as crashed.
const CRASH_SEEN_MS_MAX: u64 = 30_000;

/// What the canary needs, fixed for the whole soak.
#[derive(Debug, Clone)]
pub struct Canary {
    pub profiles: Vec<ProfileId>,
    /// Where the project's sandbox is made when it has none (the first launch).
    pub sandbox: Option<(WorkerId, SandboxRepository)>,
    pub task_runtimes: Vec<RuntimeKind>,
    pub task_repository: SandboxRepository,
    pub crash_takeovers: bool,
    pub expiry_wait_ms: u64,
    pub task_timeout: Duration,
}

/// One task the cycle ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRun {
    pub runtime: RuntimeKind,
    pub task: Option<TaskId>,
    pub state: Option<TaskState>,
}

/// What one cycle did; `errors` lists every step that did not go as the ADR says.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CycleReport {
    pub cycle: u32,
    pub started_at_ms: u64,
    pub duration_ms: u64,
    pub launched: u32,
    pub refused_full: u32,
    pub takeovers_graceful: u32,
    pub takeovers_crash: u32,
    pub stale_commits_refused: u32,
    pub stopped: u32,
    pub tasks: Vec<TaskRun>,
    pub errors: Vec<String>,
}

impl Canary {
    pub async fn run(&mut self, client: &SquadronClient, cycle: u32) -> CycleReport {
        let started = std::time::Instant::now();
        let mut r = CycleReport {
            cycle,
            started_at_ms: squadron_client::now_ms(),
            ..CycleReport::default()
        };
        let running = self.launch_all(client, &mut r).await;
        if let Some(first) = running.first() {
            self.graceful(client, *first, &mut r).await;
        }
        if self.crash_takeovers {
            if let Some(second) = running.get(1) {
                self.crash(client, *second, &mut r).await;
            }
        }
        for profile in &running {
            match client.agent_stop(*profile, &StopAgent::default()).await {
                Ok(_) => r.stopped += 1,
                Err(e) => r.errors.push(format!("stop profile {profile}: {e}")),
            }
        }
        for runtime in self.task_runtimes.clone() {
            let run = self.task(client, runtime, &mut r).await;
            r.tasks.push(run);
        }
        r.duration_ms = started.elapsed().as_millis() as u64;
        r
    }

    /// The first profile alone (it may make the sandbox), then the other seven at once.
    async fn launch_all(&mut self, client: &SquadronClient, r: &mut CycleReport) -> Vec<ProfileId> {
        let mut first = LaunchAgent::default();
        if let Some((worker, repository)) = &self.sandbox {
            first.worker = Some(worker.clone());
            first.repository = Some(repository.clone());
        }
        let mut results = vec![(
            self.profiles[0],
            client.agent_launch(self.profiles[0], &first).await,
        )];
        if results[0].1.is_ok() {
            self.sandbox = None;
        }
        let mut set = tokio::task::JoinSet::new();
        for id in self.profiles.iter().skip(1).copied() {
            let c = client.clone();
            set.spawn(async move { (id, c.agent_launch(id, &LaunchAgent::default()).await) });
        }
        while let Some(done) = set.join_next().await {
            match done {
                Ok(result) => results.push(result),
                Err(e) => r.errors.push(format!("a launch did not finish: {e}")),
            }
        }
        let mut running = Vec::new();
        for (id, result) in results {
            match result {
                Ok(view) if view.status == AgentStatus::Running => running.push(id),
                Ok(view) => r.errors.push(format!(
                    "profile {id} launched as {:?}, not running",
                    view.status
                )),
                Err(e) if e.code().http_status() == 429 => r.refused_full += 1,
                Err(e) => r.errors.push(format!("launch profile {id}: {e}")),
            }
        }
        r.launched = running.len() as u32;
        if r.launched != ACTIVE_MAX {
            r.errors.push(format!(
                "{} of {PROFILES} profiles launched, not {ACTIVE_MAX}",
                r.launched
            ));
        }
        running.sort();
        running
    }

    /// A graceful takeover, then the replaced generation tries to commit a capsule.
    async fn graceful(&self, client: &SquadronClient, profile: ProfileId, r: &mut CycleReport) {
        let view = match client
            .agent_takeover(profile, &takeover(TakeoverKind::Graceful, None))
            .await
        {
            Ok(v) => v,
            Err(e) => {
                r.errors
                    .push(format!("graceful takeover of profile {profile}: {e}"));
                return;
            }
        };
        r.takeovers_graceful += 1;
        let Some(old) = &view.replaced else {
            r.errors.push(format!(
                "the graceful takeover of profile {profile} named no replaced generation"
            ));
            return;
        };
        let stale = CommitCapsule {
            lease: old.lease,
            generation: old.generation,
            capsule: stale_draft(),
        };
        match client.commit_capsule(profile, &stale, None).await {
            Err(e) if e.code().http_status() == 409 => r.stale_commits_refused += 1,
            Err(e) => r.errors.push(format!(
                "the stale generation's capsule commit was refused for another reason: {e}"
            )),
            Ok(outcome) => r.errors.push(format!(
                "DUAL WRITER: generation {} of profile {profile} committed after its takeover: {}",
                old.generation.get(),
                outcome_name(&outcome)
            )),
        }
    }

    /// Kills every process of the generation (this host must be its worker's), waits for the
    /// worker to see the crash, and takes the profile over.
    async fn crash(&self, client: &SquadronClient, profile: ProfileId, r: &mut CycleReport) {
        let view = match client.agent_view(profile).await {
            Ok(v) => v,
            Err(e) => {
                r.errors.push(format!("view profile {profile}: {e}"));
                return;
            }
        };
        if let Err(e) = kill_generation(&view) {
            r.errors.push(e);
            return;
        }
        if !self.wait_crashed(client, profile).await {
            r.errors.push(format!(
                "the worker did not see profile {profile}'s killed generation crash within {CRASH_SEEN_MS_MAX} ms"
            ));
            return;
        }
        let req = takeover(TakeoverKind::Crash, Some(self.expiry_wait_ms));
        match client.agent_takeover(profile, &req).await {
            Ok(_) => r.takeovers_crash += 1,
            Err(e) => r
                .errors
                .push(format!("crash takeover of profile {profile}: {e}")),
        }
    }

    async fn wait_crashed(&self, client: &SquadronClient, profile: ProfileId) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(CRASH_SEEN_MS_MAX);
        while tokio::time::Instant::now() < deadline {
            if client
                .agent_view(profile)
                .await
                .is_ok_and(|v| v.status == AgentStatus::Crashed)
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
        false
    }

    async fn task(
        &self,
        client: &SquadronClient,
        runtime: RuntimeKind,
        r: &mut CycleReport,
    ) -> TaskRun {
        let mut run = TaskRun {
            runtime,
            task: None,
            state: None,
        };
        let manifest = task_manifest(&self.task_repository, runtime, r.cycle);
        let task = match client.submit_task_yaml(&manifest, None).await {
            Ok(Outcome::TaskSubmitted { task }) => task,
            Ok(other) => {
                r.errors.push(format!(
                    "task on {}: answered {}",
                    runtime.as_str(),
                    outcome_name(&other)
                ));
                return run;
            }
            Err(e) => {
                r.errors.push(format!("task on {}: {e}", runtime.as_str()));
                return run;
            }
        };
        run.task = Some(task);
        let deadline = tokio::time::Instant::now() + self.task_timeout;
        loop {
            if let Ok(t) = client.get_task(task, Consistency::Linearizable).await {
                run.state = Some(t.state);
                if t.state.is_terminal() {
                    if t.state != TaskState::Completed {
                        r.errors.push(format!(
                            "task {task} on {} ended {:?}: {}",
                            runtime.as_str(),
                            t.state,
                            t.error.unwrap_or_default()
                        ));
                    }
                    return run;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                r.errors.push(format!(
                    "task {task} on {} not done within {} s",
                    runtime.as_str(),
                    self.task_timeout.as_secs()
                ));
                return run;
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
    }
}

fn takeover(kind: TakeoverKind, wait_for_expiry_ms: Option<u64>) -> TakeoverAgent {
    TakeoverAgent {
        kind,
        provider: None,
        wait_for_expiry_ms,
        prompt: None,
    }
}

/// What a fenced writer would write; it must never be judged on its content.
fn stale_draft() -> CapsuleDraft {
    CapsuleDraft {
        sequence: 0,
        previous: None,
        schema_version: 1,
        payload: CapsulePayload {
            task_state: "written by a replaced generation".into(),
            decisions: Vec::new(),
            pending_work: Vec::new(),
            repository_revision: String::new(),
            mailbox_cursor: 0,
            context_ref: String::new(),
        },
        expected_digest: None,
    }
}

/// `kill -9` of every process in the generation's cgroup leaf.
fn kill_generation(view: &AgentView) -> Result<(), String> {
    let procs = std::path::Path::new(&view.cgroup).join("cgroup.procs");
    let text = std::fs::read_to_string(&procs).map_err(|e| {
        format!(
            "crash takeover: cannot read {} ({e}); run the soak on the worker's host, or give \
             --crash-takeovers false",
            procs.display()
        )
    })?;
    for pid in text.split_whitespace() {
        let _ = std::process::Command::new("kill")
            .args(["-9", pid])
            .stderr(std::process::Stdio::null())
            .status();
    }
    Ok(())
}

/// A script task that does a little work and exits 0.
fn task_manifest(repository: &SandboxRepository, runtime: RuntimeKind, cycle: u32) -> String {
    // `isolated`: the mode every runtime takes with nothing on the host to set up.
    let branch = repository.branch.as_deref().unwrap_or("main");
    format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: soak-{cycle}-{runtime}\n\
         repository:\n  url: {url}\n  branch: {branch}\n\
         agent:\n  prompt: \"soak cycle {cycle}\"\n  provider: script\n  script: |\n    \
         echo soak cycle {cycle} > soak.txt\n    ls >/dev/null\n\
         vm:\n  runtime: {runtime}\n  network_mode: isolated\n  memory: 512Mi\n",
        url = serde_json::to_string(&repository.url).unwrap_or_default(),
        runtime = runtime.as_str(),
    )
}

fn outcome_name(o: &Outcome) -> String {
    serde_json::to_value(o)
        .ok()
        .and_then(|v| v.as_object().and_then(|m| m.keys().next().cloned()))
        .unwrap_or_else(|| format!("{o:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_manifest_is_one_the_control_plane_accepts() {
        let repo = SandboxRepository {
            url: "/srv/repo:main#x".into(),
            branch: Some("dev".into()),
        };
        for runtime in [RuntimeKind::Process, RuntimeKind::Docker, RuntimeKind::Kvm] {
            let text = task_manifest(&repo, runtime, 3);
            let spec = squadron_core::manifest::parse_manifest_yaml(&text)
                .unwrap_or_else(|e| panic!("{text}\n{e}"));
            assert_eq!(spec.repository.url, repo.url);
            assert_eq!(spec.sandbox.runtime, runtime);
        }
    }
}
