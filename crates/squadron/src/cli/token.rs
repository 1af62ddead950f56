//! `squadron token`: operator tokens (create, list, revoke). A created token's secret is shown
//! once: on standard output, or written with mode 0600 into `--token-out`.

use std::path::PathBuf;

use clap::Subcommand;
use squadron_client::{CreateToken, CreatedToken, MintBootstrap, TokenView};
use squadron_core::access::{ProjectScope, Role, TokenId};
use squadron_core::ids::WorkerId;

use super::{Ctx, OutputFormat};
use crate::output::{emit, write_stdout, Table};

/// Mode of a file `--token-out` writes.
const TOKEN_FILE_MODE: u32 = 0o600;

#[derive(Debug, Subcommand)]
pub enum TokenCmd {
    /// Create an operator token. Its secret is printed once (or written to --token-out).
    Create {
        /// What the token is for (listed with it).
        #[arg(long)]
        name: String,
        /// admin, operator or viewer.
        #[arg(long, value_parser = parse_role)]
        role: Role,
        /// `TENANT` or `TENANT/PROJECT` the token covers; repeat for several (an operator
        /// token needs at least one).
        #[arg(long = "scope", value_parser = parse_scope)]
        scope: Vec<ProjectScope>,
        /// Life of the token (`30d`, `12h`); default: until revoked.
        #[arg(long)]
        ttl: Option<String>,
        /// Write the secret into this file (mode 0600, must not exist) instead of stdout.
        #[arg(long, value_name = "FILE")]
        token_out: Option<PathBuf>,
    },
    /// List operator tokens (never their secrets).
    List,
    /// Revoke an operator token.
    Revoke { id: TokenId },
    /// Mint a one-time bootstrap token a new worker exchanges for its certificate
    /// (`squadron worker --bootstrap-token-file F`).
    Bootstrap {
        /// The worker id it is for; default: any id the cluster does not know yet.
        #[arg(long)]
        worker: Option<WorkerId>,
        /// Life of the token (10 s to 24 h).
        #[arg(long, default_value = "10m")]
        ttl: String,
        /// Write the secret into this file (mode 0600, must not exist) instead of stdout.
        #[arg(long, value_name = "FILE")]
        token_out: Option<PathBuf>,
    },
}

pub async fn run(ctx: &Ctx, cmd: TokenCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        TokenCmd::Create {
            name,
            role,
            scope,
            ttl,
            token_out,
        } => {
            refuse_existing(token_out.as_ref())?;
            let req = CreateToken {
                name,
                role,
                scope,
                ttl,
            };
            let created = c.create_token(&req, ctx.key()).await?;
            show_created(ctx.out, &created, token_out)
        }
        TokenCmd::List => {
            let list = c.list_tokens(ctx.consistency).await?;
            emit(ctx.out, &list, |list| tokens_table(list))
        }
        TokenCmd::Revoke { id } => ctx.outcome(&c.revoke_token(&id, ctx.key()).await?),
        TokenCmd::Bootstrap {
            worker,
            ttl,
            token_out,
        } => {
            bootstrap(
                ctx,
                MintBootstrap {
                    worker,
                    ttl: Some(ttl),
                },
                token_out,
            )
            .await
        }
    }
}

/// `--token-out` is never overwritten: checked before anything is minted.
fn refuse_existing(token_out: Option<&PathBuf>) -> anyhow::Result<()> {
    match token_out.filter(|p| p.exists()) {
        Some(path) => anyhow::bail!(
            "--token-out {} exists; it is never overwritten",
            path.display()
        ),
        None => Ok(()),
    }
}

async fn bootstrap(
    ctx: &Ctx,
    req: MintBootstrap,
    token_out: Option<PathBuf>,
) -> anyhow::Result<()> {
    refuse_existing(token_out.as_ref())?;
    let minted = ctx.client.mint_bootstrap(&req, ctx.key()).await?;
    match token_out {
        Some(path) => {
            squadron_pki::pki_dir::write_file(&path, minted.token.as_bytes(), TOKEN_FILE_MODE)?;
            eprintln!(
                "bootstrap token {} minted; its secret is in {}",
                minted.id,
                path.display()
            );
            Ok(())
        }
        None if ctx.out == OutputFormat::Json => emit(ctx.out, &minted, |_| String::new()),
        None => {
            eprintln!(
                "bootstrap token {} minted (one use); this is the only time it is shown:",
                minted.id
            );
            write_stdout(&format!("{}\n", minted.token))
        }
    }
}

fn show_created(
    out: OutputFormat,
    created: &CreatedToken,
    token_out: Option<PathBuf>,
) -> anyhow::Result<()> {
    if let Some(path) = token_out {
        // Checked before the request would be better, but the secret exists only now; an
        // existing file is never replaced (the token is then shown nowhere: revoke it).
        if path.exists() {
            anyhow::bail!(
                "{} exists and is not overwritten; token {} was created: revoke it and retry",
                path.display(),
                created.id
            );
        }
        squadron_pki::pki_dir::write_file(&path, created.token.as_bytes(), TOKEN_FILE_MODE)?;
        eprintln!(
            "token {} ({}) created; its secret is in {}",
            created.id,
            role_name(created.role),
            path.display()
        );
        return Ok(());
    }
    match out {
        OutputFormat::Json => emit(out, created, |_| String::new()),
        OutputFormat::Table => {
            eprintln!(
                "token {} ({}) created; this is the only time its secret is shown:",
                created.id,
                role_name(created.role)
            );
            write_stdout(&format!("{}\n", created.token))
        }
    }
}

fn tokens_table(list: &[TokenView]) -> String {
    let mut t = Table::new(&["id", "name", "role", "scope", "expires", "revoked"]);
    for v in list {
        let scope: Vec<String> = v.scope.iter().map(scope_text).collect();
        let ms = |m: Option<u64>| m.map_or("-".to_string(), |m| m.to_string());
        t.row(vec![
            v.id.to_string(),
            v.name.clone(),
            role_name(v.role).to_string(),
            if scope.is_empty() {
                "everywhere".into()
            } else {
                scope.join(",")
            },
            ms(v.expires_at_ms),
            ms(v.revoked_at_ms),
        ]);
    }
    t.render()
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Admin => "admin",
        Role::Operator => "operator",
        Role::Viewer => "viewer",
    }
}

fn scope_text(s: &ProjectScope) -> String {
    match &s.project {
        Some(p) => format!("{}/{p}", s.tenant),
        None => s.tenant.to_string(),
    }
}

fn parse_role(s: &str) -> Result<Role, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("{s:?} is not a role: admin, operator or viewer"))
}

fn parse_scope(s: &str) -> Result<ProjectScope, String> {
    let (tenant, project) = match s.split_once('/') {
        Some((t, p)) => (t, Some(p)),
        None => (s, None),
    };
    Ok(ProjectScope {
        tenant: tenant.parse().map_err(|e| format!("{e}"))?,
        project: project
            .map(str::parse)
            .transpose()
            .map_err(|e| format!("{e}"))?,
    })
}
