//! `squadron evidence`: the ADR's release-gate evidence of one project.

use clap::Args;
use squadron_client::Consistency;
use squadron_core::ids::{ProjectId, TenantId};

use super::Ctx;
use crate::output::emit_generic;

#[derive(Debug, Clone, Args)]
pub struct EvidenceArgs {
    #[arg(long, default_value = "default")]
    pub tenant: TenantId,
    #[arg(long)]
    pub project: ProjectId,
}

/// One node's evidence, with the MCP denials of every member added up (each node counts the
/// checks it answered).
pub async fn run(ctx: &Ctx, args: EvidenceArgs) -> anyhow::Result<()> {
    let c = &ctx.client;
    let mut ev = c.project_evidence(&args.tenant, &args.project).await?;
    let status = c.cluster_status(Consistency::Stale).await?;
    let mut denied = 0;
    let mut asked = 0;
    for m in &status.members {
        let node = c.with_endpoints(vec![format!("https://{}", m.rest)]);
        match node.project_evidence(&args.tenant, &args.project).await {
            Ok(e) => {
                denied += e.unauthorized_mcp_denied;
                asked += 1;
            }
            Err(e) => eprintln!("member {} ({}) not counted: {e}", m.id, m.rest),
        }
    }
    if asked > 0 {
        ev.unauthorized_mcp_denied = denied;
    }
    emit_generic(ctx.out, &ev)
}
