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

/// Renewal is due once less than a third of the certificate's life remains.
pub(crate) fn renewal_due(now_ms: u64, not_before_ms: u64, not_after_ms: u64) -> bool {
    let life = not_after_ms.saturating_sub(not_before_ms);
    not_after_ms.saturating_sub(now_ms) < life / 3
}

/// Checks every [`CERT_CHECK_INTERVAL_MS`] and renews when due; a failure is logged and
/// retried at the next check (the old certificate still works until it ends).
pub(crate) async fn renewal_loop(
    worker: WorkerId,
    tls: TlsIdentity,
    control: ControlLink,
    hosts: Vec<String>,
) {
    loop {
        if let Err(e) = renew_if_due(&worker, &tls, &control, &hosts).await {
            tracing::warn!(error = %e, "certificate renewal failed; retrying at the next check");
        }
        tokio::time::sleep(Duration::from_millis(CERT_CHECK_INTERVAL_MS)).await;
    }
}

async fn renew_if_due(
    worker: &WorkerId,
    tls: &TlsIdentity,
    control: &ControlLink,
    hosts: &[String],
) -> Result<(), WorkerError> {
    let dir = tls.dir();
    let facts = dir
        .read_identity(WORKER_CERT_NAME)
        .and_then(|c| c.facts())
        .map_err(pki_error)?;
    if !renewal_due(
        squadron_client::now_ms(),
        facts.not_before_ms,
        facts.not_after_ms,
    ) {
        return Ok(());
    }
    let request = KeyRequest::new(&SpiffeId::Worker(worker.clone())).map_err(pki_error)?;
    let renewed = control
        .renew_certificate(&RenewCertificate {
            csr_pem: request.csr_pem.clone(),
            hosts: hosts.to_vec(),
        })
        .await
        .map_err(|e| WorkerError::Invalid {
            field: "certificate".into(),
            message: format!("renewal refused: {e}"),
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
    use super::renewal_due;

    #[test]
    fn renewal_is_due_in_the_last_third_of_life() {
        let (start, end) = (1_000, 1_000 + 90_000);
        assert!(!renewal_due(start, start, end));
        assert!(!renewal_due(start + 59_999, start, end));
        assert!(renewal_due(start + 60_001, start, end));
        assert!(
            renewal_due(end + 5, start, end),
            "an ended certificate is due"
        );
    }
}
