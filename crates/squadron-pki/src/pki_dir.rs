//! Where trust material lives on disk: `{data_dir}/pki/`. Private keys and tokens are 0600,
//! written atomically (temp file, fsync, rename, fsync of the directory), so a crash never
//! leaves half a key.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt};
use std::path::{Path, PathBuf};

use atomic_write_file::unix::OpenOptionsExt;
use atomic_write_file::AtomicWriteFile;

use crate::error::PkiError;
use crate::issued_cert::IssuedCert;

/// Largest trust file read (a PEM chain is a few KiB).
pub const PKI_FILE_BYTES_MAX: u64 = 256 * 1024;
/// Mode of private keys and tokens.
pub const SECRET_FILE_MODE: u32 = 0o600;
/// Mode of certificates.
pub const PUBLIC_FILE_MODE: u32 = 0o644;

/// The `pki/` folder of a data directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PkiDir {
    dir: PathBuf,
}

impl PkiDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        PkiDir { dir: dir.into() }
    }

    /// `{data_dir}/pki`.
    pub fn of_data_dir(data_dir: &Path) -> Self {
        PkiDir::new(data_dir.join("pki"))
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    /// `{name}.pem` and `{name}.key`: `node`, `worker`, `agent`.
    pub fn cert(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pem"))
    }

    pub fn key(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.key"))
    }

    pub fn has_ca_key(&self) -> bool {
        self.ca_key().exists()
    }

    /// Writes a certificate, its key and the CA certificate.
    pub fn write_identity(&self, name: &str, cert: &IssuedCert) -> Result<(), PkiError> {
        self.ensure()?;
        write_file(&self.ca_cert(), cert.ca_pem.as_bytes(), PUBLIC_FILE_MODE)?;
        write_file(&self.key(name), cert.key_pem().as_bytes(), SECRET_FILE_MODE)?;
        write_file(&self.cert(name), cert.cert_pem.as_bytes(), PUBLIC_FILE_MODE)
    }

    pub fn read_identity(&self, name: &str) -> Result<IssuedCert, PkiError> {
        Ok(IssuedCert::new(
            read_file(&self.cert(name))?,
            read_secret_file(&self.key(name))?,
            &read_file(&self.ca_cert())?,
        ))
    }

    pub fn write_ca(&self, cert_pem: &str, key_pem: &str) -> Result<(), PkiError> {
        self.ensure()?;
        write_file(&self.ca_key(), key_pem.as_bytes(), SECRET_FILE_MODE)?;
        write_file(&self.ca_cert(), cert_pem.as_bytes(), PUBLIC_FILE_MODE)
    }

    fn ensure(&self) -> Result<(), PkiError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| PkiError::io(&self.dir, e))?;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| PkiError::io(&self.dir, e))
    }
}

/// Durable atomic write with a mode set before the file becomes visible.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), PkiError> {
    let mut options = AtomicWriteFile::options();
    options.mode(mode).preserve_mode(false);
    let mut file = options.open(path).map_err(|e| PkiError::io(path, e))?;
    file.write_all(bytes).map_err(|e| PkiError::io(path, e))?;
    file.commit().map_err(|e| PkiError::io(path, e))
}

/// Reads a trust file, bounded.
pub fn read_file(path: &Path) -> Result<String, PkiError> {
    let meta = std::fs::metadata(path).map_err(|e| PkiError::io(path, e))?;
    if meta.len() > PKI_FILE_BYTES_MAX {
        return Err(PkiError::File {
            path: path.into(),
            why: format!("larger than {PKI_FILE_BYTES_MAX} bytes"),
        });
    }
    std::fs::read_to_string(path).map_err(|e| PkiError::io(path, e))
}

/// Reads a key or token, refusing one that others can read: a secret left world-readable is
/// a secret already leaked.
pub fn read_secret_file(path: &Path) -> Result<String, PkiError> {
    let meta = std::fs::metadata(path).map_err(|e| PkiError::io(path, e))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(PkiError::File {
            path: path.into(),
            why: format!(
                "mode {:o} lets others read it; chmod 600 it",
                meta.permissions().mode() & 0o777
            ),
        });
    }
    read_file(path)
}
