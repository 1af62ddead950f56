//! A full check of every invariant the state can show on its own. Tests and property tests run
//! it after every step; snapshot decoding runs it before installing. Apply itself asserts the
//! cheap local forms inline, so production never pays for a full scan per command.

use std::collections::{BTreeMap, BTreeSet};

use crate::apply_retention::ended_at_ms;
use crate::apply_tasks::queue_key;
use crate::lease::LeaseState;
use crate::state::State;
use crate::task::TaskState;

impl State {
    /// An agent session belongs to the current attempt of a task whose sandbox exists.
    fn check_agent_sessions(&self) -> Result<(), String> {
        for (id, session) in &self.agent_sessions {
            let Some(task) = self.task(*id) else {
                return Err(format!("agents: a session of unknown task {id}"));
            };
            if session.attempt != task.attempt
                || !crate::apply_agents::AGENT_STATES.contains(&task.state)
            {
                return Err(format!(
                    "agents: task {id} is {} on attempt {} but keeps a session of attempt {}",
                    task.state, task.attempt, session.attempt
                ));
            }
        }
        Ok(())
    }

    /// A provider's progress is of a task that exists, and of an attempt it had.
    fn check_provider_progress(&self) -> Result<(), String> {
        for (id, p) in &self.provider_progress {
            let Some(task) = self.task(*id) else {
                return Err(format!(
                    "progress: the provider progress of unknown task {id}"
                ));
            };
            if p.attempt == 0 || p.attempt > task.attempt {
                return Err(format!(
                    "progress: task {id} is on attempt {} but its provider progress is of \
                     attempt {}",
                    task.attempt, p.attempt
                ));
            }
        }
        Ok(())
    }

    /// INV-4/INV-5 for project tasks: a bound lease is the lease of the task's own profile,
    /// held by the task's worker, while the task is between assignment and its end. It holds
    /// a slot unless it was reaped while the task ran.
    fn check_task_leases(&self) -> Result<(), String> {
        for (id, lease_id) in &self.task_leases {
            let Some(task) = self.task(*id) else {
                return Err(format!("INV-5: a lease bound to unknown task {id}"));
            };
            if matches!(task.state, TaskState::Pending) || task.state.is_terminal() {
                return Err(format!(
                    "INV-5: task {id} is {} but still binds lease {lease_id}",
                    task.state
                ));
            }
            let Some(lease) = self.leases.get(lease_id) else {
                return Err(format!("INV-5: task {id} binds unknown lease {lease_id}"));
            };
            let profile = self.profiles.get(&lease.profile);
            let placed = match &task.spec.placement {
                crate::manifest::Placement::Project {
                    tenant,
                    project,
                    profile: key,
                } => profile
                    .is_some_and(|p| &p.tenant == tenant && &p.project == project && &p.key == key),
                crate::manifest::Placement::Dedicated => false,
            };
            if !placed || task.worker.as_ref() != Some(&lease.holder.worker) {
                return Err(format!(
                    "INV-4: task {id}'s lease {lease_id} is not its profile's on its worker"
                ));
            }
        }
        Ok(())
    }

    /// Returns the first broken invariant, named by its id.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.check_projects_and_profiles()?;
        self.check_leases()?;
        self.check_capsules()?;
        self.check_mailboxes()?;
        self.check_tasks()?;
        self.check_ended_index()?;
        self.check_access()?;
        self.check_credentials()?;
        self.check_profile_credentials()?;
        self.check_credential_egress()?;
        if let Some(w) = self
            .worker_policies
            .keys()
            .find(|w| !self.workers.contains_key(*w))
        {
            return Err(format!("workers: a policy of unknown worker {w}"));
        }
        self.check_agent_sessions()?;
        self.check_provider_progress()?;
        self.check_task_leases()?;
        self.idempotency.check()
    }

    /// Egress bindings belong to live credentials and are well formed.
    fn check_credential_egress(&self) -> Result<(), String> {
        for (id, binding) in &self.credential_egress {
            let live = self
                .credentials
                .credentials
                .get(id)
                .is_some_and(|c| !c.is_revoked());
            if !live || binding.check("egress").is_err() {
                return Err(format!("credentials: egress binding of {id} is malformed"));
            }
        }
        Ok(())
    }

    /// INV-13's bookkeeping: live credentials hold a well-formed sealed value and revoked ones
    /// none; each task has at most one active lease, for its current attempt on its worker.
    fn check_credentials(&self) -> Result<(), String> {
        use crate::limits::{CREDENTIALS_MAX, CREDENTIAL_LEASES_MAX};
        let c = &self.credentials;
        if c.credentials.len() > CREDENTIALS_MAX || c.leases.len() > CREDENTIAL_LEASES_MAX {
            return Err("credentials: a record bound is exceeded".into());
        }
        for (id, cred) in &c.credentials {
            let sealed_ok = match &cred.sealed {
                Some(s) => !cred.is_revoked() && s.check("sealed").is_ok(),
                None => cred.is_revoked(),
            };
            if &cred.id != id || cred.version == 0 || !sealed_ok {
                return Err(format!("credentials: credential {id} is malformed"));
            }
        }
        for (id, lease) in &c.leases {
            if lease.id != *id || *id >= c.next_lease_id {
                return Err(format!("credentials: lease {id} stored under another id"));
            }
        }
        let active = c.leases.values().filter(|l| l.is_active()).count();
        if active != c.active_by_task.len() {
            return Err("credentials: active leases and their index disagree".into());
        }
        for (task, id) in &c.active_by_task {
            let lease = c
                .leases
                .get(id)
                .filter(|l| l.is_active() && l.task == *task)
                .ok_or_else(|| format!("credentials: task {task} indexes a dead lease {id}"))?;
            let t = self
                .task(*task)
                .ok_or_else(|| format!("credentials: lease {id} of a missing task {task}"))?;
            if t.state.is_terminal()
                || t.attempt != lease.attempt
                || t.worker.as_ref() != Some(&lease.worker)
            {
                return Err(format!(
                    "credentials: lease {id} outlived attempt {} of task {task}",
                    lease.attempt
                ));
            }
        }
        Ok(())
    }

    /// INV-13 for agent profiles: each profile names a valid list; each runtime lease has at
    /// most one active credential lease, and only while it is active itself.
    fn check_profile_credentials(&self) -> Result<(), String> {
        use crate::limits::CREDENTIAL_LEASES_MAX;
        let c = &self.profile_credentials;
        if self.credentials.leases.len() + c.leases.len() > CREDENTIAL_LEASES_MAX {
            return Err("credentials: a record bound is exceeded".into());
        }
        for (profile, refs) in &c.refs {
            if !self.profiles.contains_key(profile)
                || refs.is_empty()
                || crate::manifest::check_credential_refs("credential_refs", refs).is_err()
            {
                return Err(format!(
                    "credentials: profile {profile}'s list is malformed"
                ));
            }
        }
        for (id, lease) in &c.leases {
            if lease.id != *id
                || *id >= self.credentials.next_lease_id
                || self.credentials.leases.contains_key(id)
            {
                return Err(format!(
                    "credentials: agent lease {id} stored under another id"
                ));
            }
        }
        let active = c.leases.values().filter(|l| l.is_active()).count();
        if active != c.active_by_lease.len() {
            return Err("credentials: active agent leases and their index disagree".into());
        }
        for (runtime, id) in &c.active_by_lease {
            let held = c
                .leases
                .get(id)
                .filter(|l| l.is_active() && l.lease == *runtime)
                .ok_or_else(|| format!("credentials: lease {runtime} indexes a dead lease {id}"))?;
            let alive = self.leases.get(runtime).is_some_and(|l| {
                l.state == crate::lease::LeaseState::Active
                    && l.profile == held.profile
                    && l.generation == held.generation
                    && l.holder.worker == held.worker
            });
            if !alive {
                return Err(format!(
                    "credentials: agent lease {id} outlived runtime lease {runtime}"
                ));
            }
        }
        Ok(())
    }

    /// The trust boundary's records agree with each other and stay within their bounds.
    fn check_access(&self) -> Result<(), String> {
        use crate::limits::{BOOTSTRAP_TOKENS_MAX, CERTIFICATES_MAX, OPERATOR_TOKENS_MAX};
        let a = &self.access;
        if a.operator_tokens.len() > OPERATOR_TOKENS_MAX
            || a.bootstrap_tokens.len() > BOOTSTRAP_TOKENS_MAX
            || a.certificates.len() > CERTIFICATES_MAX
        {
            return Err("access: a record bound is exceeded".into());
        }
        for (id, t) in &a.operator_tokens {
            if &t.id != id {
                return Err(format!("access: token {id} stored under another id"));
            }
        }
        for (id, t) in &a.bootstrap_tokens {
            if &t.id != id {
                return Err(format!(
                    "access: bootstrap token {id} stored under another id"
                ));
            }
        }
        if a.certificates.len() != a.certificates_by_identity.len() {
            return Err("access: certificate index and records differ in size".into());
        }
        for (identity, serial) in &a.certificates_by_identity {
            match a.certificates.get(serial) {
                Some(c) if &c.identity == identity && &c.serial == serial => {}
                _ => return Err(format!("access: certificate {serial} indexed wrongly")),
            }
        }
        for (child, parent) in &self.lineage.parent_of {
            // A pruned child keeps its link while its parent is held (`unlink_pruned`).
            let held = self.tasks.contains_key(child)
                || (self.task_was_pruned(*child) && self.tasks.contains_key(parent));
            if !held || !self.lineage.children.contains(&(*parent, *child)) {
                return Err(format!(
                    "lineage: task {child} linked to {parent} inconsistently"
                ));
            }
        }
        if self.lineage.children.len() != self.lineage.parent_of.len() {
            return Err("lineage: parent and child indexes differ in size".into());
        }
        a.audit.check()
    }

    fn check_projects_and_profiles(&self) -> Result<(), String> {
        for ((tenant, project), p) in &self.projects {
            if (&p.tenant, &p.project) != (tenant, project) {
                return Err(format!(
                    "INV-2: project {tenant}/{project} stored under another key"
                ));
            }
            if p.profiles.len() > p.max_profiles as usize {
                return Err(format!(
                    "INV-2: project {tenant}/{project} holds {} profiles, max {}",
                    p.profiles.len(),
                    p.max_profiles
                ));
            }
            if let Some(s) = &p.sandbox {
                if !self.workers.contains_key(&s.worker) {
                    return Err(format!(
                        "INV-1: sandbox of {tenant}/{project} on unknown worker"
                    ));
                }
            }
        }
        if self.profile_index.len() != self.profiles.len() {
            return Err("INV-2: profile index and profiles differ in size".into());
        }
        for ((tenant, project, key), id) in &self.profile_index {
            let p = self
                .profiles
                .get(id)
                .ok_or_else(|| format!("INV-2: index names missing profile {id}"))?;
            if (&p.tenant, &p.project, &p.key) != (tenant, project, key) {
                return Err(format!("INV-2: profile {id} indexed under another key"));
            }
            let owner = self
                .projects
                .get(&(tenant.clone(), project.clone()))
                .ok_or_else(|| format!("INV-2: profile {id} in a missing project"))?;
            if !owner.profiles.contains(id) {
                return Err(format!("INV-2: project does not list its profile {id}"));
            }
            if *id >= self.next_profile_id {
                return Err(format!("profile id {id} not below the allocator"));
            }
        }
        Ok(())
    }

    fn check_leases(&self) -> Result<(), String> {
        let mut slots: BTreeMap<(&_, &_), u32> = BTreeMap::new();
        let mut active_per_profile: BTreeMap<_, u32> = BTreeMap::new();
        let mut expiry = BTreeSet::new();
        let mut last_generation: BTreeMap<_, _> = BTreeMap::new();
        for (id, lease) in &self.leases {
            if lease.id != *id || *id >= self.next_lease_id {
                return Err(format!(
                    "lease {id} stored under another id or above the allocator"
                ));
            }
            let profile = self
                .profiles
                .get(&lease.profile)
                .ok_or_else(|| format!("lease {id} of missing profile"))?;
            // INV-3: generations rise with lease ids, never repeat, never pass the profile's.
            if let Some(prev) = last_generation.insert(lease.profile, lease.generation) {
                if lease.generation <= prev {
                    return Err(format!(
                        "INV-3: lease {id} has generation {} after {prev}",
                        lease.generation
                    ));
                }
            }
            if lease.generation > profile.generation || lease.generation.get() == 0 {
                return Err(format!(
                    "INV-3: lease {id} generation outside the profile's range"
                ));
            }
            if lease.state.holds_slot() {
                *slots.entry((&lease.tenant, &lease.project)).or_default() += 1;
            }
            match &lease.state {
                LeaseState::Active => {
                    *active_per_profile.entry(lease.profile).or_default() += 1;
                    if profile.live_lease != Some(*id) {
                        return Err(format!(
                            "INV-4: active lease {id} is not its profile's live"
                        ));
                    }
                    if lease.generation != profile.generation {
                        return Err(format!("INV-3: active lease {id} is not the newest"));
                    }
                    expiry.insert((lease.expires_at_ms, *id));
                }
                LeaseState::Fenced { .. } => {
                    if !profile.fenced_unreaped.contains(id) {
                        return Err(format!("INV-9: fenced lease {id} not tracked as unreaped"));
                    }
                }
                LeaseState::Reaped { evidence, .. } => {
                    if evidence.lease != *id
                        || evidence.generation != lease.generation
                        || evidence.populated
                    {
                        return Err(format!("INV-9: lease {id} reaped on wrong evidence"));
                    }
                }
                LeaseState::Released { .. } => {}
            }
        }
        for (id, p) in &self.profiles {
            if active_per_profile.get(id).copied().unwrap_or(0) > 1 {
                return Err(format!(
                    "INV-4: profile {id} has more than one active lease"
                ));
            }
            if let Some(live) = p.live_lease {
                match self.leases.get(&live) {
                    Some(l) if l.state == LeaseState::Active => {}
                    _ => return Err(format!("INV-4: profile {id} live lease {live} not active")),
                }
            }
            for f in &p.fenced_unreaped {
                match self.leases.get(f) {
                    Some(l) if matches!(l.state, LeaseState::Fenced { .. }) => {}
                    _ => return Err(format!("INV-9: profile {id} tracks {f} as unreaped")),
                }
            }
        }
        if !expiry.iter().eq(self.lease_expiry.iter()) {
            return Err("INV-5: the expiry index does not match the active leases".into());
        }
        for ((tenant, project), p) in &self.projects {
            let counted = slots.get(&(tenant, project)).copied().unwrap_or(0);
            if counted != p.slots_held {
                return Err(format!(
                    "INV-5: {tenant}/{project} counts {} slots, leases hold {counted}",
                    p.slots_held
                ));
            }
            if counted > p.max_active {
                return Err(format!(
                    "INV-5: {tenant}/{project} holds {counted} slots, max {}",
                    p.max_active
                ));
            }
            if counted > 0 && p.sandbox.is_none() {
                return Err(format!(
                    "INV-1: {tenant}/{project} has leases but no sandbox"
                ));
            }
        }
        Ok(())
    }

    fn check_capsules(&self) -> Result<(), String> {
        for (id, p) in &self.profiles {
            let mut prev: Option<&crate::capsule::ContinuityCapsule> = None;
            for c in &p.capsules {
                if !c.verify() {
                    return Err(format!(
                        "INV-7: capsule {} of {id} fails its digest",
                        c.sequence
                    ));
                }
                if let Some(before) = prev {
                    if c.sequence != before.sequence + 1 || c.previous != Some(before.digest) {
                        return Err(format!("INV-7: chain of {id} breaks at {}", c.sequence));
                    }
                } else if c.sequence == 1 && c.previous.is_some() {
                    return Err(format!("INV-7: first capsule of {id} names a previous"));
                }
                prev = Some(c);
            }
            let head = p.capsule_head.map(|h| (h.sequence, h.digest));
            if head != prev.map(|c| (c.sequence, c.digest)) {
                return Err(format!(
                    "INV-7: capsule head of {id} is not the last capsule"
                ));
            }
        }
        Ok(())
    }

    fn check_mailboxes(&self) -> Result<(), String> {
        if self.mailboxes.len() != self.profiles.len() {
            return Err("mailboxes and profiles differ".into());
        }
        for (id, m) in &self.mailboxes {
            if m.acked_through >= m.next_seq {
                return Err(format!("mailbox {id} acknowledged past its head"));
            }
            for seq in m.messages.keys() {
                if *seq <= m.acked_through || *seq >= m.next_seq {
                    return Err(format!(
                        "mailbox {id} holds message {seq} outside its window"
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_tasks(&self) -> Result<(), String> {
        let mut pending = BTreeSet::new();
        let mut assigned: BTreeMap<_, BTreeSet<_>> = BTreeMap::new();
        let mut ended_figures = self.pruned_tasks.clone();
        for (id, record) in &self.tasks {
            let t = &record.view();
            if t.state != record.state()
                || record.ended_at_ms() != t.state.is_terminal().then(|| ended_at_ms(t))
            {
                return Err(format!("task {id} is held unlike it is ({})", t.state));
            }
            if t.state.is_terminal() {
                ended_figures.add(t);
            }
            if t.id != *id || *id >= self.next_task_id {
                return Err(format!(
                    "task {id} stored under another id or above the allocator"
                ));
            }
            if !t.entered_at_ms.contains_key(&t.state) {
                return Err(format!(
                    "INV-10: task {id} has no entry time for {}",
                    t.state
                ));
            }
            match t.state {
                TaskState::Pending => {
                    if t.worker.is_some() {
                        return Err(format!("INV-10: pending task {id} has a worker"));
                    }
                    pending.insert(queue_key(t));
                }
                s if s.is_assigned() => {
                    let w = t
                        .worker
                        .clone()
                        .ok_or_else(|| format!("INV-10: task {id} in {s} without a worker"))?;
                    assigned.entry(w).or_default().insert(*id);
                }
                TaskState::Completed => {
                    let code = t.exit_code.unwrap_or(-1);
                    if !t.spec.lifecycle.success_exit_codes.contains(&code) {
                        return Err(format!("INV-10: task {id} completed with exit code {code}"));
                    }
                }
                _ => {}
            }
        }
        if !pending.iter().eq(self.pending.iter()) {
            return Err("INV-10: the pending queue does not match the PENDING tasks".into());
        }
        if ended_figures != *self.ended_tasks_tally() {
            return Err("retention: the ended tasks' figures disagree with the tasks".into());
        }
        for (wid, w) in &self.workers {
            let expect = assigned.remove(wid).unwrap_or_default();
            if expect != w.tasks {
                return Err(format!(
                    "INV-10: worker {wid} task set disagrees with the tasks"
                ));
            }
        }
        if let Some((wid, _)) = assigned.into_iter().next() {
            return Err(format!("INV-10: tasks assigned to unknown worker {wid}"));
        }
        Ok(())
    }
}
