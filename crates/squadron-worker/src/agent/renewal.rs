//! Renewal and self-fencing. Every running attempt's lease is renewed in one batch per tick;
//! what follows from the answer is decided by [`decide`], a pure step (tested below), and
//! then done: a renewed lease moves the attempt's deadline, a lease that is not (or cannot
//! be shown to be) the attempt's any more stops its provider.

use std::collections::BTreeMap;

use squadron_core::ids::{LeaseId, ProfileId};
use squadron_core::lease::FencingToken;
use squadron_proto::v1 as pb;

use crate::agent::supervisor::AgentSupervisor;
use crate::control_link::CallError;
use crate::support::write_atomic;

/// One lease's answer in a renewal batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseRenewal {
    pub(crate) lease: LeaseId,
    /// The new expiry (the leader's clock), or why the lease was not renewed (the
    /// rejection's text).
    pub(crate) result: Result<u64, String>,
}

/// What the control plane made of one renewal batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RenewalAnswer {
    /// Each lease's own answer.
    Renewed(Vec<LeaseRenewal>),
    /// The batch as a whole was refused (a worker that was declared lost).
    Refused(String),
    /// An answer of another kind; nothing can be concluded from it.
    Unexpected,
    /// No answer (the control plane unreachable, a leader change).
    Unanswered,
}

/// One thing to do after a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RenewalAction {
    /// The lease is renewed: the provider may run until `deadline_ms` (local clock).
    MoveDeadline {
        profile: ProfileId,
        deadline_ms: u64,
    },
    /// The lease is no longer the attempt's, or cannot be shown to be: stop the provider.
    SelfFence { token: FencingToken, why: String },
}

/// What follows from `answer` for the batch `tokens`: each renewed lease's deadline moves
/// to `renewed_deadline_ms` and each refused one self-fences; a refused batch self-fences
/// all; without an answer only the attempts whose deadline (`deadlines`) has passed at
/// `now_ms` self-fence, the others wait for the next tick.
pub(crate) fn decide(
    tokens: &[FencingToken],
    answer: RenewalAnswer,
    renewed_deadline_ms: u64,
    deadlines: &BTreeMap<ProfileId, u64>,
    now_ms: u64,
) -> Vec<RenewalAction> {
    match answer {
        RenewalAnswer::Renewed(results) => results
            .into_iter()
            .filter_map(|r| {
                let token = tokens.iter().find(|t| t.lease == r.lease)?;
                Some(match r.result {
                    Ok(_) => RenewalAction::MoveDeadline {
                        profile: token.profile,
                        deadline_ms: renewed_deadline_ms,
                    },
                    Err(rejection) => RenewalAction::SelfFence {
                        token: *token,
                        why: format!("renewal refused: {rejection}"),
                    },
                })
            })
            .collect(),
        RenewalAnswer::Refused(message) => tokens
            .iter()
            .map(|t| RenewalAction::SelfFence {
                token: *t,
                why: format!("renewal refused: {message}"),
            })
            .collect(),
        RenewalAnswer::Unexpected => Vec::new(),
        RenewalAnswer::Unanswered => tokens
            .iter()
            .filter(|t| deadlines.get(&t.profile).is_some_and(|d| *d <= now_ms))
            .map(|t| RenewalAction::SelfFence {
                token: *t,
                why: "the lease could not be renewed before its deadline".into(),
            })
            .collect(),
    }
}

/// What the leader's reply to a renewal batch says. Only the core's rejection of the batch
/// refuses it; any other failure (the listener's refusal, invalid input, no answer) leaves
/// the leases to their deadlines, and a reply that names no lease says nothing.
pub(crate) fn answer_of(reply: Result<pb::RenewLeasesReply, CallError>) -> RenewalAnswer {
    match reply {
        Ok(reply) => {
            let results: Option<Vec<LeaseRenewal>> = reply
                .results
                .into_iter()
                .map(|r| {
                    Some(LeaseRenewal {
                        lease: LeaseId::new(r.lease).ok()?,
                        result: if r.renewed {
                            Ok(r.expires_at_ms)
                        } else {
                            Err(r.message)
                        },
                    })
                })
                .collect();
            results.map_or_else(
                || {
                    tracing::warn!("renewal answer names no lease");
                    RenewalAnswer::Unexpected
                },
                RenewalAnswer::Renewed,
            )
        }
        Err(CallError::Refused(body)) if body.rejection.is_some() => {
            RenewalAnswer::Refused(body.message)
        }
        Err(e) => {
            tracing::warn!(error = ?e, "lease renewal failed");
            RenewalAnswer::Unanswered
        }
    }
}

impl AgentSupervisor {
    /// Renews every running attempt's lease in one command and does what follows.
    pub(super) async fn renew_all(&self) {
        let tokens = self.registry().running_tokens();
        if tokens.is_empty() {
            return;
        }
        let config = &self.inner.config;
        let sent_at = squadron_client::now_ms();
        let answer = answer_of(
            self.inner
                .control
                .renew_leases(&tokens, config.lease_ttl_ms)
                .await,
        );
        let deadline = sent_at + config.lease_ttl_ms - config.self_fence_margin_ms;
        let deadlines = self.registry().deadlines();
        let now = squadron_client::now_ms();
        for action in decide(&tokens, answer, deadline, &deadlines, now) {
            match action {
                RenewalAction::MoveDeadline {
                    profile,
                    deadline_ms,
                } => self.move_deadline(profile, deadline_ms),
                RenewalAction::SelfFence { token, why } => self.self_fence(token, &why).await,
            }
        }
    }

    /// A later deadline for a running attempt, written where its watchdog reads it.
    fn move_deadline(&self, id: ProfileId, deadline: u64) {
        let Some(file) = self.registry().move_deadline(id, deadline) else {
            return;
        };
        if let Err(e) = write_atomic(&file, deadline.to_string().as_bytes()) {
            tracing::warn!(profile = %id, error = %e, "cannot move the provider's deadline");
        }
    }

    /// The lease is no longer this attempt's (or cannot be shown to be): the provider is
    /// stopped and reaped at once, and the evidence recorded when the control plane takes it.
    pub(super) async fn self_fence(&self, token: FencingToken, why: &str) {
        let Some(attempt) = self.registry().self_fence(token) else {
            return;
        };
        tracing::warn!(profile = %token.profile, generation = %token.generation, why, "self-fencing: stopping the provider");
        self.inner.broker.unregister_profile(token.profile.get());
        match self
            .stop_attempt(&attempt, token.lease, std::time::Duration::ZERO)
            .await
        {
            Ok(proof) => self.registry().queue_evidence(token.profile, proof),
            Err(e) => {
                tracing::error!(profile = %token.profile, error = %e, "self-fenced provider not reaped")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use squadron_core::ids::Generation;
    use squadron_core::Rejection;

    use super::*;

    fn token(profile: u64, lease: u64) -> FencingToken {
        FencingToken {
            profile: ProfileId::new(profile).unwrap(),
            lease: LeaseId::new(lease).unwrap(),
            generation: Generation::new(1),
        }
    }

    fn renewed(lease: u64, result: Result<u64, Rejection>) -> LeaseRenewal {
        LeaseRenewal {
            lease: LeaseId::new(lease).unwrap(),
            result: result.map_err(|r| r.to_string()),
        }
    }

    fn fenced(actions: &[RenewalAction]) -> Vec<(u64, String)> {
        actions
            .iter()
            .filter_map(|a| match a {
                RenewalAction::SelfFence { token, why } => Some((token.profile.get(), why.clone())),
                RenewalAction::MoveDeadline { .. } => None,
            })
            .collect()
    }

    #[test]
    fn renewed_leases_move_their_deadline_and_refused_ones_self_fence() {
        let tokens = [token(1, 11), token(2, 12), token(3, 13)];
        let rejection = Rejection::StaleGeneration {
            expected: Generation::new(1),
            current: Generation::new(2),
        };
        let answer = RenewalAnswer::Renewed(vec![
            renewed(11, Ok(9_000)),
            renewed(12, Err(rejection.clone())),
            // A lease the batch did not hold is not acted on.
            renewed(99, Ok(9_000)),
        ]);
        let actions = decide(&tokens, answer, 7_000, &BTreeMap::new(), 0);
        assert_eq!(actions.len(), 2, "{actions:?}");
        assert_eq!(
            actions[0],
            RenewalAction::MoveDeadline {
                profile: ProfileId::new(1).unwrap(),
                deadline_ms: 7_000
            }
        );
        assert_eq!(
            fenced(&actions),
            [(2, format!("renewal refused: {rejection}"))]
        );
    }

    #[test]
    fn a_refused_batch_self_fences_every_lease_in_it() {
        let tokens = [token(1, 11), token(2, 12)];
        let actions = decide(
            &tokens,
            RenewalAnswer::Refused("worker w1 was declared lost".into()),
            7_000,
            &BTreeMap::new(),
            0,
        );
        assert_eq!(
            fenced(&actions),
            [
                (
                    1,
                    "renewal refused: worker w1 was declared lost".to_string()
                ),
                (
                    2,
                    "renewal refused: worker w1 was declared lost".to_string()
                ),
            ]
        );
    }

    #[test]
    fn without_an_answer_only_overdue_attempts_self_fence() {
        let tokens = [token(1, 11), token(2, 12), token(3, 13)];
        let deadlines = BTreeMap::from([
            (ProfileId::new(1).unwrap(), 5_000),
            (ProfileId::new(2).unwrap(), 5_001),
        ]);
        let actions = decide(&tokens, RenewalAnswer::Unanswered, 9_000, &deadlines, 5_000);
        assert_eq!(
            fenced(&actions),
            [(
                1,
                "the lease could not be renewed before its deadline".to_string()
            )]
        );
        assert_eq!(actions.len(), 1, "no deadline moves without an answer");
        assert!(decide(&tokens, RenewalAnswer::Unexpected, 9_000, &deadlines, 9_000).is_empty());
    }
}

#[cfg(test)]
mod answer_tests {
    use squadron_client::ErrorBody;
    use squadron_core::error_code::ErrorCode;
    use squadron_core::rejection::Entity;
    use squadron_core::Rejection;

    use super::*;

    fn refused(rejection: Option<Rejection>) -> CallError {
        CallError::Refused(ErrorBody {
            code: ErrorCode::NotFound,
            message: "worker w1 not found".into(),
            field: None,
            rejection,
        })
    }

    #[test]
    fn each_lease_s_answer_is_read_from_the_reply() {
        let reply = pb::RenewLeasesReply {
            results: vec![
                pb::RenewalResult {
                    lease: 11,
                    renewed: true,
                    expires_at_ms: 9_000,
                    ..Default::default()
                },
                pb::RenewalResult {
                    lease: 12,
                    renewed: false,
                    code: "failed_precondition".into(),
                    message: "lease 12 is fenced".into(),
                    ..Default::default()
                },
            ],
        };
        assert_eq!(
            answer_of(Ok(reply)),
            RenewalAnswer::Renewed(vec![
                LeaseRenewal {
                    lease: LeaseId::new(11).unwrap(),
                    result: Ok(9_000)
                },
                LeaseRenewal {
                    lease: LeaseId::new(12).unwrap(),
                    result: Err("lease 12 is fenced".into())
                },
            ])
        );
        let nameless = pb::RenewLeasesReply {
            results: vec![pb::RenewalResult::default()],
        };
        assert_eq!(answer_of(Ok(nameless)), RenewalAnswer::Unexpected);
    }

    #[test]
    fn only_a_rejection_refuses_the_batch() {
        let lost = Rejection::NotFound {
            entity: Entity::Worker,
            id: "w1".into(),
        };
        assert_eq!(
            answer_of(Err(refused(Some(lost)))),
            RenewalAnswer::Refused("worker w1 not found".into())
        );
        assert_eq!(answer_of(Err(refused(None))), RenewalAnswer::Unanswered);
        assert_eq!(
            answer_of(Err(CallError::Unanswered("connection refused".into()))),
            RenewalAnswer::Unanswered
        );
    }
}
