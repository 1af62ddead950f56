//! Tokens, enrollment and certificates, and the subject checks other handlers share.

use crate::access::{
    BootstrapPurpose, BootstrapToken, Consumption, Identity, IssuedCertificate, OperatorToken,
    Role, Subject,
};
use crate::command::{
    CreateOperatorToken, Enroll, MintBootstrapToken, RecordCertificate, RevokeIdentity,
    RevokeOperatorToken,
};
use crate::ids::WorkerId;
use crate::limits::{
    ACCESS_RECORD_RETENTION_MS, BOOTSTRAP_TOKENS_MAX, BOOTSTRAP_TOKEN_TTL_MS_MAX,
    BOOTSTRAP_TOKEN_TTL_MS_MIN, CERTIFICATES_MAX, CERT_CLOCK_SKEW_MS_MAX, CERT_VALIDITY_MS_MAX,
    OPERATOR_TOKENS_MAX, REVOCATION_REASON_BYTES_MAX, TOKEN_NAME_BYTES_MAX,
    TOKEN_SCOPE_ENTRIES_MAX,
};
use crate::rejection::{Entity, Rejection};
use crate::response::Outcome;
use crate::state::State;

impl State {
    // --- subject checks shared by handlers ---------------------------------------------------

    /// Admin-only commands: an admin's live token, the cluster itself, or an old entry.
    pub(crate) fn require_admin(&self, now: u64, subject: &Subject) -> Result<(), Rejection> {
        match subject {
            Subject::System | Subject::Legacy => Ok(()),
            Subject::Operator(id) => match self.access.operator_tokens.get(id) {
                Some(t) if t.is_live(now) && t.role == Role::Admin => Ok(()),
                _ => Err(Rejection::denied("only an admin may do this")),
            },
            other => Err(Rejection::denied(format!(
                "only an admin may do this, not {other}"
            ))),
        }
    }

    /// Commands a worker sends for itself: only that worker (or an old entry, applied as it
    /// was) may send them.
    pub(crate) fn require_worker(
        &self,
        subject: &Subject,
        worker: &WorkerId,
    ) -> Result<(), Rejection> {
        match subject {
            Subject::Legacy => Ok(()),
            Subject::Worker(w) if w == worker => Ok(()),
            other => Err(Rejection::denied(format!(
                "only worker {worker} may send this, not {other}"
            ))),
        }
    }

    /// A worker subject may act only for itself; operators and the system may name any
    /// worker (an operator's manual lease, say).
    pub(crate) fn require_not_other_worker(
        &self,
        subject: &Subject,
        worker: &WorkerId,
    ) -> Result<(), Rejection> {
        match subject.worker() {
            Some(w) if w != worker => Err(Rejection::denied(format!(
                "worker {w} may not act for worker {worker}"
            ))),
            _ => Ok(()),
        }
    }

    /// Acting under a lease's fence: a worker only as the holder's worker, an agent only as
    /// the fenced generation of the fenced profile. Operators and the system may (an
    /// operator's manual lease).
    pub(crate) fn require_holder_side(
        &self,
        subject: &Subject,
        fence: &crate::lease::FencingToken,
    ) -> Result<(), Rejection> {
        let lease = self.lease_ref(fence.lease)?;
        match subject {
            Subject::Worker(w) if *w != lease.holder.worker => Err(Rejection::denied(format!(
                "worker {w} may not act under lease {} of worker {}",
                fence.lease, lease.holder.worker
            ))),
            Subject::Agent(crate::access::AgentIdentity::ProfileGeneration {
                profile,
                generation,
            }) if *profile != fence.profile || *generation != fence.generation => {
                Err(Rejection::denied(format!(
                    "agent of profile {profile} generation {} may not act under this fence",
                    generation.get()
                )))
            }
            Subject::Agent(crate::access::AgentIdentity::Task(t)) => Err(Rejection::denied(
                format!("the agent of task {t} holds no lease"),
            )),
            _ => Ok(()),
        }
    }

    // --- operator tokens ---------------------------------------------------------------------

    pub(crate) fn create_operator_token(
        &mut self,
        now: u64,
        subject: &Subject,
        c: CreateOperatorToken,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(now, subject)?;
        check_token_name(&c.name)?;
        check_scope(c.role, c.scope.len())?;
        if let Some(e) = c.expires_at_ms {
            if e <= now {
                return Err(Rejection::invalid(
                    "expires_at_ms",
                    "must lie in the future",
                ));
            }
        }
        if self.access.operator_tokens.contains_key(&c.id) {
            return Err(Rejection::AlreadyExists {
                entity: Entity::Token,
                id: c.id.to_string(),
            });
        }
        if self.access.operator_tokens.len() >= OPERATOR_TOKENS_MAX {
            return Err(Rejection::QueueFull {
                max: OPERATOR_TOKENS_MAX,
            });
        }
        let id = c.id.clone();
        self.access.operator_tokens.insert(
            c.id.clone(),
            OperatorToken {
                id: c.id,
                digest: c.digest,
                role: c.role,
                scope: c.scope,
                name: c.name,
                created_at_ms: now,
                created_by: subject.clone(),
                expires_at_ms: c.expires_at_ms,
                revoked_at_ms: None,
            },
        );
        Ok(Outcome::OperatorTokenCreated { id })
    }

    /// Revoking twice is not an error: the token stays revoked from the first time.
    pub(crate) fn revoke_operator_token(
        &mut self,
        now: u64,
        subject: &Subject,
        c: RevokeOperatorToken,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(now, subject)?;
        let token = self
            .access
            .operator_tokens
            .get_mut(&c.id)
            .ok_or_else(|| Rejection::not_found(Entity::Token, &c.id))?;
        token.revoked_at_ms.get_or_insert(now);
        Ok(Outcome::OperatorTokenRevoked { id: c.id })
    }

    // --- bootstrap tokens and enrollment -----------------------------------------------------

    pub(crate) fn mint_bootstrap_token(
        &mut self,
        now: u64,
        subject: &Subject,
        c: MintBootstrapToken,
    ) -> Result<Outcome, Rejection> {
        self.require_minter(now, subject, &c.purpose)?;
        let ttl = c.expires_at_ms.saturating_sub(now);
        if !(BOOTSTRAP_TOKEN_TTL_MS_MIN..=BOOTSTRAP_TOKEN_TTL_MS_MAX).contains(&ttl) {
            return Err(Rejection::invalid(
                "ttl",
                format!(
                    "a bootstrap token lives {BOOTSTRAP_TOKEN_TTL_MS_MIN} to \
                     {BOOTSTRAP_TOKEN_TTL_MS_MAX} ms, got {ttl}"
                ),
            ));
        }
        if self.access.bootstrap_tokens.contains_key(&c.id) {
            return Err(Rejection::AlreadyExists {
                entity: Entity::Token,
                id: c.id.to_string(),
            });
        }
        if self.access.bootstrap_tokens.len() >= BOOTSTRAP_TOKENS_MAX {
            return Err(Rejection::QueueFull {
                max: BOOTSTRAP_TOKENS_MAX,
            });
        }
        let (id, expires_at_ms) = (c.id.clone(), c.expires_at_ms);
        self.access.bootstrap_tokens.insert(
            c.id.clone(),
            BootstrapToken {
                id: c.id,
                digest: c.digest,
                purpose: c.purpose,
                created_at_ms: now,
                created_by: subject.clone(),
                expires_at_ms: c.expires_at_ms,
                consumed: None,
            },
        );
        Ok(Outcome::BootstrapTokenMinted { id, expires_at_ms })
    }

    /// Consumes the token and records the certificate, or changes nothing. Every refusal of
    /// the token itself reads the same to the caller ("not accepted"), so probing learns
    /// nothing about which tokens exist.
    pub(crate) fn enroll(&mut self, now: u64, c: Enroll) -> Result<Outcome, Rejection> {
        let refused = || Rejection::unauthenticated("the bootstrap token is not accepted");
        let token = self
            .access
            .bootstrap_tokens
            .get(&c.token)
            .ok_or_else(refused)?;
        if token.digest != c.presented || token.consumed.is_some() || now >= token.expires_at_ms {
            return Err(refused());
        }
        if !token.purpose.admits(&c.identity) {
            return Err(Rejection::denied(format!(
                "this bootstrap token does not enroll {}",
                c.identity
            )));
        }
        if matches!(token.purpose, BootstrapPurpose::Worker { worker: None }) {
            self.check_unknown_worker(&c.identity)?;
        }
        self.check_new_certificate(now, &c.serial, c.not_after_ms)?;
        let token = self
            .access
            .bootstrap_tokens
            .get_mut(&c.token)
            .ok_or_else(refused)?;
        token.consumed = Some(Consumption {
            at_ms: now,
            identity: c.identity.clone(),
        });
        self.insert_certificate(now, c.identity.clone(), c.serial.clone(), c.not_after_ms);
        Ok(Outcome::Enrolled {
            identity: c.identity,
            serial: c.serial,
            not_after_ms: c.not_after_ms,
        })
    }

    /// An unbound worker token may not take over an id the cluster already knows: that would
    /// let whoever holds the token speak for an existing worker.
    fn check_unknown_worker(&self, identity: &Identity) -> Result<(), Rejection> {
        let Identity::Worker(w) = identity else {
            return Ok(());
        };
        let known = self.workers.contains_key(w)
            || self
                .access
                .certificates_by_identity
                .range((identity.clone(), crate::access::CertSerial::min())..)
                .next()
                .is_some_and(|(i, _)| i == identity);
        if known {
            return Err(Rejection::denied(format!(
                "worker {w} is known to the cluster; enroll it with a token bound to it \
                 (squadron token bootstrap --for worker --worker {w})"
            )));
        }
        Ok(())
    }

    fn check_new_certificate(
        &self,
        now: u64,
        serial: &crate::access::CertSerial,
        not_after_ms: u64,
    ) -> Result<(), Rejection> {
        if not_after_ms <= now || not_after_ms > now + CERT_VALIDITY_MS_MAX + CERT_CLOCK_SKEW_MS_MAX
        {
            return Err(Rejection::invalid(
                "not_after_ms",
                format!("must lie within {CERT_VALIDITY_MS_MAX} ms from now"),
            ));
        }
        if self.access.certificates.contains_key(serial) {
            return Err(Rejection::AlreadyExists {
                entity: Entity::Certificate,
                id: serial.to_string(),
            });
        }
        if self.access.certificates.len() >= CERTIFICATES_MAX {
            return Err(Rejection::QueueFull {
                max: CERTIFICATES_MAX,
            });
        }
        Ok(())
    }

    fn insert_certificate(
        &mut self,
        now: u64,
        identity: Identity,
        serial: crate::access::CertSerial,
        not_after_ms: u64,
    ) {
        self.access
            .certificates_by_identity
            .insert((identity.clone(), serial.clone()));
        self.access.certificates.insert(
            serial.clone(),
            IssuedCertificate {
                serial,
                identity,
                issued_at_ms: now,
                not_after_ms,
                revoked_at_ms: None,
            },
        );
    }

    // --- certificates ------------------------------------------------------------------------

    /// A renewal: only the identity itself, while it holds a live certificate.
    pub(crate) fn record_certificate(
        &mut self,
        now: u64,
        subject: &Subject,
        c: RecordCertificate,
    ) -> Result<Outcome, Rejection> {
        let own = match (subject, &c.identity) {
            (Subject::Worker(w), Identity::Worker(id)) => w == id,
            (Subject::Agent(a), Identity::Agent(id)) => a == id,
            _ => false,
        };
        if !own {
            return Err(Rejection::denied(format!(
                "only {} renews its own certificate",
                c.identity
            )));
        }
        if !self.has_live_certificate(now, &c.identity) {
            return Err(Rejection::unauthenticated(format!(
                "{} holds no live certificate (revoked or expired); enroll again",
                c.identity
            )));
        }
        // A task's agent lives as long as its task: an agent key that leaked from a sandbox
        // must not outlive the task by renewing itself.
        if let Identity::Agent(crate::access::AgentIdentity::Task(task)) = &c.identity {
            match self.task_state(*task) {
                Some(s) if !s.is_terminal() => {}
                Some(s) => {
                    return Err(Rejection::denied(format!(
                        "task {task} is {s}: its agent's certificate is not renewed"
                    )))
                }
                None => return Err(Rejection::not_found(crate::rejection::Entity::Task, task)),
            }
        }
        self.check_new_certificate(now, &c.serial, c.not_after_ms)?;
        self.insert_certificate(now, c.identity, c.serial.clone(), c.not_after_ms);
        Ok(Outcome::CertificateRecorded {
            serial: c.serial,
            not_after_ms: c.not_after_ms,
        })
    }

    pub(crate) fn revoke_identity(
        &mut self,
        now: u64,
        subject: &Subject,
        c: RevokeIdentity,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(now, subject)?;
        if c.reason.trim().is_empty() || c.reason.len() > REVOCATION_REASON_BYTES_MAX {
            return Err(Rejection::invalid(
                "reason",
                format!("must be 1 to {REVOCATION_REASON_BYTES_MAX} bytes"),
            ));
        }
        let certificates = self.revoke_certificates_of(now, &c.identity);
        Ok(Outcome::IdentityRevoked {
            identity: c.identity,
            certificates,
        })
    }

    /// Revokes every certificate of `identity`; returns how many were live.
    pub(crate) fn revoke_certificates_of(&mut self, now: u64, identity: &Identity) -> u32 {
        let serials: Vec<_> = self
            .access
            .certificates_by_identity
            .range((identity.clone(), crate::access::CertSerial::min())..)
            .take_while(|(i, _)| i == identity)
            .map(|(_, s)| s.clone())
            .collect();
        let mut revoked = 0;
        for serial in serials {
            if let Some(cert) = self.access.certificates.get_mut(&serial) {
                if cert.revoked_at_ms.is_none() {
                    cert.revoked_at_ms = Some(now);
                    revoked += 1;
                }
            }
        }
        revoked
    }

    fn has_live_certificate(&self, now: u64, identity: &Identity) -> bool {
        self.access
            .certificates_by_identity
            .range((identity.clone(), crate::access::CertSerial::min())..)
            .take_while(|(i, _)| i == identity)
            .any(|(_, s)| {
                self.access
                    .certificates
                    .get(s)
                    .is_some_and(|c| c.is_live(now))
            })
    }

    /// The sweep's part: forget what expired or was revoked, and bootstrap tokens used or
    /// expired, once they have been listed for the retention period.
    pub(crate) fn prune_access(&mut self, now: u64) -> u64 {
        let cutoff = now.saturating_sub(ACCESS_RECORD_RETENTION_MS);
        let before = self.access.certificates.len()
            + self.access.bootstrap_tokens.len()
            + self.access.operator_tokens.len();
        let stale_certs: Vec<_> = self
            .access
            .certificates
            .values()
            .filter(|c| c.not_after_ms < cutoff || c.revoked_at_ms.is_some_and(|r| r < cutoff))
            .map(|c| (c.identity.clone(), c.serial.clone()))
            .collect();
        for key in stale_certs {
            self.access.certificates.remove(&key.1);
            self.access.certificates_by_identity.remove(&key);
        }
        self.access.bootstrap_tokens.retain(|_, t| {
            let ended = t.consumed.as_ref().map_or(t.expires_at_ms, |c| c.at_ms);
            ended >= cutoff
        });
        self.access.operator_tokens.retain(|_, t| {
            let ended = t.revoked_at_ms.or(t.expires_at_ms);
            ended.is_none_or(|e| e >= cutoff)
        });
        let after = self.access.certificates.len()
            + self.access.bootstrap_tokens.len()
            + self.access.operator_tokens.len();
        (before - after) as u64
    }
}

fn check_token_name(name: &str) -> Result<(), Rejection> {
    if name.trim().is_empty()
        || name.len() > TOKEN_NAME_BYTES_MAX
        || name.chars().any(char::is_control)
    {
        return Err(Rejection::invalid(
            "name",
            format!("must be 1 to {TOKEN_NAME_BYTES_MAX} printable bytes"),
        ));
    }
    Ok(())
}

fn check_scope(role: Role, entries: usize) -> Result<(), Rejection> {
    if entries > TOKEN_SCOPE_ENTRIES_MAX {
        return Err(Rejection::invalid(
            "scope",
            format!("holds at most {TOKEN_SCOPE_ENTRIES_MAX} entries, got {entries}"),
        ));
    }
    match role {
        Role::Admin if entries > 0 => Err(Rejection::invalid(
            "scope",
            "an admin token covers everything; give it no scope",
        )),
        Role::Operator if entries == 0 => Err(Rejection::invalid(
            "scope",
            "an operator token needs a scope: at least one tenant or project",
        )),
        _ => Ok(()),
    }
}
