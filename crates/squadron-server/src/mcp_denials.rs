//! MCP authorization checks this node answered with 403 / PERMISSION_DENIED, per project: the
//! release evidence's "unauthorized MCP requests". Node-local, like every request counter:
//! `squadron evidence` asks each node and adds the counts up.
//!
//! The counts outlive the process (issue 20): saved to `{data_dir}/mcp-denials.json` when they
//! changed, every [`MCP_DENIALS_SAVE_MS`], and read back at start, so a restarted node still
//! reports the denials it answered before.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use squadron_core::ids::{ProjectId, TenantId};
use tokio::sync::watch;

/// Projects counted separately; denials of further projects count in the total only.
pub const MCP_DENIAL_PROJECTS_MAX: usize = 100_000;
/// How often changed counts are saved (a kill -9 loses at most this much of them).
pub const MCP_DENIALS_SAVE_MS: u64 = 1_000;
/// The file they are saved in, below the node's data directory.
pub const MCP_DENIALS_FILE_NAME: &str = "mcp-denials.json";
/// Largest saved file read back.
const MCP_DENIALS_FILE_BYTES_MAX: u64 = 32 * 1024 * 1024;

/// The counts as saved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedDenials {
    pub total: u64,
    pub by_project: Vec<(TenantId, ProjectId, u64)>,
}

#[derive(Debug, Default)]
pub struct McpDenials {
    total: AtomicU64,
    by_project: Mutex<BTreeMap<(TenantId, ProjectId), u64>>,
}

impl McpDenials {
    pub fn record(&self, tenant: &TenantId, project: &ProjectId) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut map = self
            .by_project
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (tenant.clone(), project.clone());
        if let Some(n) = map.get_mut(&key) {
            *n += 1;
        } else if map.len() < MCP_DENIAL_PROJECTS_MAX {
            map.insert(key, 1);
        }
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// The counts now, as saved.
    pub fn saved(&self) -> SavedDenials {
        let map = self
            .by_project
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        SavedDenials {
            total: self.total(),
            by_project: map
                .iter()
                .map(|((t, p), n)| (t.clone(), p.clone(), *n))
                .collect(),
        }
    }

    /// Counts that go on from what an earlier life of the node saved.
    pub fn restored(saved: SavedDenials) -> McpDenials {
        McpDenials {
            total: AtomicU64::new(saved.total),
            by_project: Mutex::new(
                saved
                    .by_project
                    .into_iter()
                    .take(MCP_DENIAL_PROJECTS_MAX)
                    .map(|(t, p, n)| ((t, p), n))
                    .collect(),
            ),
        }
    }

    pub fn of(&self, tenant: &TenantId, project: &ProjectId) -> u64 {
        let map = self
            .by_project
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.get(&(tenant.clone(), project.clone()))
            .copied()
            .unwrap_or(0)
    }
}

fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join(MCP_DENIALS_FILE_NAME)
}

/// What an earlier life of the node saved in `data_dir`; nothing without a file. A file that
/// cannot be read or parsed is an error naming it: counts that silently restart from zero
/// would hide denials from the release evidence.
pub fn load(data_dir: &Path) -> Result<SavedDenials, String> {
    let path = path_in(data_dir);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(SavedDenials::default()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut bytes = Vec::new();
    file.take(MCP_DENIALS_FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > MCP_DENIALS_FILE_BYTES_MAX {
        return Err(format!(
            "{}: larger than {MCP_DENIALS_FILE_BYTES_MAX} bytes",
            path.display()
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        format!(
            "{}: {e} (remove the file to count MCP denials from zero again)",
            path.display()
        )
    })
}

fn save(data_dir: &Path, saved: &SavedDenials) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(saved).map_err(std::io::Error::other)?;
    let mut file = atomic_write_file::AtomicWriteFile::open(path_in(data_dir))?;
    file.write_all(&bytes)?;
    file.commit()
}

/// Saves the node's counts whenever they changed, until shutdown, and once more then.
pub fn spawn_saver(
    node: std::sync::Arc<crate::node::ControlNode>,
    data_dir: PathBuf,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = node.counters.mcp_denials.saved();
        let mut ticks = tokio::time::interval(Duration::from_millis(MCP_DENIALS_SAVE_MS));
        loop {
            let stopping = tokio::select! {
                _ = shutdown.changed() => true,
                _ = ticks.tick() => false,
            };
            let now = node.counters.mcp_denials.saved();
            if now != last {
                let (dir, saved) = (data_dir.clone(), now.clone());
                match tokio::task::spawn_blocking(move || save(&dir, &saved)).await {
                    Ok(Ok(())) => last = now,
                    Ok(Err(e)) => tracing::warn!(error = %e, "cannot save the MCP denial counts"),
                    Err(e) => tracing::warn!(error = %e, "the MCP denial save did not finish"),
                }
            }
            if stopping {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_are_counted_per_project_and_in_total() {
        let d = McpDenials::default();
        let (t, p, q) = (
            TenantId::new("t").unwrap(),
            ProjectId::new("p").unwrap(),
            ProjectId::new("q").unwrap(),
        );
        d.record(&t, &p);
        d.record(&t, &p);
        d.record(&t, &q);
        assert_eq!(d.of(&t, &p), 2);
        assert_eq!(d.of(&t, &q), 1);
        assert_eq!(d.total(), 3);
    }

    #[test]
    fn counts_saved_are_counts_restored_and_a_damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), SavedDenials::default());
        let d = McpDenials::default();
        let (t, p) = (TenantId::new("t").unwrap(), ProjectId::new("p").unwrap());
        d.record(&t, &p);
        d.record(&t, &p);
        save(dir.path(), &d.saved()).unwrap();
        let back = McpDenials::restored(load(dir.path()).unwrap());
        assert_eq!((back.of(&t, &p), back.total()), (2, 2));
        back.record(&t, &p);
        assert_eq!(back.of(&t, &p), 3, "a restored count goes on");
        std::fs::write(path_in(dir.path()), b"[").unwrap();
        let err = load(dir.path()).unwrap_err();
        assert!(err.contains(MCP_DENIALS_FILE_NAME), "{err}");
    }
}
