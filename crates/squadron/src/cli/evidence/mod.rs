//! `squadron evidence`: the ADR's release-gate evidence of one project, a verdict per claim
//! with the figure that decides it (`verdicts`), and, with `--sign`, an Ed25519-signed bundle
//! that `squadron evidence verify` checks (`bundle`).

pub mod bundle;
pub mod verdicts;

use crate::progress::Progress;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use squadron_api::agents::BuildDigest;
use squadron_client::Consistency;
use squadron_core::ids::{ProjectId, TenantId};
use squadron_pki::SigningKey;

use super::Ctx;
use super::OutputFormat;
use crate::cli::soak::report::{SoakReport, REPORT_FORMAT};
use crate::output::emit_generic;
use bundle::{Bundle, Report};

#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct EvidenceArgs {
    #[command(subcommand)]
    pub action: Option<EvidenceAction>,
    #[arg(long, default_value = "default")]
    pub tenant: TenantId,
    #[arg(long)]
    pub project: Option<ProjectId>,
    /// Sign the report with this Ed25519 key (PKCS#8 PEM, from `squadron evidence keygen`)
    /// and write the bundle to `--bundle`.
    #[arg(long, value_name = "KEY", requires = "bundle")]
    pub sign: Option<PathBuf>,
    /// Where the signed bundle goes.
    #[arg(long, value_name = "FILE", requires = "sign")]
    pub bundle: Option<PathBuf>,
    /// A `squadron soak --report` file to embed: the claim "leak-free 24-hour soak" is
    /// decided from its samples.
    #[arg(long, value_name = "FILE")]
    pub soak_report: Option<PathBuf>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum EvidenceAction {
    /// Make an Ed25519 signing key: FILE (0600) and FILE.pub (the public key, one line).
    Keygen {
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Check a bundle: the signature against the public key, and every verdict decided again
    /// from its figures. Exits non-zero on any failure, a failed claim included.
    Verify {
        bundle: PathBuf,
        /// The signer's public key file (`FILE.pub` of `keygen`).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
    },
}

/// One node's evidence, with the MCP denials of every member added up (each node counts the
/// checks it answered), and the verdicts.
pub async fn run(ctx: &Ctx, args: EvidenceArgs) -> anyhow::Result<()> {
    let Some(project) = &args.project else {
        bail!("--project is required (or one of: keygen, verify)");
    };
    let c = &ctx.client;
    let progress = Progress::start(ctx.out, format!("evidence of {}/{project}", args.tenant));
    let mut ev = c.project_evidence(&args.tenant, project).await?;
    let status = c.cluster_status_without_digest(Consistency::Stale).await?;
    let mut denied = 0;
    let mut asked = 0;
    // Each node reports its own digest and every live worker's: the workers' are taken from
    // the first answer only.
    let mut digests: Vec<BuildDigest> = ev
        .build_digests
        .iter()
        .filter(|b| b.member.starts_with("worker "))
        .cloned()
        .collect();
    for m in &status.members {
        progress.say(format!("evidence: asking node {} ({})", m.id, m.rest));
        let node = c.with_endpoints(vec![format!("https://{}", m.rest)]);
        match node.project_evidence(&args.tenant, project).await {
            Ok(e) => {
                denied += e.unauthorized_mcp_denied;
                asked += 1;
                let own = format!("node {}", m.id);
                digests.extend(e.build_digests.into_iter().filter(|b| b.member == own));
            }
            Err(e) => {
                eprintln!("member {} ({}) not counted: {e}", m.id, m.rest);
                digests.push(BuildDigest {
                    member: format!("node {}", m.id),
                    sha256: String::new(),
                });
            }
        }
    }
    if asked > 0 {
        ev.unauthorized_mcp_denied = denied;
    }
    // Every member's running binary, every live worker's (the sandbox's one at least, from an
    // older node that asks no other), and this one that gathers the evidence: one build is a
    // claim. A binary that cannot hash itself reports none, and so fails the claim.
    if let Some(w) = &ev.worker {
        let member = format!("worker {}", w.worker);
        match digests.iter_mut().find(|b| b.member == member) {
            // Its evidence answered with a digest where its build route did not.
            Some(b) if b.sha256.is_empty() => b.sha256.clone_from(&w.binary_sha256),
            Some(_) => {}
            None => digests.push(BuildDigest {
                member,
                sha256: w.binary_sha256.clone(),
            }),
        }
    }
    digests.push(BuildDigest {
        member: verdicts::GATHERER.into(),
        sha256: squadron_pki::own_binary_sha256().unwrap_or_default(),
    });
    ev.build_digests = digests;
    let soak = args
        .soak_report
        .as_deref()
        .map(read_soak_report)
        .transpose()?;
    let report = Report::new(ev, soak)?;
    progress.finish(format!("evidence of {}/{project}", args.tenant));
    if let (Some(key), Some(out)) = (&args.sign, &args.bundle) {
        // A key others can read is refused, as every key and token file is.
        let pem = zeroize::Zeroizing::new(squadron_pki::pki_dir::read_secret_file(key)?);
        let key =
            SigningKey::from_pem(&pem).with_context(|| format!("--sign {}", key.display()))?;
        let signed = bundle::sign(&report, &key)?;
        squadron_pki::pki_dir::write_file(
            out,
            serde_json::to_string_pretty(&signed)?.as_bytes(),
            0o644,
        )?;
        eprintln!(
            "signed bundle written to {} ({})",
            out.display(),
            key.public_key_text()
        );
    }
    emit_generic(ctx.out, &report)
}

/// A soak report whose stated verdict follows from its figures.
fn read_soak_report(path: &std::path::Path) -> anyhow::Result<SoakReport> {
    let text = bundle::read_bounded(path)?;
    let report: SoakReport = serde_json::from_str(&text)
        .with_context(|| format!("--soak-report {} is not a soak report", path.display()))?;
    if report.format != REPORT_FORMAT {
        bail!(
            "--soak-report {}: format {:?}, expected {REPORT_FORMAT}",
            path.display(),
            report.format
        );
    }
    if report.decided() != report.verdict {
        bail!(
            "--soak-report {}: its verdict does not follow from its samples",
            path.display()
        );
    }
    Ok(report)
}

/// `keygen` and `verify`.
pub fn run_offline(out: OutputFormat, action: EvidenceAction) -> anyhow::Result<()> {
    match action {
        EvidenceAction::Keygen { out: path } => {
            let (pem, key) = SigningKey::generate()?;
            squadron_pki::pki_dir::write_file(&path, pem.as_bytes(), 0o600)?;
            let public = path.with_extension("pub");
            squadron_pki::pki_dir::write_file(
                &public,
                format!("{}\n", key.public_key_text()).as_bytes(),
                0o644,
            )?;
            eprintln!(
                "key written to {} (0600), public key to {}",
                path.display(),
                public.display()
            );
            Ok(())
        }
        EvidenceAction::Verify { bundle: path, key } => {
            let text = bundle::read_bounded(&path)?;
            let signed: Bundle = serde_json::from_str(&text)
                .with_context(|| format!("{} is not an evidence bundle", path.display()))?;
            let public = squadron_pki::pki_dir::read_file(&key)?;
            let report =
                bundle::verify(&signed, &public).with_context(|| format!("{}", path.display()))?;
            emit_generic(out, &report.verdicts)?;
            let failed: Vec<&str> = report
                .verdicts
                .iter()
                .filter(|v| !v.pass)
                .map(|v| v.claim.as_str())
                .collect();
            if !failed.is_empty() {
                bail!(
                    "the signature holds, but claims failed: {}",
                    failed.join(", ")
                );
            }
            eprintln!(
                "{}: signature and all {} verdicts hold (binary {})",
                path.display(),
                report.verdicts.len(),
                report.binary_sha256
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use squadron_api::agents::ProjectEvidence;

    use super::bundle::sign;
    use super::verdicts::all_verdicts;
    use super::*;

    /// `evidence verify` of a bundle in `dir`, signed by a fresh key, whose report has
    /// `evidence`'s figures and the verdicts they decide.
    fn verify_signed(dir: &Path, evidence: ProjectEvidence) -> anyhow::Result<()> {
        let (_, key) = SigningKey::generate()?;
        let report = Report {
            verdicts: all_verdicts(&evidence, None),
            evidence,
            soak: None,
            binary_sha256: "cd".repeat(32),
            created_at_ms: 1,
        };
        let bundle = dir.join("bundle.json");
        let public = dir.join("key.pub");
        std::fs::write(&bundle, serde_json::to_string(&sign(&report, &key)?)?)?;
        std::fs::write(&public, format!("{}\n", key.public_key_text()))?;
        run_offline(
            OutputFormat::Json,
            EvidenceAction::Verify {
                bundle,
                key: public,
            },
        )
    }

    /// A bundle whose signature holds but whose claims fail makes `verify` fail, naming them;
    /// the same bundle with passing figures verifies.
    #[test]
    fn verify_fails_on_a_failed_claim_under_a_good_signature() {
        let dir = tempfile::tempdir().unwrap();
        let passing = verdicts::tests::passing();
        verify_signed(dir.path(), passing.clone()).expect("all claims hold");
        let mut no_crash_takeover = passing;
        no_crash_takeover.takeovers_crash = 0;
        let e = verify_signed(dir.path(), no_crash_takeover).unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.contains("the signature holds, but claims failed") && text.contains("takeover"),
            "{text}"
        );
    }
}
