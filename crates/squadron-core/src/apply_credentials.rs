//! The credential store and its session leases (INV-13).

use crate::access::Subject;
use crate::command::{
    GrantCredentialLease, PutCredential, RegrantCredentialLease, RevokeCredential,
    RotateCredential, SetCredentialEgress,
};
use crate::credential::{
    session_name, still_kept, Credential, CredentialLease, LeaseRevocation, LeasedCredential,
};
use crate::credential_egress::EgressBinding;
use crate::ids::{CredentialId, TaskId};
use crate::limits::{CREDENTIALS_MAX, CREDENTIAL_DESCRIPTION_BYTES_MAX, CREDENTIAL_LEASES_MAX};
use crate::manifest::{CredentialRef, NetworkMode, RuntimeKind, TaskSpec};
use crate::rejection::{Entity, Rejection};
use crate::response::{GrantedCredential, Outcome};
use crate::state::State;
use crate::task::TaskState;

impl State {
    pub(crate) fn put_credential(
        &mut self,
        now: u64,
        subject: &Subject,
        c: PutCredential,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(now, subject)?;
        c.sealed.check("sealed")?;
        check_description(&c.description)?;
        let version = match self.credentials.credentials.get(&c.id) {
            Some(old) if !old.is_revoked() => {
                return Err(Rejection::AlreadyExists {
                    entity: Entity::Credential,
                    id: c.id.to_string(),
                })
            }
            Some(old) => old.version + 1,
            None if self.credentials.credentials.len() >= CREDENTIALS_MAX => {
                return Err(Rejection::invalid(
                    "id",
                    format!("the cluster holds {CREDENTIALS_MAX} credentials, its limit"),
                ))
            }
            None => 1,
        };
        let credential = Credential {
            id: c.id.clone(),
            version,
            description: c.description,
            sealed: Some(c.sealed),
            created_at_ms: now,
            created_by: subject.clone(),
            updated_at_ms: now,
            revoked_at_ms: None,
        };
        self.credentials
            .credentials
            .insert(c.id.clone(), credential);
        Ok(Outcome::CredentialStored { id: c.id, version })
    }

    pub(crate) fn rotate_credential(
        &mut self,
        now: u64,
        subject: &Subject,
        c: RotateCredential,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(now, subject)?;
        c.sealed.check("sealed")?;
        let field = "id";
        let credential = self.live_credential(field, &c.id)?;
        let version = credential.version + 1;
        let credential = self
            .credentials
            .credentials
            .get_mut(&c.id)
            .expect("checked above");
        credential.version = version;
        credential.sealed = Some(c.sealed);
        credential.updated_at_ms = now;
        Ok(Outcome::CredentialStored { id: c.id, version })
    }

    pub(crate) fn revoke_credential(
        &mut self,
        now: u64,
        subject: &Subject,
        c: RevokeCredential,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(now, subject)?;
        self.live_credential("id", &c.id)?;
        let credential = self
            .credentials
            .credentials
            .get_mut(&c.id)
            .expect("checked above");
        credential.sealed = None;
        credential.revoked_at_ms = Some(now);
        credential.updated_at_ms = now;
        self.credential_egress.remove(&c.id);
        let holding: Vec<TaskId> = self
            .credentials
            .active_by_task
            .iter()
            .filter(|(_, lease)| {
                self.credentials.leases[*lease]
                    .credentials
                    .iter()
                    .any(|held| held.id == c.id)
            })
            .map(|(task, _)| *task)
            .collect();
        for task in &holding {
            self.end_credential_lease(now, *task, &format!("credential {} revoked", c.id));
        }
        let agents = self.end_agent_leases_holding(now, &c.id);
        let tasks = u32::try_from(holding.len()).unwrap_or(u32::MAX);
        Ok(Outcome::CredentialRevoked {
            id: c.id,
            leases_revoked: tasks.saturating_add(agents),
        })
    }

    /// The worker running the task's current attempt gets the values its manifest names. A
    /// second grant for the same attempt hands out the same lease again (a lost answer).
    pub(crate) fn grant_credential_lease(
        &mut self,
        now: u64,
        subject: &Subject,
        c: GrantCredentialLease,
    ) -> Result<Outcome, Rejection> {
        let granted = self.task_grant_values(subject, &c)?;
        let lease = match self.credentials.active_by_task.get(&c.task).copied() {
            // A rotation in between hands out the current value: the lease says which.
            Some(id) => {
                let lease = self
                    .credentials
                    .leases
                    .get_mut(&id)
                    .expect("active leases exist");
                lease.credentials = leased(&granted);
                id
            }
            None => self.record_credential_lease(now, &c, &granted)?,
        };
        Ok(Outcome::CredentialLeaseGranted {
            lease,
            session: session_name(c.task, c.attempt),
            credentials: granted,
        })
    }

    /// A resumed attempt's lease again, with the values current now, while it is the task's
    /// active one; otherwise a refusal that changes nothing.
    pub(crate) fn regrant_credential_lease(
        &mut self,
        now: u64,
        subject: &Subject,
        c: RegrantCredentialLease,
    ) -> Result<Outcome, Rejection> {
        let grant = GrantCredentialLease {
            task: c.task,
            worker: c.worker,
            attempt: c.attempt,
        };
        // The task's active lease, and (a second guard: every change of attempt or owner ends
        // it) one granted to this attempt on this worker.
        let held = self
            .credentials
            .active_by_task
            .get(&c.task)
            .filter(|id| **id == c.only_lease)
            .and_then(|id| self.credentials.leases.get(id))
            .is_some_and(|l| l.attempt == c.attempt && l.worker == grant.worker);
        if !held {
            // The checks first: a caller that may not ask learns nothing of the lease.
            self.task_grant_values(subject, &grant)?;
            return Err(Rejection::invalid(
                "only_lease",
                format!(
                    "credential lease {} is not the active one of task {} (it ended); a resumed \
                     attempt is given no new one",
                    c.only_lease, c.task
                ),
            ));
        }
        self.grant_credential_lease(now, subject, grant)
    }

    /// What every grant of a task's credentials checks — the caller runs the task's current
    /// attempt, which is being set up or runs, and names credentials — and their values now.
    fn task_grant_values(
        &self,
        subject: &Subject,
        c: &GrantCredentialLease,
    ) -> Result<Vec<GrantedCredential>, Rejection> {
        if subject.worker() != Some(&c.worker) {
            return Err(Rejection::denied(format!(
                "only worker {} may take the credentials of its task, not {subject}",
                c.worker
            )));
        }
        let task = &self.task_ref(c.task)?;
        self.check_owner(task, &c.worker, c.attempt)?;
        if !matches!(
            task.state,
            TaskState::Provisioning | TaskState::Ready | TaskState::Running
        ) {
            return Err(Rejection::IllegalTransition {
                from: task.state,
                to: task.state,
                reason: "credentials are handed out only while the sandbox is set up or runs"
                    .into(),
            });
        }
        let refs = credential_refs(&task.spec);
        if refs.is_empty() {
            return Err(Rejection::invalid(
                "startup_profile.credential_refs",
                format!("task {} names no credentials", c.task),
            ));
        }
        self.granted_values("startup_profile.credential_refs", refs)
    }

    /// The values `refs` name, each of a live credential; errors name `{field}[i].id`.
    pub(crate) fn granted_values(
        &self,
        field: &str,
        refs: &[CredentialRef],
    ) -> Result<Vec<GrantedCredential>, Rejection> {
        refs.iter()
            .enumerate()
            .map(|(i, r)| {
                let field = format!("{field}[{i}].id");
                let credential = self.live_credential(&field, &r.id)?;
                Ok(GrantedCredential {
                    id: r.id.clone(),
                    mount: r.mount.clone(),
                    version: credential.version,
                    sealed: credential
                        .sealed
                        .clone()
                        .expect("live credentials hold a value"),
                })
            })
            .collect()
    }

    fn record_credential_lease(
        &mut self,
        now: u64,
        c: &GrantCredentialLease,
        granted: &[GrantedCredential],
    ) -> Result<crate::ids::CredentialLeaseId, Rejection> {
        if self.credentials.leases.len() >= CREDENTIAL_LEASES_MAX {
            return Err(Rejection::QueueFull {
                max: CREDENTIAL_LEASES_MAX,
            });
        }
        let id = self.credentials.next_lease_id;
        self.credentials.next_lease_id = id.next();
        let lease = CredentialLease {
            id,
            task: c.task,
            attempt: c.attempt,
            worker: c.worker.clone(),
            credentials: leased(granted),
            granted_at_ms: now,
            revoked: None,
        };
        self.credentials.leases.insert(id, lease);
        self.credentials.active_by_task.insert(c.task, id);
        Ok(id)
    }

    /// Ends the task's active lease, if it has one: at every terminal state, requeue and loss
    /// of its worker.
    pub(crate) fn end_credential_lease(&mut self, now: u64, task: TaskId, reason: &str) {
        let Some(id) = self.credentials.active_by_task.remove(&task) else {
            return;
        };
        let lease = self
            .credentials
            .leases
            .get_mut(&id)
            .expect("active leases exist");
        lease.revoked = Some(LeaseRevocation {
            at_ms: now,
            reason: reason.to_string(),
        });
    }

    /// Drops revoked leases past their retention.
    pub(crate) fn prune_credential_leases(&mut self, now: u64) {
        self.credentials
            .leases
            .retain(|_, lease| still_kept(lease.revoked.as_ref(), now));
    }

    /// An admin binds a live credential to its upstream, or unbinds it. Leases granted before
    /// keep what they were handed; the next grant follows the binding.
    pub(crate) fn set_credential_egress(
        &mut self,
        now: u64,
        subject: &Subject,
        c: SetCredentialEgress,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(now, subject)?;
        self.live_credential("id", &c.id)?;
        let bound = c.egress.is_some();
        match c.egress {
            Some(binding) => {
                binding.check("egress")?;
                self.credential_egress.insert(c.id.clone(), binding);
            }
            None => {
                self.credential_egress.remove(&c.id);
            }
        }
        Ok(Outcome::CredentialEgressSet { id: c.id, bound })
    }

    /// Where a credential may be sent, when it is injected at egress.
    pub fn credential_egress(&self, id: &CredentialId) -> Option<&EgressBinding> {
        self.credential_egress.get(id)
    }

    /// Whether the manifest's references name live credentials, and whether the sandbox can
    /// take those injected at egress: the edge asks before it proposes a submission, so a
    /// typo fails at once instead of at the start. (Not a rule of `apply`: a log written
    /// before credentials existed must replay as it was applied; the worker checks again.)
    pub fn check_credential_refs(&self, spec: &TaskSpec) -> Result<(), Rejection> {
        for (i, r) in credential_refs(spec).iter().enumerate() {
            self.live_credential(&format!("startup_profile.credential_refs[{i}].id"), &r.id)?;
            if self.credential_egress.contains_key(&r.id) {
                check_egress_sandbox(spec, &r.id)?;
            }
        }
        Ok(())
    }

    pub(crate) fn live_credential(
        &self,
        field: &str,
        id: &CredentialId,
    ) -> Result<&Credential, Rejection> {
        match self.credentials.credentials.get(id) {
            None => Err(Rejection::not_found(Entity::Credential, id)),
            Some(c) if c.is_revoked() => Err(Rejection::CredentialRevoked {
                field: field.to_string(),
                id: id.to_string(),
            }),
            Some(c) => Ok(c),
        }
    }
}

/// What a lease records of the values it hands out: ids, mounts, versions.
pub(crate) fn leased(granted: &[GrantedCredential]) -> Vec<LeasedCredential> {
    granted
        .iter()
        .map(|g| LeasedCredential {
            id: g.id.clone(),
            mount: g.mount.clone(),
            version: g.version,
        })
        .collect()
}

fn credential_refs(spec: &TaskSpec) -> &[CredentialRef] {
    spec.startup_profile
        .as_ref()
        .map_or(&[], |p| p.credential_refs.as_slice())
}

fn check_description(text: &str) -> Result<(), Rejection> {
    if text.len() > CREDENTIAL_DESCRIPTION_BYTES_MAX || text.chars().any(char::is_control) {
        return Err(Rejection::invalid(
            "description",
            format!("must be at most {CREDENTIAL_DESCRIPTION_BYTES_MAX} bytes of printable text"),
        ));
    }
    Ok(())
}

/// A credential injected at egress needs a place for the worker's proxy to listen before the
/// provider starts: the loopback of a network namespace of the sandbox's own (the process and
/// Docker runtimes' `isolated`, `outbound` and `gateway`; `full` is the host's), or a KVM
/// guest's loopback, where its agent accepts for the proxy over the agent's channel in every
/// network mode.
pub fn check_egress_sandbox(spec: &TaskSpec, id: &CredentialId) -> Result<(), Rejection> {
    let sandbox = &spec.sandbox;
    if sandbox.runtime != RuntimeKind::Kvm && sandbox.network_mode == NetworkMode::Full {
        return Err(Rejection::invalid(
            "vm.network_mode",
            format!(
                "credential {id} is injected at egress, which needs a network of the sandbox's \
                 own: isolated, outbound or gateway (or a KVM guest)"
            ),
        ));
    }
    Ok(())
}
