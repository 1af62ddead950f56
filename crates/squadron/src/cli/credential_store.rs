//! `squadron credential`: the credential store (admin). A value is read from a file or
//! standard input — never from the command line, where `ps` shows it — and one trailing
//! newline is dropped (`echo key > file` writes one).

use std::path::PathBuf;

use clap::Subcommand;
use squadron_client::{CredentialView, PutCredential, PutCredentialEgress, RotateCredential};
use squadron_core::credential::LeasedCredential;
use squadron_core::ids::{CredentialId, TaskId};
use zeroize::Zeroizing;

use super::{read_input, Ctx};
use crate::output::{emit, Table};

#[derive(Debug, Subcommand)]
pub enum CredentialCmd {
    /// Store a credential; manifests name it in `startup_profile.credential_refs`.
    Put {
        id: CredentialId,
        /// The file holding the value; `-` reads standard input.
        #[arg(long, value_name = "FILE")]
        from_file: PathBuf,
        /// What it is (listed with it).
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List credentials (never their values).
    List,
    /// Replace a credential's value.
    Rotate {
        id: CredentialId,
        /// The file holding the new value; `-` reads standard input.
        #[arg(long, value_name = "FILE")]
        from_file: PathBuf,
    },
    /// Revoke a credential: its value is deleted and the leases holding it end.
    Revoke { id: CredentialId },
    /// A task's credential leases (versions, holder, when they ended).
    Leases { task: TaskId },
    /// Inject a credential at egress: it never enters a sandbox; the worker's proxy adds it
    /// to requests bound for UPSTREAM only. The sandbox gets `{MOUNT}_BASE_URL` and a
    /// placeholder in `{MOUNT}` (for `anthropic_api_key` and `openai_api_key` also the
    /// provider's own base URL variable).
    EgressSet {
        id: CredentialId,
        /// `https://host[:port][/base path]`.
        #[arg(long)]
        upstream: String,
        /// The request header that carries the value (`x-api-key`, `authorization`).
        #[arg(long)]
        header: String,
        /// Text in front of the value in that header (`"Bearer "`).
        #[arg(long, default_value = "")]
        value_prefix: String,
    },
    /// Stop injecting a credential at egress: leases from now on write it as a file again.
    EgressClear { id: CredentialId },
}

pub async fn run(ctx: &Ctx, cmd: CredentialCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        CredentialCmd::Put {
            id,
            from_file,
            description,
        } => {
            let value = read_value(&from_file)?;
            let req = PutCredential {
                id,
                value: value.to_string(),
                description,
            };
            ctx.outcome(&c.put_credential(&req, ctx.key()).await?)
        }
        CredentialCmd::List => {
            let list = c.list_credentials(ctx.consistency).await?;
            emit(ctx.out, &list, |list| credentials_table(list))
        }
        CredentialCmd::Rotate { id, from_file } => {
            let value = read_value(&from_file)?;
            let req = RotateCredential {
                value: value.to_string(),
            };
            ctx.outcome(&c.rotate_credential(&id, &req, ctx.key()).await?)
        }
        CredentialCmd::Revoke { id } => ctx.outcome(&c.revoke_credential(&id, ctx.key()).await?),
        CredentialCmd::EgressSet {
            id,
            upstream,
            header,
            value_prefix,
        } => {
            let req = PutCredentialEgress {
                upstream,
                header,
                value_prefix,
            };
            ctx.outcome(&c.set_credential_egress(&id, &req, ctx.key()).await?)
        }
        CredentialCmd::EgressClear { id } => {
            ctx.outcome(&c.clear_credential_egress(&id, ctx.key()).await?)
        }
        CredentialCmd::Leases { task } => {
            let list = c.credential_leases(task, ctx.consistency).await?;
            emit(ctx.out, &list, |list| {
                let mut t = Table::new(&["lease", "attempt", "worker", "credentials", "ended"]);
                for l in list {
                    t.row(vec![
                        l.id.to_string(),
                        l.attempt.to_string(),
                        l.worker.to_string(),
                        held(&l.credentials),
                        l.revoked_reason.clone().unwrap_or_else(|| "active".into()),
                    ]);
                }
                t.render()
            })
        }
    }
}

/// What a lease handed out, as a table cell: `id@vN→mount`, comma-separated.
pub(super) fn held(credentials: &[LeasedCredential]) -> String {
    credentials
        .iter()
        .map(|c| format!("{}@v{}→{}", c.id, c.version, c.mount))
        .collect::<Vec<_>>()
        .join(",")
}

fn read_value(path: &std::path::Path) -> anyhow::Result<Zeroizing<String>> {
    let mut text = Zeroizing::new(read_input(path)?);
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        anyhow::bail!("--from-file {}: the value is empty", path.display());
    }
    Ok(text)
}

fn credentials_table(list: &[CredentialView]) -> String {
    let mut t = Table::new(&[
        "id",
        "version",
        "description",
        "updated",
        "revoked",
        "egress",
    ]);
    for v in list {
        t.row(vec![
            v.id.to_string(),
            v.version.to_string(),
            v.description.clone(),
            v.updated_at_ms.to_string(),
            v.revoked_at_ms.map_or("-".into(), |m| m.to_string()),
            v.egress.as_ref().map_or("-".into(), |e| e.upstream.clone()),
        ]);
    }
    t.render()
}
