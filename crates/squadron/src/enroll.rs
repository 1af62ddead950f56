//! A new worker's enrollment: the one-time bootstrap token from a file and a fresh key pair's
//! CSR, exchanged at a control node for the worker's certificate. The private key never
//! leaves this host; the token file is scrubbed once the certificate is written (or the
//! control plane refused it), so the secret is not left lying where it was delivered.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use squadron_client::{Credentials, EnrollWorker, SquadronClient};
use squadron_core::ids::WorkerId;
use squadron_pki::{IssuedCert, KeyRequest, PkiDir, SpiffeId, WORKER_CERT_NAME};

/// Enrolls `worker` unless `cert_dir` already holds its certificate.
pub async fn enroll_worker(
    worker: &WorkerId,
    control: &[String],
    ca_pem: &str,
    token_file: &Path,
    cert_dir: &Path,
    hosts: Vec<String>,
) -> anyhow::Result<()> {
    let pki = PkiDir::new(cert_dir);
    if pki.cert(WORKER_CERT_NAME).exists() {
        tracing::info!(dir = %cert_dir.display(), "certificate present; the bootstrap token is not used");
        return Ok(());
    }
    let token = squadron_pki::pki_dir::read_secret_file(token_file)
        .with_context(|| format!("--bootstrap-token-file {}", token_file.display()))?;
    let request = KeyRequest::new(&SpiffeId::Worker(worker.clone()))?;
    let client = SquadronClient::secured(control.to_vec(), &Credentials::operator(ca_pem, None)?)?;
    let answer = client
        .enroll_worker(&EnrollWorker {
            token: token.trim().to_string(),
            worker: worker.clone(),
            csr_pem: request.csr_pem.clone(),
            hosts,
        })
        .await;
    // Used or refused, the token is spent: a refusal means it was wrong, expired or taken.
    scrub(token_file)?;
    let enrolled = answer.context("enrollment refused")?;
    let cert = IssuedCert::new(
        enrolled.cert_pem,
        request.key_pem().to_string(),
        &enrolled.ca_pem,
    );
    pki.write_identity(WORKER_CERT_NAME, &cert)?;
    tracing::info!(serial = %enrolled.serial, dir = %cert_dir.display(), "enrolled");
    Ok(())
}

/// Overwrites the file with zeros, syncs, and removes it.
fn scrub(path: &Path) -> anyhow::Result<()> {
    let len = std::fs::metadata(path)
        .with_context(|| path.display().to_string())?
        .len();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("scrubbing {}", path.display()))?;
    let zeros = vec![0u8; usize::try_from(len).unwrap_or(0).min(1 << 16)];
    f.write_all(&zeros)?;
    f.sync_all()?;
    std::fs::remove_file(path).with_context(|| format!("removing {}", path.display()))
}
