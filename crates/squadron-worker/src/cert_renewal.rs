//! Renewing the worker's certificate before it ends: an enrolled certificate lives a day, so
//! a third before its end the worker makes a fresh key pair, asks the leader (under the
//! certificate it still holds) to sign it, writes the files and swaps them in — new
//! connections present the new certificate, open ones keep theirs.

use std::time::Duration;

use squadron_client::RenewCertificate;
use squadron_core::ids::WorkerId;
use squadron_pki::{IssuedCert, KeyRequest, SpiffeId, TlsIdentity, WORKER_CERT_NAME};

use crate::control_link::ControlLink;
use crate::error::WorkerError;

/// How often the certificate's remaining life is looked at.
pub(crate) const CERT_CHECK_INTERVAL_MS: u64 = 10 * 60 * 1000;
/// How long after the control plane refused a renewal the worker asks again: a refusal does
/// not pass by itself (a certificate `squadron init` made offline is not renewed online), so
/// asking every ten minutes would only repeat the warning.
pub(crate) const RENEWAL_REFUSED_RECHECK_MS: u64 = 6 * 3600 * 1000;

/// Why a renewal did not happen.
#[derive(Debug)]
enum RenewalFailure {
    /// The control plane answered no.
    Refused(String),
    /// Anything else: no answer, or the files could not be read or written.
    Failed(WorkerError),
}

impl From<WorkerError> for RenewalFailure {
    fn from(e: WorkerError) -> Self {
        RenewalFailure::Failed(e)
    }
}

/// The pause before the next check after `outcome`.
fn pause_after(outcome: &Result<(), RenewalFailure>) -> u64 {
    match outcome {
        Err(RenewalFailure::Refused(_)) => RENEWAL_REFUSED_RECHECK_MS,
        _ => CERT_CHECK_INTERVAL_MS,
    }
}

/// Checks every [`CERT_CHECK_INTERVAL_MS`] and renews when due; a failure is logged and
/// retried at the next check (the old certificate still works until it ends), a refusal after
/// [`RENEWAL_REFUSED_RECHECK_MS`] with what to do about it.
pub(crate) async fn renewal_loop(
    worker: WorkerId,
    tls: TlsIdentity,
    control: ControlLink,
    hosts: Vec<String>,
) {
    loop {
        let outcome = renew_if_due(&worker, &tls, &control, &hosts).await;
        match &outcome {
            Ok(()) => {}
            Err(RenewalFailure::Refused(why)) => tracing::warn!(
                refusal = %why,
                recheck_in_ms = RENEWAL_REFUSED_RECHECK_MS,
                "the control plane refused to renew this worker's certificate; a certificate \
                 made offline (squadron init --worker-cert) is replaced the same way before it \
                 ends, or the worker enrolls with a bootstrap token (--bootstrap-token-file)"
            ),
            Err(RenewalFailure::Failed(e)) => {
                tracing::warn!(error = %e, "certificate renewal failed; retrying at the next check")
            }
        }
        tokio::time::sleep(Duration::from_millis(pause_after(&outcome))).await;
    }
}

async fn renew_if_due(
    worker: &WorkerId,
    tls: &TlsIdentity,
    control: &ControlLink,
    hosts: &[String],
) -> Result<(), RenewalFailure> {
    let dir = tls.dir();
    let facts = dir
        .read_identity(WORKER_CERT_NAME)
        .and_then(|c| c.facts())
        .map_err(pki_error)?;
    if !facts.renewal_due(squadron_client::now_ms()) {
        return Ok(());
    }
    let request = KeyRequest::new(&SpiffeId::Worker(worker.clone())).map_err(pki_error)?;
    let renewed = control
        .renew_certificate(&RenewCertificate {
            csr_pem: request.csr_pem.clone(),
            hosts: hosts.to_vec(),
        })
        .await
        .map_err(|e| match e {
            crate::control_link::CallError::Refused(body) => {
                RenewalFailure::Refused(format!("{:?}: {}", body.code, body.message))
            }
            unanswered => RenewalFailure::Failed(WorkerError::Invalid {
                field: "certificate".into(),
                message: format!("renewal not answered: {unanswered}"),
            }),
        })?;
    let cert = IssuedCert::new(
        renewed.cert_pem,
        request.key_pem().to_string(),
        &renewed.ca_pem,
    );
    dir.write_identity(WORKER_CERT_NAME, &cert)
        .map_err(pki_error)?;
    tls.reload().map_err(pki_error)?;
    tracing::info!(serial = %renewed.serial, not_after_ms = renewed.not_after_ms, "certificate renewed");
    Ok(())
}

fn pki_error(e: squadron_pki::PkiError) -> WorkerError {
    WorkerError::Invalid {
        field: "certificate".into(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_asked_again_hours_later_anything_else_at_the_next_check() {
        let refused = Err(RenewalFailure::Refused("unauthenticated".into()));
        assert_eq!(pause_after(&refused), RENEWAL_REFUSED_RECHECK_MS);
        let failed = Err(RenewalFailure::Failed(WorkerError::Invalid {
            field: "certificate".into(),
            message: "no answer".into(),
        }));
        assert_eq!(pause_after(&failed), CERT_CHECK_INTERVAL_MS);
        assert_eq!(pause_after(&Ok(())), CERT_CHECK_INTERVAL_MS);
    }
}
