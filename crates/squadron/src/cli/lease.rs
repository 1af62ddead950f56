//! `squadron lease`: runtime leases (compare-and-swap on the profile's generation) and the
//! two takeovers.

use clap::{Args, Subcommand};
use squadron_client::{
    AcquireLease, CrashTakeover, FenceLease, GracefulTakeover, LeaseFence, RecordEvidence,
    RenewLease, TakeoverEvidence,
};
use squadron_core::command::NextHolder;
use squadron_core::ids::{Generation, LeaseId, ProfileId, WorkerId};
use squadron_core::lease::{FenceReason, LeaseHolder, RuntimeLease};
use squadron_core::provider::Provider;

use super::capsule::{capsule_draft, CapsuleArgs};
use super::{parse_serde, Ctx, ProjectRef};
use crate::output::{emit, emit_generic, Table};

/// The holder of a lease to be granted: `--provider --worker --process [--cgroup] --ttl-ms`.
#[derive(Debug, Clone, Args)]
pub struct HolderArgs {
    #[arg(long, default_value = "codex")]
    pub provider: Provider,
    /// The worker that launches the provider (the project sandbox's worker).
    #[arg(long)]
    pub worker: WorkerId,
    /// A descriptor of the process, for operators.
    #[arg(long, default_value = "squadron-cli")]
    pub process: String,
    /// The generation-owned cgroup leaf, if any.
    #[arg(long)]
    pub cgroup: Option<String>,
    #[arg(long, default_value_t = 30_000)]
    pub ttl_ms: u64,
}

// Parsed once per run; the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum LeaseCmd {
    /// Acquire a lease: compare-and-swap on the profile's generation.
    Acquire {
        #[arg(long)]
        profile: ProfileId,
        /// The profile generation the caller last saw.
        #[arg(long)]
        expected_generation: Generation,
        #[command(flatten)]
        holder: HolderArgs,
    },
    /// Renew (heartbeat) a lease.
    Renew {
        id: LeaseId,
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        generation: Generation,
        #[arg(long, default_value_t = 30_000)]
        ttl_ms: u64,
    },
    /// Release a lease; frees its slot.
    Release {
        id: LeaseId,
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        generation: Generation,
    },
    /// Fence a lease; it keeps its slot until reaped.
    Fence {
        id: LeaseId,
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        generation: Generation,
        #[arg(long, default_value = "operator", value_parser = parse_serde::<FenceReason>)]
        reason: FenceReason,
    },
    /// Record reap evidence (cgroup populated 0) for the lease's generation.
    Evidence {
        id: LeaseId,
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        generation: Generation,
        #[arg(long)]
        cgroup: String,
        /// Whether the cgroup still had processes (evidence must say false).
        #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
        populated: bool,
        /// When the worker observed it (default: now).
        #[arg(long)]
        observed_at_ms: Option<u64>,
    },
    /// Show a lease.
    Get { id: LeaseId },
    /// List a project's leases.
    List {
        #[command(flatten)]
        at: ProjectRef,
    },
    /// Graceful takeover: commit a capsule, fence the lease, grant the next holder.
    TakeoverGraceful {
        #[arg(long)]
        profile: ProfileId,
        /// The lease being taken over.
        #[arg(long)]
        lease: LeaseId,
        #[arg(long)]
        generation: Generation,
        #[command(flatten)]
        capsule: CapsuleArgs,
        #[command(flatten)]
        next: HolderArgs,
        /// Reap evidence for the old process: its emptied cgroup.
        #[arg(long, value_name = "CGROUP")]
        old_evidence_cgroup: Option<String>,
    },
    /// Crash takeover: after expiry, with reap evidence for the dead generation.
    TakeoverCrash {
        #[arg(long)]
        profile: ProfileId,
        #[arg(long)]
        lease: LeaseId,
        #[arg(long)]
        generation: Generation,
        #[command(flatten)]
        next: HolderArgs,
        /// Reap evidence: the dead generation's emptied cgroup (unless recorded before).
        #[arg(long, value_name = "CGROUP")]
        evidence_cgroup: Option<String>,
    },
}

pub async fn run(ctx: &Ctx, cmd: LeaseCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        LeaseCmd::Evidence {
            id,
            profile,
            generation,
            cgroup,
            populated,
            observed_at_ms,
        } => {
            let req = RecordEvidence {
                profile,
                generation,
                cgroup,
                populated,
                observed_at_ms: observed_at_ms.unwrap_or_else(squadron_client::now_ms),
            };
            ctx.outcome(&c.record_evidence(id, &req, ctx.key()).await?)
        }
        LeaseCmd::Get { id } => emit_generic(ctx.out, &c.get_lease(id, ctx.consistency).await?),
        LeaseCmd::List { at } => {
            let list = c
                .list_leases(&at.tenant, &at.project, ctx.consistency)
                .await?;
            emit(ctx.out, &list, |l| leases_table(l))
        }
        takeover @ (LeaseCmd::TakeoverGraceful { .. } | LeaseCmd::TakeoverCrash { .. }) => {
            run_takeover(ctx, takeover).await
        }
        write => run_write(ctx, write).await,
    }
}

/// Acquire, renew, release and fence: one write each.
async fn run_write(ctx: &Ctx, cmd: LeaseCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    let key = ctx.key();
    let out = match cmd {
        LeaseCmd::Acquire {
            profile,
            expected_generation,
            holder: h,
        } => {
            let req = AcquireLease {
                expected_generation,
                provider: h.provider,
                holder: holder(&h),
                ttl_ms: h.ttl_ms,
            };
            c.acquire_lease(profile, &req, key).await?
        }
        LeaseCmd::Renew {
            id,
            profile,
            generation,
            ttl_ms,
        } => {
            let req = RenewLease {
                profile,
                generation,
                ttl_ms,
            };
            c.renew_lease(id, &req, key).await?
        }
        LeaseCmd::Release {
            id,
            profile,
            generation,
        } => {
            let req = LeaseFence {
                profile,
                generation,
            };
            c.release_lease(id, &req, key).await?
        }
        LeaseCmd::Fence {
            id,
            profile,
            generation,
            reason,
        } => {
            let req = FenceLease {
                profile,
                generation,
                reason,
            };
            c.fence_lease(id, &req, key).await?
        }
        other => anyhow::bail!("not a lease write: {other:?}"),
    };
    ctx.outcome(&out)
}

async fn run_takeover(ctx: &Ctx, cmd: LeaseCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    let out = match cmd {
        LeaseCmd::TakeoverGraceful {
            profile,
            lease,
            generation,
            capsule,
            next,
            old_evidence_cgroup,
        } => {
            let req = GracefulTakeover {
                lease,
                generation,
                capsule: capsule_draft(capsule)?,
                next: next_holder(next),
                old_reap_evidence: evidence(old_evidence_cgroup),
            };
            c.takeover_graceful(profile, &req, ctx.key()).await?
        }
        LeaseCmd::TakeoverCrash {
            profile,
            lease,
            generation,
            next,
            evidence_cgroup,
        } => {
            let req = CrashTakeover {
                lease,
                generation,
                next: next_holder(next),
                reap_evidence: evidence(evidence_cgroup),
            };
            c.takeover_crash(profile, &req, ctx.key()).await?
        }
        other => anyhow::bail!("not a takeover: {other:?}"),
    };
    ctx.outcome(&out)
}

fn holder(h: &HolderArgs) -> LeaseHolder {
    LeaseHolder {
        worker: h.worker.clone(),
        process: h.process.clone(),
        cgroup: h.cgroup.clone(),
    }
}

fn next_holder(h: HolderArgs) -> NextHolder {
    NextHolder {
        provider: h.provider,
        holder: holder(&h),
        ttl_ms: h.ttl_ms,
    }
}

fn evidence(cgroup: Option<String>) -> Option<TakeoverEvidence> {
    cgroup.map(|cgroup| TakeoverEvidence {
        cgroup,
        populated: false,
        observed_at_ms: squadron_client::now_ms(),
    })
}

fn leases_table(list: &[RuntimeLease]) -> String {
    let mut t = Table::new(&[
        "id",
        "profile",
        "generation",
        "state",
        "provider",
        "worker",
        "expires_at_ms",
    ]);
    for l in list {
        t.row(vec![
            l.id.to_string(),
            l.profile.to_string(),
            l.generation.to_string(),
            l.state.name().into(),
            l.provider.to_string(),
            l.holder.worker.to_string(),
            l.expires_at_ms.to_string(),
        ]);
    }
    t.render()
}
