//! Renewing the agent's certificate while its task runs: a third before the certificate ends,
//! the agent makes a fresh key pair (in its own memory, like the first), asks the leader to
//! sign it under the certificate it still holds, and dials again with the new one. The node
//! refuses once the task has ended, and the loop stops there.

use std::time::Duration;

use squadron_pki::{IssuedCert, KeyRequest, SpiffeId};

use crate::control_session::ControlSession;
use crate::error::AgentError;

/// The shortest and longest pause before a failed renewal is asked again; in between, a
/// twentieth of the certificate's life, so a short-lived certificate gets several tries
/// within its last third.
pub const RENEWAL_RETRY_MS_MIN: u64 = 1_000;
pub const RENEWAL_RETRY_MS_MAX: u64 = 60_000;

/// Renews `cert` for `identity` before each certificate ends, for as long as the node agrees.
pub async fn renewal_loop(session: ControlSession, identity: SpiffeId, mut cert: IssuedCert) {
    loop {
        let facts = match cert.facts() {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "the agent's certificate does not parse; not renewed");
                return;
            }
        };
        // Never sooner than the shortest retry pause: a certificate that is due as soon as
        // it is issued must not turn this into a busy loop.
        let wait_ms = facts
            .renew_at_ms()
            .saturating_sub(now_ms())
            .max(RENEWAL_RETRY_MS_MIN);
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        match renew(&session, &identity).await {
            Ok(renewed) => cert = renewed,
            Err(AgentError::Refused { status, .. }) => {
                tracing::warn!(code = ?status.code(), message = status.message(),
                    "the control plane refused to renew the agent's certificate; it is not asked again");
                return;
            }
            Err(e) => {
                let pause = retry_pause_ms(facts.life_ms());
                tracing::warn!(error = %e, retry_in_ms = pause, "certificate renewal failed");
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }
    }
}

/// One renewal: a new key, its certificate, and the session switched to it.
async fn renew(session: &ControlSession, identity: &SpiffeId) -> Result<IssuedCert, AgentError> {
    let key = KeyRequest::new(identity)?;
    let answer = session.renew_certificate(&key.csr_pem).await?;
    let cert = IssuedCert::new(answer.cert_pem, key.key_pem().to_string(), &answer.ca_pem);
    session.use_certificate(&cert)?;
    tracing::info!(serial = %answer.serial, not_after_ms = answer.not_after_ms, "certificate renewed");
    Ok(cert)
}

fn retry_pause_ms(life_ms: u64) -> u64 {
    (life_ms / 20).clamp(RENEWAL_RETRY_MS_MIN, RENEWAL_RETRY_MS_MAX)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_renewal_is_asked_again_within_the_last_third() {
        assert_eq!(retry_pause_ms(30_000), 1_500);
        assert_eq!(retry_pause_ms(5_000), RENEWAL_RETRY_MS_MIN);
        assert_eq!(retry_pause_ms(24 * 3_600_000), RENEWAL_RETRY_MS_MAX);
        // Several tries fit in the last third of any life the node may give.
        for life in [30_000, 3_600_000, 24 * 3_600_000] {
            assert!(retry_pause_ms(life) * 5 <= life / 3, "{life}");
        }
    }
}
