//! Break-glass SSH into a guest kept after a failure (FAILED_PRESERVED), the seed's
//! `ssh -i … agent@…`: an ed25519 key pair made for that one guest at provisioning, its
//! private half root's alone in the domain's directory (QEMU's user cannot read it), its
//! public half on the guest's kernel command line. The guest serves SSH on a virtio-serial
//! port (`vm-init`), so the line works in every network mode, `isolated` too: `ssh` reaches
//! it through the port's host socket, which only root and QEMU's user may open, with the
//! worker's own binary as its proxy (`squadron vm-ssh-proxy`: the port's handshake, see
//! `squadron_api::agent_channel::BREAK_GLASS_HELLO`).
//!
//! The key goes with the domain's directory: when the worker destroys the domain, or at its
//! next start once an operator removed a kept guest by hand.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ssh_key::rand_core::OsRng;
use ssh_key::{Algorithm, LineEnding, PrivateKey};

use super::RUNTIME_NAME;
use crate::error::WorkerError;
use crate::support::remove_path;

/// In a domain's directory: the key pair and the known host key, root's only.
const BREAK_GLASS_DIR: &str = "break-glass";
const PRIVATE_KEY_NAME: &str = "id_ed25519";
const KNOWN_HOSTS_NAME: &str = "known_hosts";
/// The guest's user the line logs in as: the sandbox user, by the image's name for it.
const GUEST_USER: &str = "agent";

/// The break-glass key files of one domain.
#[derive(Debug, Clone)]
pub(crate) struct BreakGlassKey {
    dir: PathBuf,
}

impl BreakGlassKey {
    pub(crate) fn of_domain(domain_dir: &Path) -> Self {
        Self {
            dir: domain_dir.join(BREAK_GLASS_DIR),
        }
    }

    /// Makes a fresh key pair (replacing one an earlier life left before its domain was
    /// defined); returns the public key's base64, for the guest.
    pub(crate) fn create(&self) -> Result<String, WorkerError> {
        let key = PrivateKey::random(&mut OsRng, Algorithm::Ed25519).map_err(key_error)?;
        let private = key.to_openssh(LineEnding::LF).map_err(key_error)?;
        let public = key.public_key().to_openssh().map_err(key_error)?;
        remove_path(&self.dir)?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| WorkerError::io("create the break-glass key directory", &self.dir, e))?;
        let path = self.private_key();
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| WorkerError::io("create the break-glass key", &path, e))?;
        file.write_all(private.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| WorkerError::io("write the break-glass key", &path, e))?;
        // `ssh-ed25519 BASE64`: the guest gets the base64 alone, free of spaces.
        match public.split(' ').nth(1) {
            Some(base64) if !base64.is_empty() => Ok(base64.to_string()),
            _ => Err(key_error(format!(
                "an unexpected public key encoding {public:?}"
            ))),
        }
    }

    pub(crate) fn private_key(&self) -> PathBuf {
        self.dir.join(PRIVATE_KEY_NAME)
    }

    pub(crate) fn exists(&self) -> bool {
        self.private_key().is_file()
    }

    /// The command an operator runs on this worker to get a shell in the guest named
    /// `name`, whose break-glass port's host end is `socket`, through `squadron` (this
    /// worker's binary); `None` when a path holds characters the line cannot carry as they
    /// are (the line is copied into a shell, and `ProxyCommand` is run by one). The guest made
    /// its host key when it was kept: the first connection records it in the domain's own
    /// known hosts, later ones must meet the same key. Nothing is forwarded, the operator's
    /// own configuration is not read, and a session whose guest end went quiet ends.
    pub(crate) fn ssh_command(&self, name: &str, socket: &Path, squadron: &Path) -> Option<String> {
        let (key, known) = (self.private_key(), self.dir.join(KNOWN_HOSTS_NAME));
        let (key, known) = (plain(&key)?, plain(&known)?);
        let (squadron, socket) = (plain(squadron)?, plain(socket)?);
        if !name.bytes().all(is_plain) {
            return None;
        }
        Some(format!(
            "ssh -F none -a -x -i {key} -o IdentitiesOnly=yes -o ClearAllForwardings=yes \
             -o ServerAliveInterval=10 -o ServerAliveCountMax=3 \
             -o UserKnownHostsFile={known} -o StrictHostKeyChecking=accept-new \
             -o HostKeyAlias={name} -o ProxyCommand='{squadron} vm-ssh-proxy {socket}' \
             {GUEST_USER}@{name}"
        ))
    }
}

fn key_error(e: impl std::fmt::Display) -> WorkerError {
    WorkerError::runtime(RUNTIME_NAME, format!("break-glass key: {e}"))
}

/// A path the line carries as it is: no byte a shell or ssh's `%` tokens would read.
fn plain(path: &Path) -> Option<&str> {
    path.to_str().filter(|p| p.bytes().all(is_plain))
}

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"/._-+,=@:".contains(&b)
}
