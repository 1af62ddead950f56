//! The cluster's first admin token. `squadron init` leaves its id and hash (never the
//! secret) in the initialising node's PKI directory; that node, once it has initialised a new
//! cluster, proposes `CreateOperatorToken` as the system, under one idempotency key, until it
//! is committed. Every other node finds no file and does nothing.

use std::sync::Arc;
use std::time::Duration;

use squadron_core::access::{Role, Subject, TokenId};
use squadron_core::command::CreateOperatorToken;
use squadron_core::ids::{Digest, IdempotencyKey};
use squadron_core::{Command, Response};
use squadron_pki::AdminTokenRecord;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::node::ControlNode;

/// The name the first admin token is listed under.
pub const BOOTSTRAP_ADMIN_NAME: &str = "bootstrap admin";
/// Pause between proposals while no leader is elected yet.
pub const BOOTSTRAP_RETRY_MS: u64 = 200;

pub fn spawn(node: Arc<ControlNode>, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let record = match AdminTokenRecord::read(&node.config.pki_dir()) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(error = %e, "the first admin token's record is unreadable");
                return;
            }
        };
        let Some((command, key)) = command_of(&record) else {
            tracing::error!("the first admin token's record is malformed");
            return;
        };
        loop {
            match node
                .write(Subject::System, command.clone(), Some(key.clone()))
                .await
            {
                Ok(Response::Rejected(r)) => {
                    tracing::warn!(rejection = ?r, "the first admin token was refused");
                    return;
                }
                Ok(_) => {
                    tracing::info!("the first admin token is in the replicated state");
                    return;
                }
                Err(e) => tracing::debug!(error = ?e, "first admin token not yet committed"),
            }
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(Duration::from_millis(BOOTSTRAP_RETRY_MS)) => {}
            }
        }
    })
}

fn command_of(record: &AdminTokenRecord) -> Option<(Command, IdempotencyKey)> {
    let id = TokenId::new(record.id.clone()).ok()?;
    let key = IdempotencyKey::new(format!("bootstrap-admin-{}", record.id)).ok()?;
    let command = Command::CreateOperatorToken(CreateOperatorToken {
        id,
        digest: Digest::from_bytes(record.hash.0),
        role: Role::Admin,
        scope: Vec::new(),
        name: BOOTSTRAP_ADMIN_NAME.to_owned(),
        expires_at_ms: None,
    });
    Some((command, key))
}
