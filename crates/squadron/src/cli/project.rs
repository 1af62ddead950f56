//! `squadron project`: projects and their single sandbox.

use clap::Subcommand;
use squadron_client::{AttachSandbox, CreateProject, ProjectSummary};
use squadron_core::ids::WorkerId;
use squadron_core::manifest::RuntimeKind;
use squadron_core::roster::RosterSnapshot;

use super::{Ctx, ProjectRef};
use crate::output::{self, emit, emit_generic, Table};

#[derive(Debug, Subcommand)]
pub enum ProjectCmd {
    /// Create a project.
    Create {
        #[command(flatten)]
        at: ProjectRef,
        #[arg(long)]
        max_profiles: Option<u32>,
        #[arg(long)]
        max_active: Option<u32>,
    },
    /// List projects.
    List,
    /// Show a project with its sandbox, slots and stats.
    Get {
        #[command(flatten)]
        at: ProjectRef,
    },
    /// Attach the project's single sandbox.
    AttachSandbox {
        #[command(flatten)]
        at: ProjectRef,
        #[arg(long)]
        worker: WorkerId,
        #[arg(long, default_value = "process")]
        runtime: RuntimeKind,
        #[arg(long)]
        sandbox_ref: String,
    },
    /// Detach the project's sandbox (refused while slots are held).
    DetachSandbox {
        #[command(flatten)]
        at: ProjectRef,
        #[arg(long)]
        sandbox_ref: String,
    },
    /// The project's roster.
    Roster {
        #[command(flatten)]
        at: ProjectRef,
    },
}

pub async fn run(ctx: &Ctx, cmd: ProjectCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        ProjectCmd::Create {
            at,
            max_profiles,
            max_active,
        } => {
            let req = CreateProject {
                tenant: at.tenant,
                project: at.project,
                max_profiles,
                max_active,
            };
            ctx.outcome(&c.create_project(&req, ctx.key()).await?)
        }
        ProjectCmd::List => {
            let list = c.list_projects(ctx.consistency).await?;
            emit(ctx.out, &list, |list| projects_table(list))
        }
        ProjectCmd::Get { at } => {
            let p = c
                .get_project(&at.tenant, &at.project, ctx.consistency)
                .await?;
            emit_generic(ctx.out, &p)
        }
        ProjectCmd::AttachSandbox {
            at,
            worker,
            runtime,
            sandbox_ref,
        } => {
            let req = AttachSandbox {
                worker,
                runtime,
                sandbox_ref,
            };
            let out = c
                .attach_sandbox(&at.tenant, &at.project, &req, ctx.key())
                .await?;
            ctx.outcome(&out)
        }
        ProjectCmd::DetachSandbox { at, sandbox_ref } => ctx.outcome(
            &c.detach_sandbox(&at.tenant, &at.project, &sandbox_ref, ctx.key())
                .await?,
        ),
        ProjectCmd::Roster { at } => {
            let roster = c.roster(&at.tenant, &at.project, ctx.consistency).await?;
            emit(ctx.out, &roster, roster_text)
        }
    }
}

fn projects_table(list: &[ProjectSummary]) -> String {
    let mut t = Table::new(&["tenant", "project", "profiles", "slots", "sandbox"]);
    for p in list {
        t.row(vec![
            p.tenant.to_string(),
            p.project.to_string(),
            p.profiles.to_string(),
            format!("{}/{}", p.slots_held, p.max_active),
            p.sandbox.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    t.render()
}

fn roster_text(r: &RosterSnapshot) -> String {
    let items: Vec<serde_json::Value> = r
        .entries
        .iter()
        .filter_map(|e| serde_json::to_value(e).ok())
        .collect();
    format!(
        "revision: {}\n{}",
        r.revision,
        output::value_table(&items).render()
    )
}
