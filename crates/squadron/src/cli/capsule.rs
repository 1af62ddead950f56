//! `squadron capsule`: continuity capsules, and the capsule draft flags a graceful takeover
//! shares.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use squadron_client::CommitCapsule;
use squadron_core::capsule::{CapsuleDraft, CapsulePayload, ContinuityCapsule};
use squadron_core::ids::{Digest, Generation, LeaseId, ProfileId};

use super::{read_input, Ctx};
use crate::output::{emit, short, Table};

/// A capsule draft: from `--capsule-file` (JSON of a `CapsuleDraft`) or from flags.
#[derive(Debug, Clone, Args)]
pub struct CapsuleArgs {
    /// A JSON file holding the whole draft (`sequence`, `previous`, `schema_version`,
    /// `payload`, `expected_digest`); `-` reads standard input.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["sequence", "previous", "task_state"])]
    pub capsule_file: Option<PathBuf>,
    /// The chain position this capsule takes (1 for the first).
    #[arg(long)]
    pub sequence: Option<u64>,
    /// The digest of the current chain head.
    #[arg(long)]
    pub previous: Option<Digest>,
    #[arg(long, default_value_t = squadron_core::limits::CAPSULE_SCHEMA_VERSION_CURRENT)]
    pub schema_version: u32,
    #[arg(long, default_value = "")]
    pub task_state: String,
    /// Repeat for several decisions.
    #[arg(long = "decision")]
    pub decisions: Vec<String>,
    /// Repeat for several items.
    #[arg(long = "pending-work")]
    pub pending_work: Vec<String>,
    #[arg(long, default_value = "")]
    pub repository_revision: String,
    #[arg(long, default_value_t = 0)]
    pub mailbox_cursor: u64,
    #[arg(long, default_value = "")]
    pub context_ref: String,
    /// Refuse the commit unless the computed digest equals this.
    #[arg(long)]
    pub expected_digest: Option<Digest>,
}

// Parsed once per run; the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum CapsuleCmd {
    /// Commit a continuity capsule under the profile's current lease.
    Commit {
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        lease: LeaseId,
        #[arg(long)]
        generation: Generation,
        #[command(flatten)]
        capsule: CapsuleArgs,
    },
    /// The profile's recent capsules, oldest first.
    List {
        #[arg(long)]
        profile: ProfileId,
    },
}

pub async fn run(ctx: &Ctx, cmd: CapsuleCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        CapsuleCmd::Commit {
            profile,
            lease,
            generation,
            capsule,
        } => {
            let req = CommitCapsule {
                lease,
                generation,
                capsule: capsule_draft(capsule)?,
            };
            ctx.outcome(&c.commit_capsule(profile, &req, ctx.key()).await?)
        }
        CapsuleCmd::List { profile } => {
            let list = c.list_capsules(profile, ctx.consistency).await?;
            emit(ctx.out, &list, |list| capsules_table(list))
        }
    }
}

/// The draft the flags (or `--capsule-file`) describe.
pub fn capsule_draft(a: CapsuleArgs) -> anyhow::Result<CapsuleDraft> {
    if let Some(path) = &a.capsule_file {
        let text = read_input(path)?;
        return serde_json::from_str(&text)
            .with_context(|| format!("{} is not a capsule draft", path.display()));
    }
    let sequence = a
        .sequence
        .context("--sequence is required (or give --capsule-file)")?;
    Ok(CapsuleDraft {
        sequence,
        previous: a.previous,
        schema_version: a.schema_version,
        payload: CapsulePayload {
            task_state: a.task_state,
            decisions: a.decisions,
            pending_work: a.pending_work,
            repository_revision: a.repository_revision,
            mailbox_cursor: a.mailbox_cursor,
            context_ref: a.context_ref,
        },
        expected_digest: a.expected_digest,
    })
}

fn capsules_table(list: &[ContinuityCapsule]) -> String {
    let mut t = Table::new(&[
        "sequence",
        "generation",
        "lease",
        "digest",
        "previous",
        "committed_at_ms",
    ]);
    for k in list {
        t.row(vec![
            k.sequence.to_string(),
            k.generation.to_string(),
            k.lease.to_string(),
            short(&k.digest.to_hex()),
            k.previous
                .map(|d| short(&d.to_hex()))
                .unwrap_or_else(|| "-".into()),
            k.committed_at_ms.to_string(),
        ]);
    }
    t.render()
}
