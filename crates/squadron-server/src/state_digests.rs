//! The state digest a status answer carries (INV-12), computed off the async runtime, one at
//! a time, and shared by every request that arrives while it is computed. Encoding and hashing
//! the state costs as much as a snapshot (about half a second of a core at a million tasks);
//! done on a runtime thread for every status request, a poller calling every 100 ms starved
//! the node's heartbeats until its followers held elections.

use std::sync::Arc;

use squadron_store::StateReader;
use tokio::sync::Mutex;

/// A digest of the state and the applied index it describes.
pub type IndexedDigest = (Option<u64>, String);

/// The last digest computed.
#[derive(Debug, Default)]
pub struct StateDigests {
    last: Arc<Mutex<Option<IndexedDigest>>>,
}

impl StateDigests {
    /// A digest of the state at or after the index applied when the call began, with the
    /// index it describes. Callers queue here, so at most one digest is computed at a time,
    /// and one that finds a digest at least as recent as its arrival takes it. The computation
    /// runs in a task of its own that fills the cache even if the caller goes away (a cancelled
    /// request must not leave it half done for the next caller to start again).
    pub async fn current(&self, reader: &StateReader) -> Result<IndexedDigest, String> {
        let arrived = reader.last_applied().map(|l| l.index);
        let mut last = self.last.clone().lock_owned().await;
        if let Some(cached) = last.as_ref().filter(|(index, _)| *index >= arrived) {
            return Ok(cached.clone());
        }
        let reader = reader.clone();
        let computation = tokio::spawn(async move {
            let fresh = tokio::task::spawn_blocking(move || digest_now(&reader))
                .await
                .map_err(|e| format!("computing the state digest failed: {e}"))?;
            *last = Some(fresh.clone());
            Ok(fresh)
        });
        computation
            .await
            .map_err(|e| format!("computing the state digest failed: {e}"))?
    }
}

/// The digest of the state now. The index and the copy are taken together under the read
/// lock, so the digest describes that index; the copy shares the large maps (persistent), and
/// the encoding and hashing run after the lock is released.
fn digest_now(reader: &StateReader) -> IndexedDigest {
    let (index, state) = reader.with_data(|d| (d.last_applied.map(|l| l.index), d.state.clone()));
    (
        index,
        squadron_core::snapshot::state_digest(&state).to_hex(),
    )
}
