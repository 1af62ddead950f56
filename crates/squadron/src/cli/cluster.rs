//! `squadron cluster`: membership and health.

use clap::Subcommand;
use squadron_client::AddLearner;

use super::Ctx;
use crate::output::{emit, emit_generic};
use crate::status;

#[derive(Debug, Subcommand)]
pub enum ClusterCmd {
    /// Every node's own view (stale reads of every --endpoint and of every member), with the
    /// leader and term the cluster agrees on.
    Status,
    /// Exit 0 once the node at --endpoint (the first that answers) knows a leader
    /// (`GET /readyz`, public): a health check for containers and scripts.
    Ready,
    /// Add a node as a learner.
    Add {
        #[arg(long)]
        id: u64,
        /// The new node's REST `host:port`.
        #[arg(long, value_name = "HOST:PORT")]
        rest: String,
        /// The new node's gRPC `host:port`.
        #[arg(long, value_name = "HOST:PORT")]
        grpc: String,
        /// The new node's peer `host:port` (Raft, the node-to-node protocol).
        #[arg(long, value_name = "HOST:PORT")]
        peer: String,
    },
    /// Promote a learner to voter.
    Promote {
        #[arg(long)]
        id: u64,
    },
    /// Remove a voter or learner.
    Remove {
        #[arg(long)]
        id: u64,
    },
}

pub async fn run(ctx: &Ctx, cmd: ClusterCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        ClusterCmd::Status => cluster_status(ctx).await,
        ClusterCmd::Ready => {
            let text = c.ready().await?;
            println!("{}", text.trim());
            Ok(())
        }
        ClusterCmd::Add {
            id,
            rest,
            grpc,
            peer,
        } => {
            let changed = c
                .add_learner(&AddLearner {
                    id,
                    rest,
                    grpc,
                    peer,
                })
                .await?;
            emit_generic(ctx.out, &changed)
        }
        ClusterCmd::Promote { id } => emit_generic(ctx.out, &c.promote_voter(id).await?),
        ClusterCmd::Remove { id } => emit_generic(ctx.out, &c.remove_member(id).await?),
    }
}

/// `cluster status`: unavailable only when no node answered at all.
async fn cluster_status(ctx: &Ctx) -> anyhow::Result<()> {
    let probes = status::gather(&ctx.client).await;
    if probes.iter().all(|p| p.answer.is_err()) {
        let why: Vec<String> = probes
            .iter()
            .map(|p| {
                format!(
                    "{}: {}",
                    p.rest,
                    p.answer.as_ref().err().map_or("", String::as_str)
                )
            })
            .collect();
        anyhow::bail!("unavailable: no node answered ({})", why.join("; "));
    }
    let view = status::assemble(&probes);
    emit(ctx.out, &view, status::render)
}
