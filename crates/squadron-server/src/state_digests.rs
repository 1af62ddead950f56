//! The state digest a status answer carries (INV-12), computed off the async runtime, one at
//! a time, and reused while the applied index has not moved. Encoding and hashing the state
//! costs as much as a snapshot (about half a second of a core at a million tasks); done on a
//! runtime thread for every status request, a poller calling every 100 ms starved the node's
//! heartbeats until its followers held elections.

use squadron_store::StateReader;
use tokio::sync::Mutex;

/// The last digest computed and the applied index it describes.
#[derive(Debug, Default)]
pub struct StateDigests {
    last: Mutex<Option<(Option<u64>, String)>>,
}

impl StateDigests {
    /// The digest of the state at its applied index, with that index. Callers queue here, so
    /// at most one digest is computed at a time; one that finds the index unchanged since the
    /// last reuses it.
    pub async fn current(&self, reader: &StateReader) -> (Option<u64>, String) {
        let mut last = self.last.lock().await;
        let applied = reader.last_applied().map(|l| l.index);
        if let Some(cached) = last.as_ref().filter(|(index, _)| *index == applied) {
            return cached.clone();
        }
        let reader = reader.clone();
        let computed = tokio::task::spawn_blocking(move || {
            // The index and the copy are taken together, so the digest describes that index;
            // the copy is cheap (tasks are shared) and the hashing runs outside the lock.
            let (index, state) =
                reader.with_data(|d| (d.last_applied.map(|l| l.index), d.state.clone()));
            (
                index,
                squadron_core::snapshot::state_digest(&state).to_hex(),
            )
        })
        .await;
        match computed {
            Ok(fresh) => {
                *last = Some(fresh.clone());
                fresh
            }
            // The blocking pool refused or the hashing panicked: an empty digest, not a
            // guess; the next request tries again.
            Err(e) => {
                tracing::error!(error = %e, "computing the state digest failed");
                (applied, String::new())
            }
        }
    }
}
