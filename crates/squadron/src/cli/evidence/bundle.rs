//! A signed evidence bundle: the report (evidence, verdicts, the binary's SHA-256) as the exact
//! JSON bytes that were signed, the Ed25519 signature over them and the signer's public key.
//! `verify` checks the signature against a key the verifier holds, then decides every claim
//! again from the signed figures.

use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use squadron_api::agents::ProjectEvidence;
use squadron_pki::SigningKey;

use super::verdicts::{all_verdicts, Verdict};
use crate::cli::soak::report::SoakReport;

/// What a bundle says it is.
pub const BUNDLE_FORMAT: &str = "squadron-evidence/1";
/// Largest bundle read (keys are read as the PKI's files are, `pki_dir::read_file`).
pub const BUNDLE_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// What `squadron evidence` reports and a bundle signs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    #[serde(flatten)]
    pub evidence: ProjectEvidence,
    pub verdicts: Vec<Verdict>,
    /// The soak report given with `--soak-report`, whole: its claim is decided from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak: Option<SoakReport>,
    /// SHA-256 of the `squadron` binary that gathered the evidence.
    pub binary_sha256: String,
    pub created_at_ms: u64,
}

impl Report {
    pub fn new(evidence: ProjectEvidence, soak: Option<SoakReport>) -> anyhow::Result<Report> {
        Ok(Report {
            verdicts: all_verdicts(&evidence, soak.as_ref()),
            evidence,
            soak,
            binary_sha256: own_binary_sha256()?,
            created_at_ms: squadron_client::now_ms(),
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bundle {
    pub format: String,
    /// The report's JSON, exactly the bytes the signature covers.
    pub report: String,
    pub signature: Signature,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    pub algorithm: String,
    pub public_key: String,
    pub value: String,
}

pub fn sign(report: &Report, key: &SigningKey) -> anyhow::Result<Bundle> {
    let text = serde_json::to_string(report)?;
    Ok(Bundle {
        format: BUNDLE_FORMAT.into(),
        signature: Signature {
            algorithm: "ed25519".into(),
            public_key: key.public_key_text(),
            value: key.sign_hex(text.as_bytes()),
        },
        report: text,
    })
}

/// The report of a bundle signed by `public_key`, its verdicts decided again from its figures.
/// A bundle whose verdicts disagree with its figures was not made by `squadron evidence`.
pub fn verify(bundle: &Bundle, public_key: &str) -> anyhow::Result<Report> {
    if bundle.format != BUNDLE_FORMAT {
        bail!("format: expected {BUNDLE_FORMAT}, got {:?}", bundle.format);
    }
    if bundle.signature.algorithm != "ed25519" {
        bail!(
            "signature.algorithm: expected ed25519, got {:?}",
            bundle.signature.algorithm
        );
    }
    if bundle.signature.public_key.trim() != public_key.trim() {
        bail!(
            "signature.public_key: signed by {}, not by the key given ({})",
            bundle.signature.public_key,
            public_key.trim()
        );
    }
    squadron_pki::verify_signature(
        public_key,
        bundle.report.as_bytes(),
        &bundle.signature.value,
    )
    .context("signature.value")?;
    let report: Report = serde_json::from_str(&bundle.report).context("report")?;
    if all_verdicts(&report.evidence, report.soak.as_ref()) != report.verdicts {
        bail!("verdicts: they do not follow from the report's figures");
    }
    Ok(report)
}

/// A file of at most [`BUNDLE_BYTES_MAX`], as text.
pub fn read_bounded(path: &Path) -> anyhow::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    let mut text = String::new();
    file.take(BUNDLE_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("{}", path.display()))?;
    if text.len() as u64 > BUNDLE_BYTES_MAX {
        bail!("{}: larger than {BUNDLE_BYTES_MAX} bytes", path.display());
    }
    Ok(text)
}

fn own_binary_sha256() -> anyhow::Result<String> {
    squadron_pki::own_binary_sha256().map_err(|e| anyhow::anyhow!("the running binary: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let evidence = super::super::verdicts::tests::passing();
        Report {
            verdicts: all_verdicts(&evidence, None),
            evidence,
            soak: None,
            binary_sha256: "ab".repeat(32),
            created_at_ms: 1,
        }
    }

    #[test]
    fn a_signed_bundle_verifies_and_any_change_is_caught() {
        let (_, key) = SigningKey::generate().unwrap();
        let bundle = sign(&report(), &key).unwrap();
        let text = serde_json::to_string(&bundle).unwrap();
        let back: Bundle = serde_json::from_str(&text).unwrap();
        assert_eq!(verify(&back, &key.public_key_text()).unwrap(), report());
        // A figure edited after signing.
        let mut edited = bundle.clone();
        edited.report = edited.report.replace("\"profiles\":8", "\"profiles\":9");
        let e = verify(&edited, &key.public_key_text()).unwrap_err();
        assert!(format!("{e:#}").contains("signature"), "{e:#}");
        // Another key.
        let (_, other) = SigningKey::generate().unwrap();
        let e = verify(&bundle, &other.public_key_text()).unwrap_err();
        assert!(format!("{e:#}").contains("not by the key given"), "{e:#}");
        // Re-signed with verdicts that do not follow from the figures.
        let mut lying = report();
        lying.evidence.takeovers_crash = 0;
        let forged = sign(&lying, &key).unwrap();
        let e = verify(&forged, &key.public_key_text()).unwrap_err();
        assert!(format!("{e:#}").contains("verdicts"), "{e:#}");
    }

    #[test]
    fn the_report_keeps_the_evidence_fields_at_its_top_level() {
        let value = serde_json::to_value(report()).unwrap();
        assert_eq!(value["profiles"], 8);
        assert_eq!(value["verdicts"][0]["claim"], "eight profiles");
        assert_eq!(value["binary_sha256"].as_str().unwrap().len(), 64);
    }
}
