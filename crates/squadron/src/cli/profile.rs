//! `squadron profile`: agent profiles, capability manifests, MCP authorization, and the
//! operator facade of a profile's provider (launch, observe, takeover, stop, reap).

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use squadron_client::{
    CreateProfile, LaunchAgent, ProfileCredentialsView, SandboxRepository, SetCapabilities,
    SetProfileCredentials, SquadronClient, StopAgent, TakeoverAgent, TakeoverKind,
};
use squadron_core::ids::{CredentialId, McpServerId, ProfileId, ProfileKey, SkillId, WorkerId};
use squadron_core::manifest::CredentialRef;
use squadron_core::profile::AgentProfile;
use squadron_core::provider::Provider;

use super::{Ctx, ProjectRef};
use crate::output::{emit, emit_generic, short, Table};

/// Agent operations wait for grace periods and lease expiry: a longer timeout than reads.
/// Longer than the node's relay timeout, so the node's own error arrives first.
const AGENT_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(320);

#[derive(Debug, Subcommand)]
pub enum ProfileCmd {
    /// Create an agent profile.
    Create {
        #[command(flatten)]
        at: ProjectRef,
        #[arg(long)]
        key: ProfileKey,
        /// Provider priority list, preferred first.
        #[arg(long, value_delimiter = ',', default_value = "codex,claude")]
        providers: Vec<Provider>,
        #[arg(long)]
        context_ref: Option<String>,
    },
    /// Show a profile: generation, live lease, capsule head, capabilities.
    Get { id: ProfileId },
    /// List a project's profiles.
    List {
        #[command(flatten)]
        at: ProjectRef,
    },
    /// Replace the capability manifest (compare-and-swap on its version).
    Capabilities {
        id: ProfileId,
        #[arg(long)]
        expected_version: u64,
        #[arg(long, value_delimiter = ',')]
        required_skills: Vec<SkillId>,
        #[arg(long, value_delimiter = ',')]
        mcp_servers: Vec<McpServerId>,
    },
    /// Grant the profile mcp_server:use on a server.
    McpGrant {
        id: ProfileId,
        #[arg(long)]
        server: McpServerId,
    },
    /// Revoke mcp_server:use.
    McpRevoke {
        id: ProfileId,
        #[arg(long)]
        server: McpServerId,
    },
    /// Check mcp_server:use (exit 1 with permission_denied when not allowed).
    McpCheck {
        id: ProfileId,
        #[arg(long)]
        server: McpServerId,
    },
    /// Name the credentials the profile's providers are given as files (admin), from its next
    /// generation on; no `--ref` gives none.
    CredentialsSet {
        id: ProfileId,
        /// A credential and the mount it appears under: `ID=MOUNT`
        /// (`cred_anthropic=anthropic_api_key`), repeatable.
        #[arg(long = "ref", value_name = "ID=MOUNT")]
        refs: Vec<String>,
    },
    /// The credentials a profile is given, and its generations' leases (never a value).
    Credentials { id: ProfileId },
    /// Launch the profile's provider in its project's sandbox under a new lease.
    Launch {
        id: ProfileId,
        /// The provider; by default the profile's first one the worker can launch.
        #[arg(long)]
        provider: Option<Provider>,
        /// The worker that makes the project's sandbox, when the project has none yet.
        #[arg(long)]
        worker: Option<WorkerId>,
        /// The repository the sandbox is cloned from, when this launch makes it.
        #[arg(long, value_name = "URL")]
        repository: Option<String>,
        #[arg(long, requires = "repository")]
        branch: Option<String>,
        /// A file whose text is given to the provider on standard input.
        #[arg(long, value_name = "FILE")]
        prompt_file: Option<PathBuf>,
    },
    /// Show the profile's provider attempt as its worker sees it.
    Observe { id: ProfileId },
    /// Take the profile over: graceful (capsule, fence, grant) or crash (expiry, evidence,
    /// grant); the next provider is started.
    Takeover {
        id: ProfileId,
        #[arg(long, value_enum)]
        kind: TakeoverKindArg,
        /// The next provider; by default the profile's preferred one other than the current.
        #[arg(long)]
        provider: Option<Provider>,
        /// Crash takeover: how long to wait for the old lease to expire.
        #[arg(long, value_name = "MS")]
        wait_for_expiry_ms: Option<u64>,
    },
    /// Stop the provider (SIGTERM, grace, SIGKILL), reap it and end its lease.
    Stop {
        id: ProfileId,
        #[arg(long, value_name = "MS")]
        grace_ms: Option<u64>,
    },
    /// Reap a dead or fenced generation and record the evidence (frees its slot).
    Reap { id: ProfileId },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TakeoverKindArg {
    Graceful,
    Crash,
}

pub async fn run(ctx: &Ctx, cmd: ProfileCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        ProfileCmd::Create {
            at,
            key,
            providers,
            context_ref,
        } => {
            let req = CreateProfile {
                key,
                providers,
                context_ref,
            };
            let out = c
                .create_profile(&at.tenant, &at.project, &req, ctx.key())
                .await?;
            ctx.outcome(&out)
        }
        ProfileCmd::Get { id } => emit_generic(ctx.out, &c.get_profile(id, ctx.consistency).await?),
        ProfileCmd::List { at } => {
            let list = c
                .list_profiles(&at.tenant, &at.project, ctx.consistency)
                .await?;
            emit(ctx.out, &list, |l| profiles_table(l))
        }
        ProfileCmd::Capabilities {
            id,
            expected_version,
            required_skills,
            mcp_servers,
        } => {
            let req = SetCapabilities {
                expected_version,
                required_skills,
                mcp_servers,
            };
            ctx.outcome(&c.set_capabilities(id, &req, ctx.key()).await?)
        }
        ProfileCmd::McpGrant { id, server } => {
            ctx.outcome(&c.grant_mcp(id, &server, ctx.key()).await?)
        }
        ProfileCmd::McpRevoke { id, server } => {
            ctx.outcome(&c.revoke_mcp(id, &server, ctx.key()).await?)
        }
        ProfileCmd::McpCheck { id, server } => {
            emit_generic(ctx.out, &c.check_mcp(id, &server, ctx.consistency).await?)
        }
        ProfileCmd::CredentialsSet { id, refs } => {
            let req = SetProfileCredentials {
                credential_refs: refs
                    .iter()
                    .map(|r| parse_credential_ref(r))
                    .collect::<anyhow::Result<_>>()?,
            };
            ctx.outcome(&c.set_profile_credentials(id, &req, ctx.key()).await?)
        }
        ProfileCmd::Credentials { id } => {
            let view = c.profile_credentials(id, ctx.consistency).await?;
            emit(ctx.out, &view, profile_credentials_table)
        }
        agent => agent_command(ctx, agent).await,
    }
}

/// The operator facade: the node relays these to the worker holding the project's sandbox.
async fn agent_command(ctx: &Ctx, cmd: ProfileCmd) -> anyhow::Result<()> {
    match cmd {
        ProfileCmd::Launch {
            id,
            provider,
            worker,
            repository,
            branch,
            prompt_file,
        } => {
            let prompt = match prompt_file {
                Some(f) => Some(
                    std::fs::read_to_string(&f)
                        .with_context(|| format!("--prompt-file {}", f.display()))?,
                ),
                None => None,
            };
            let req = LaunchAgent {
                provider,
                worker,
                repository: repository.map(|url| SandboxRepository { url, branch }),
                prompt,
            };
            emit_generic(ctx.out, &agent_client(ctx).agent_launch(id, &req).await?)
        }
        ProfileCmd::Observe { id } => emit_generic(ctx.out, &ctx.client.agent_view(id).await?),
        ProfileCmd::Takeover {
            id,
            kind,
            provider,
            wait_for_expiry_ms,
        } => {
            let req = TakeoverAgent {
                kind: match kind {
                    TakeoverKindArg::Graceful => TakeoverKind::Graceful,
                    TakeoverKindArg::Crash => TakeoverKind::Crash,
                },
                provider,
                wait_for_expiry_ms,
                prompt: None,
            };
            emit_generic(ctx.out, &agent_client(ctx).agent_takeover(id, &req).await?)
        }
        ProfileCmd::Stop { id, grace_ms } => emit_generic(
            ctx.out,
            &agent_client(ctx)
                .agent_stop(id, &StopAgent { grace_ms })
                .await?,
        ),
        ProfileCmd::Reap { id } => emit_generic(ctx.out, &agent_client(ctx).agent_reap(id).await?),
        other => anyhow::bail!("not an agent operation: {other:?}"),
    }
}

/// A client with the longer timeout agent operations need.
fn agent_client(ctx: &Ctx) -> SquadronClient {
    SquadronClient::with_timeouts(
        ctx.client.endpoints().to_vec(),
        AGENT_CALL_TIMEOUT,
        squadron_client::CONNECT_TIMEOUT_DEFAULT,
    )
}

/// `ID=MOUNT`, as `--ref` takes it; the node checks both names.
fn parse_credential_ref(spec: &str) -> anyhow::Result<CredentialRef> {
    let Some((id, mount)) = spec.split_once('=') else {
        anyhow::bail!("--ref {spec:?}: must be ID=MOUNT, e.g. cred_anthropic=anthropic_api_key");
    };
    let id = CredentialId::new(id).map_err(|e| anyhow::anyhow!("--ref {spec:?}: {e}"))?;
    Ok(CredentialRef {
        id,
        mount: mount.to_owned(),
    })
}

fn profile_credentials_table(view: &ProfileCredentialsView) -> String {
    let given: Vec<String> = view
        .credential_refs
        .iter()
        .map(|r| format!("{}→{}", r.id, r.mount))
        .collect();
    let mut t = Table::new(&["lease", "generation", "worker", "credentials", "ended"]);
    for l in &view.leases {
        t.row(vec![
            l.id.to_string(),
            l.generation.to_string(),
            l.worker.to_string(),
            super::credential_store::held(&l.credentials),
            l.revoked_reason.clone().unwrap_or_else(|| "active".into()),
        ]);
    }
    let given = if given.is_empty() {
        "none".to_owned()
    } else {
        given.join(", ")
    };
    format!("given: {given}\n{}", t.render())
}

fn profiles_table(list: &[AgentProfile]) -> String {
    let mut t = Table::new(&[
        "id",
        "key",
        "providers",
        "generation",
        "live_lease",
        "fenced",
        "capsule_head",
    ]);
    for p in list {
        t.row(vec![
            p.id.to_string(),
            p.key.to_string(),
            p.providers
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(","),
            p.generation.to_string(),
            p.live_lease
                .map(|l| l.to_string())
                .unwrap_or_else(|| "-".into()),
            p.fenced_unreaped.len().to_string(),
            p.capsule_head
                .map(|h| format!("{}:{}", h.sequence, short(&h.digest.to_hex())))
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    t.render()
}
