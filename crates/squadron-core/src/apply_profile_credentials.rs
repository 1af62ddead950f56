//! Credentials of agent profiles (INV-13): which ones a profile is given, and the lease that
//! hands them to the generation running under an active runtime lease.

use crate::access::Subject;
use crate::command::{
    GrantAgentCredentialLease, RegrantAgentCredentialLease, SetProfileCredentials,
};
use crate::credential::{still_kept, LeaseRevocation};
use crate::ids::WorkerId;
use crate::ids::{CredentialId, CredentialLeaseId, LeaseId};
use crate::lease::FencingToken;
use crate::limits::CREDENTIAL_LEASES_MAX;
use crate::manifest::{check_credential_refs, CredentialRef};
use crate::profile_credentials::{agent_session_name, AgentCredentialLease};
use crate::rejection::Rejection;
use crate::response::{GrantedCredential, Outcome};
use crate::state::State;

impl State {
    /// An admin names the credentials (each live) a profile's next generations are given.
    pub(crate) fn set_profile_credentials(
        &mut self,
        now: u64,
        subject: &Subject,
        c: SetProfileCredentials,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(now, subject)?;
        self.profile_ref(c.profile)?;
        check_credential_refs("credential_refs", &c.credential_refs)?;
        for (i, r) in c.credential_refs.iter().enumerate() {
            self.live_credential(&format!("credential_refs[{i}].id"), &r.id)?;
        }
        if c.credential_refs.is_empty() {
            self.profile_credentials.refs.remove(&c.profile);
        } else {
            self.profile_credentials
                .refs
                .insert(c.profile, c.credential_refs.clone());
        }
        Ok(Outcome::ProfileCredentialsSet {
            profile: c.profile,
            credential_refs: c.credential_refs,
        })
    }

    /// The worker holding the profile's active runtime lease gets the values the profile
    /// names. A second grant under the same runtime lease hands out the same lease again (a
    /// lost answer): its own credentials, with the values current now (the profile's list
    /// applies from the next generation on).
    pub(crate) fn grant_agent_credential_lease(
        &mut self,
        now: u64,
        subject: &Subject,
        c: GrantAgentCredentialLease,
    ) -> Result<Outcome, Rejection> {
        self.check_agent_grant(now, subject, &c.fence, &c.worker)?;
        if let Some(id) = self.active_agent_lease(&c.fence) {
            return self.agent_lease_again(&c.fence, id);
        }
        let refs = self.profile_credentials.refs_of(c.fence.profile);
        if refs.is_empty() {
            return Err(Rejection::invalid(
                "credential_refs",
                format!("profile {} names no credentials", c.fence.profile),
            ));
        }
        let granted = self.granted_values("credential_refs", refs)?;
        let leased = crate::apply_credentials::leased(&granted);
        let id = self.record_agent_credential_lease(now, &c, leased)?;
        Ok(lease_granted(&c.fence, id, granted))
    }

    /// A resumed generation's lease again, with the values current now, while it is the
    /// generation's active one; otherwise a refusal that changes nothing.
    pub(crate) fn regrant_agent_credential_lease(
        &mut self,
        now: u64,
        subject: &Subject,
        c: RegrantAgentCredentialLease,
    ) -> Result<Outcome, Rejection> {
        self.check_agent_grant(now, subject, &c.fence, &c.worker)?;
        match self.active_agent_lease(&c.fence) {
            Some(id) if id == c.only_lease => self.agent_lease_again(&c.fence, id),
            _ => Err(Rejection::invalid(
                "only_lease",
                format!(
                    "credential lease {} is not the active one of profile {} generation {} \
                     (it ended); a resumed generation is given no new one",
                    c.only_lease, c.fence.profile, c.fence.generation
                ),
            )),
        }
    }

    /// What every grant checks: the caller is the worker holding the generation's active
    /// runtime lease.
    fn check_agent_grant(
        &self,
        now: u64,
        subject: &Subject,
        fence: &FencingToken,
        worker: &WorkerId,
    ) -> Result<(), Rejection> {
        if subject.worker() != Some(worker) {
            return Err(Rejection::denied(format!(
                "only worker {worker} may take the credentials of a generation it runs, not \
                 {subject}"
            )));
        }
        let lease = self.check_fence(fence, now, true)?;
        if lease.holder.worker != *worker {
            return Err(Rejection::denied(format!(
                "lease {} is held by worker {}, not {worker}",
                lease.id, lease.holder.worker
            )));
        }
        Ok(())
    }

    fn active_agent_lease(&self, fence: &FencingToken) -> Option<CredentialLeaseId> {
        self.profile_credentials
            .active_by_lease
            .get(&fence.lease)
            .copied()
    }

    /// Active lease `id` granted again: the credentials it was granted (each still live, or
    /// the lease would have ended), their values and versions as they are now.
    fn agent_lease_again(
        &mut self,
        fence: &FencingToken,
        id: CredentialLeaseId,
    ) -> Result<Outcome, Rejection> {
        let held = self
            .profile_credentials
            .leases
            .get(&id)
            .expect("active leases exist");
        let refs: Vec<CredentialRef> = held
            .credentials
            .iter()
            .map(|l| CredentialRef {
                id: l.id.clone(),
                mount: l.mount.clone(),
            })
            .collect();
        let granted = self.granted_values("credential_refs", &refs)?;
        let leased = crate::apply_credentials::leased(&granted);
        self.profile_credentials
            .leases
            .get_mut(&id)
            .expect("active leases exist")
            .credentials = leased;
        Ok(lease_granted(fence, id, granted))
    }

    fn record_agent_credential_lease(
        &mut self,
        now: u64,
        c: &GrantAgentCredentialLease,
        credentials: Vec<crate::credential::LeasedCredential>,
    ) -> Result<CredentialLeaseId, Rejection> {
        let held = self.credentials.leases.len() + self.profile_credentials.lease_count();
        if held >= CREDENTIAL_LEASES_MAX {
            return Err(Rejection::QueueFull {
                max: CREDENTIAL_LEASES_MAX,
            });
        }
        let id = self.credentials.next_lease_id;
        self.credentials.next_lease_id = id.next();
        self.profile_credentials.leases.insert(
            id,
            AgentCredentialLease {
                id,
                profile: c.fence.profile,
                lease: c.fence.lease,
                generation: c.fence.generation,
                worker: c.worker.clone(),
                credentials,
                granted_at_ms: now,
                revoked: None,
            },
        );
        self.profile_credentials
            .active_by_lease
            .insert(c.fence.lease, id);
        Ok(id)
    }

    /// Ends the credential lease of a runtime lease, if it has one: whenever that runtime
    /// lease stops being active.
    pub(crate) fn end_agent_credential_lease(&mut self, now: u64, lease: LeaseId, reason: &str) {
        let Some(id) = self.profile_credentials.active_by_lease.remove(&lease) else {
            return;
        };
        let held = self
            .profile_credentials
            .leases
            .get_mut(&id)
            .expect("active leases exist");
        held.revoked = Some(LeaseRevocation {
            at_ms: now,
            reason: reason.to_string(),
        });
    }

    /// Ends every active agent lease that holds `credential`; returns how many.
    pub(crate) fn end_agent_leases_holding(&mut self, now: u64, credential: &CredentialId) -> u32 {
        let holding: Vec<LeaseId> = self
            .profile_credentials
            .active_by_lease
            .iter()
            .filter(|(_, id)| {
                self.profile_credentials.leases[*id]
                    .credentials
                    .iter()
                    .any(|held| held.id == *credential)
            })
            .map(|(lease, _)| *lease)
            .collect();
        for lease in &holding {
            self.end_agent_credential_lease(
                now,
                *lease,
                &format!("credential {credential} revoked"),
            );
        }
        u32::try_from(holding.len()).unwrap_or(u32::MAX)
    }

    /// Drops ended agent leases past their retention.
    pub(crate) fn prune_agent_credential_leases(&mut self, now: u64) {
        self.profile_credentials
            .leases
            .retain(|_, lease| still_kept(lease.revoked.as_ref(), now));
    }

    pub fn profile_credentials(&self) -> &crate::profile_credentials::ProfileCredentials {
        &self.profile_credentials
    }
}

fn lease_granted(
    fence: &FencingToken,
    lease: CredentialLeaseId,
    credentials: Vec<GrantedCredential>,
) -> Outcome {
    Outcome::CredentialLeaseGranted {
        lease,
        session: agent_session_name(fence.profile, fence.generation),
        credentials,
    }
}
