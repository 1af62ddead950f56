//! A task attempt's credentials (INV-13): a tmpfs of its own on the worker,
//! `{data_dir}/credentials/{session}`, bound read-only into the sandbox at
//! `/run/squadron/credentials/{session}`. The worker mounts it empty at provisioning (so a
//! container can be created with the bind), fills it from the lease grant just before the
//! provider starts (one 0400 file per mount, owned by the sandbox user), and wipes it when
//! the attempt ends — and, after a restart, every session a previous life left.
//!
//! The values stay in the worker's memory only while the attempt runs, for one purpose: the
//! progress logs and artifacts are rewritten with `[REDACTED:cred_id]` in their place before
//! the values are dropped.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read as _, Seek as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use squadron_client::CredentialLeaseGrant;
use squadron_core::credential::session_name;
use squadron_core::ids::TaskId;
use squadron_core::manifest::{CredentialRef, TaskSpec};
use squadron_isolation::beneath::{Beneath, EntryKind};
use squadron_isolation::secret_tmpfs::{
    mount_secret_tmpfs, wipe_secret_tmpfs, SECRET_TMPFS_BYTES_DEFAULT,
};
use zeroize::Zeroizing;

use crate::error::WorkerError;
use crate::task::secret_shapes;
use crate::task::task_dir::{TaskDir, ARTIFACTS, EVENTS_LOG, STDERR_LOG, STDOUT_LOG};

/// Where sessions live under the worker's data directory.
pub(crate) const CREDENTIALS_DIR: &str = "credentials";
/// Where a session appears inside the sandbox.
pub(crate) const SANDBOX_CREDENTIALS_ROOT: &str = "/run/squadron/credentials";
/// Mode of a credential file: its owner (the sandbox user) reads it, nobody else.
pub(crate) const CREDENTIAL_FILE_MODE: u32 = 0o400;
/// Largest file rewritten by redaction; larger ones are left as they are (and say so).
pub(crate) const REDACTED_FILE_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Files under `artifacts/` redaction visits, at most.
pub(crate) const REDACTED_ARTIFACTS_MAX: usize = 10_000;

/// The session of one attempt whose manifest names credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CredentialSession {
    host: PathBuf,
    sandbox: String,
    refs: Vec<CredentialRef>,
}

impl CredentialSession {
    /// `None` when the manifest names no credentials.
    pub(crate) fn of(data_dir: &Path, task: TaskId, attempt: u32, spec: &TaskSpec) -> Option<Self> {
        let refs = spec.startup_profile.as_ref()?.credential_refs.clone();
        if refs.is_empty() {
            return None;
        }
        let session = session_name(task, attempt);
        Some(CredentialSession::at(
            data_dir.join(CREDENTIALS_DIR).join(&session),
            &session,
            refs,
        ))
    }

    /// A session whose tmpfs is `host` on the worker, shown at
    /// `/run/squadron/credentials/{session}` inside.
    pub(crate) fn at(host: PathBuf, session: &str, refs: Vec<CredentialRef>) -> Self {
        CredentialSession {
            host,
            sandbox: format!("{SANDBOX_CREDENTIALS_ROOT}/{session}"),
            refs,
        }
    }

    pub(crate) fn host_dir(&self) -> &Path {
        &self.host
    }

    pub(crate) fn sandbox_dir(&self) -> &str {
        &self.sandbox
    }

    /// `{MOUNT}_FILE` → the file's path inside the sandbox, for each reference: paths only,
    /// so they may travel on command lines and in container configs.
    pub(crate) fn env(&self) -> BTreeMap<String, String> {
        self.refs
            .iter()
            .map(|r| {
                (
                    file_variable(&r.mount),
                    format!("{}/{}", self.sandbox, r.mount),
                )
            })
            .collect()
    }

    /// Mounts the empty tmpfs (again, after a restart: idempotent).
    pub(crate) fn prepare(&self) -> Result<(), WorkerError> {
        mount_secret_tmpfs(&self.host, SECRET_TMPFS_BYTES_DEFAULT).map_err(credentials_error)
    }

    /// Writes each granted value into its file for `owner`, and returns what redaction needs.
    pub(crate) fn fill(
        &self,
        grant: &CredentialLeaseGrant,
        owner: (u32, u32),
    ) -> Result<Redactor, WorkerError> {
        self.prepare()?;
        let redactor = Redactor::of_grant(grant);
        for value in &grant.credentials {
            if !self.refs.iter().any(|r| r.mount == value.mount) {
                return Err(WorkerError::Invalid {
                    field: "credential lease".into(),
                    message: format!(
                        "the grant names mount {:?} the manifest does not",
                        value.mount
                    ),
                });
            }
            // Injected at egress: the value stays in the worker's memory, never in a file.
            if value.egress.is_some() {
                continue;
            }
            let path = self.host.join(&value.mount);
            write_private(&path, value.value.as_bytes(), owner)?;
        }
        std::os::unix::fs::chown(&self.host, Some(owner.0), Some(owner.1))
            .map_err(|e| WorkerError::io("chown", &self.host, e))?;
        std::fs::set_permissions(&self.host, std::fs::Permissions::from_mode(0o500))
            .map_err(|e| WorkerError::io("chmod", &self.host, e))?;
        Ok(redactor)
    }

    /// Drops the files and the tmpfs.
    pub(crate) fn wipe(&self) -> Result<(), WorkerError> {
        wipe_secret_tmpfs(&self.host).map_err(credentials_error)
    }

    /// Wipes every session under `data_dir` (a previous life's): values never outlive the
    /// worker that held them. Returns the sessions wiped.
    pub(crate) fn sweep(data_dir: &Path) -> Vec<String> {
        let root = data_dir.join(CREDENTIALS_DIR);
        let Ok(entries) = std::fs::read_dir(&root) else {
            return Vec::new();
        };
        let mut wiped = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            match wipe_secret_tmpfs(&path) {
                Ok(()) => wiped.push(entry.file_name().to_string_lossy().into_owned()),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot wipe a credential session")
                }
            }
        }
        wiped
    }
}

fn credentials_error(e: squadron_isolation::IsolationError) -> WorkerError {
    WorkerError::runtime("credentials", e.to_string())
}

/// `anthropic_api_key` → `ANTHROPIC_API_KEY_FILE`.
pub(crate) fn file_variable(mount: &str) -> String {
    let name: String = mount
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{name}_FILE")
}

fn write_private(path: &Path, bytes: &[u8], owner: (u32, u32)) -> Result<(), WorkerError> {
    squadron_pki::pki_dir::write_file(path, bytes, CREDENTIAL_FILE_MODE).map_err(|e| {
        WorkerError::runtime("credentials", format!("writing {}: {e}", path.display()))
    })?;
    std::os::unix::fs::chown(path, Some(owner.0), Some(owner.1))
        .map_err(|e| WorkerError::io("chown", path, e))
}

/// Secret values and what stands in for them. Longest first, so a value that contains
/// another is replaced whole. Under `provider-secrets-v1` the shapes of well-known secrets
/// too (`secret_shapes`), after the values.
#[derive(Default)]
pub(crate) struct Redactor {
    needles: Vec<(Zeroizing<Vec<u8>>, Vec<u8>)>,
    shapes: bool,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("values", &self.needles.len())
            .field("shapes", &self.shapes)
            .finish()
    }
}

impl Redactor {
    /// Every value of a lease grant, each standing in as its credential's id.
    pub(crate) fn of_grant(grant: &CredentialLeaseGrant) -> Self {
        let mut redactor = Redactor::default();
        for value in &grant.credentials {
            redactor.add(value.value.as_bytes(), value.id.as_str());
        }
        redactor
    }

    /// Also the shapes of well-known secrets, when the manifest's redaction profile asks
    /// for them (`provider-secrets-v1`).
    pub(crate) fn with_profile(mut self, spec: &TaskSpec) -> Self {
        self.shapes = redacts_shapes(spec);
        self
    }

    /// Only the shapes of well-known secrets (tests of the shapes themselves).
    #[cfg(test)]
    pub(crate) fn shapes_only() -> Self {
        Redactor {
            shapes: true,
            ..Redactor::default()
        }
    }

    /// Whether it hides anything at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.needles.is_empty() && !self.shapes
    }

    pub(crate) fn add(&mut self, value: &[u8], id: &str) {
        if value.is_empty() {
            return;
        }
        let stand_in = format!("[REDACTED:{id}]").into_bytes();
        self.needles
            .push((Zeroizing::new(value.to_vec()), stand_in));
        self.needles
            .sort_by_key(|(v, _)| std::cmp::Reverse(v.len()));
    }

    /// `bytes` with every value (and, under `provider-secrets-v1`, every secret's shape)
    /// replaced; `None` when none occurs.
    pub(crate) fn redact(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        let spans = self.spans(bytes);
        (!spans.is_empty()).then(|| render(bytes, &spans))
    }

    /// What a reader may see of a file the provider is still writing: the raw bytes up to
    /// where nothing could still become a value or a secret's shape (or grow one), moved back
    /// to the start of a secret that would straddle it, then redacted. Everything is found
    /// on the raw bytes, so a view of a longer file extends a view of a shorter one and
    /// offsets into it stay valid — and the file rewritten at the end (`rewrite_outbox`)
    /// extends them too.
    pub(crate) fn view(&self, raw: &[u8]) -> Vec<u8> {
        let spans = self.spans(raw);
        let mut cut = self.unsettled_from(raw);
        // Spans are disjoint once merged: at most one straddles the cut.
        if let Some(straddling) = spans.iter().find(|s| s.start < cut && cut < s.end) {
            cut = straddling.start;
        }
        let settled: Vec<Span<'_>> = spans.into_iter().filter(|s| s.end <= cut).collect();
        render(&raw[..cut], &settled)
    }

    /// Every secret's span in `raw`, merged: where two overlap, the one that starts first
    /// (the longer where two start together) stands in for both, so no part of either shows.
    fn spans(&self, raw: &[u8]) -> Vec<Span<'_>> {
        let mut spans = Vec::new();
        for (needle, stand_in) in &self.needles {
            for at in memchr::memmem::find_iter(raw, needle.as_slice()) {
                spans.push(Span {
                    start: at,
                    end: at + needle.len(),
                    stand_in,
                });
            }
        }
        if self.shapes {
            let mut value_ends: Vec<usize> = spans.iter().map(|s| s.end).collect();
            value_ends.sort_unstable();
            spans.extend(
                secret_shapes::secret_spans(raw, &value_ends)
                    .into_iter()
                    .map(|(start, end)| Span {
                        start,
                        end,
                        stand_in: secret_shapes::SHAPE_STAND_IN,
                    }),
            );
        }
        spans.sort_by_key(|s| (s.start, std::cmp::Reverse(s.end)));
        let mut merged: Vec<Span<'_>> = Vec::with_capacity(spans.len());
        for span in spans {
            match merged.last_mut() {
                Some(last) if span.start < last.end => last.end = last.end.max(span.end),
                _ => merged.push(span),
            }
        }
        merged
    }

    /// The earliest offset from which the end of `raw` could still become a value (a proper
    /// prefix of one) or a secret's shape.
    fn unsettled_from(&self, raw: &[u8]) -> usize {
        let values = self
            .needles
            .iter()
            .flat_map(|(needle, _)| (1..needle.len()).map(move |k| &needle[..k]))
            .filter(|prefix| raw.ends_with(prefix))
            .map(|prefix| raw.len() - prefix.len())
            .min()
            .unwrap_or(raw.len());
        let shapes = if self.shapes {
            secret_shapes::unsettled_from(raw)
        } else {
            raw.len()
        };
        values.min(shapes)
    }

    /// Whether it holds leased values (not only the shapes).
    pub(crate) fn has_values(&self) -> bool {
        !self.needles.is_empty()
    }

    /// Rewrites the outbox's logs and artifacts in place, never following a link out of it.
    /// Returns how many files changed, and the ones it could not look at.
    pub(crate) fn rewrite_outbox(&self, dir: &TaskDir) -> (usize, Vec<String>) {
        let Ok(outbox) = dir.outbox_beneath() else {
            return (0, Vec::new());
        };
        let mut files: Vec<PathBuf> = [STDOUT_LOG, STDERR_LOG, EVENTS_LOG]
            .into_iter()
            .map(PathBuf::from)
            .collect();
        collect_files(&outbox, Path::new(ARTIFACTS), &mut files);
        self.rewrite_all(&outbox, &files)
    }

    /// Rewrites the files `rels` below `root` in place, never following a link out of it.
    /// Returns how many changed, and the ones it could not look at.
    pub(crate) fn rewrite_files(&self, root: &Path, rels: &[PathBuf]) -> (usize, Vec<String>) {
        let Ok(root) = Beneath::open(root) else {
            return (0, Vec::new());
        };
        self.rewrite_all(&root, rels)
    }

    fn rewrite_all(&self, root: &Beneath, rels: &[PathBuf]) -> (usize, Vec<String>) {
        let (mut changed, mut skipped) = (0, Vec::new());
        for rel in rels {
            match self.rewrite(root, rel) {
                Ok(true) => changed += 1,
                Ok(false) => {}
                Err(why) => skipped.push(format!("{}: {why}", rel.display())),
            }
        }
        (changed, skipped)
    }

    fn rewrite(&self, outbox: &Beneath, rel: &Path) -> Result<bool, String> {
        let mut file = match outbox.read_write(rel) {
            Ok(f) => f,
            Err(e) if e.is_missing() => return Ok(false),
            Err(e) => return Err(e.to_string()),
        };
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        if len > REDACTED_FILE_BYTES_MAX {
            return Err(format!("larger than {REDACTED_FILE_BYTES_MAX} bytes"));
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
        let Some(redacted) = self.redact(&bytes) else {
            return Ok(false);
        };
        file.rewind().map_err(|e| e.to_string())?;
        file.set_len(0).map_err(|e| e.to_string())?;
        file.write_all(&redacted).map_err(|e| e.to_string())?;
        file.sync_all().map_err(|e| e.to_string())?;
        Ok(true)
    }
}

/// A secret's place in a text, and what stands in for it.
#[derive(Debug, Clone, Copy)]
struct Span<'a> {
    start: usize,
    end: usize,
    stand_in: &'a [u8],
}

/// `raw` with each span (sorted, disjoint) replaced by its stand-in.
fn render(raw: &[u8], spans: &[Span<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut from = 0;
    for span in spans {
        out.extend_from_slice(&raw[from..span.start]);
        out.extend_from_slice(span.stand_in);
        from = span.end;
    }
    out.extend_from_slice(&raw[from..]);
    out
}

/// The redactors of the attempts running on this worker, shared by the drivers (which add one
/// before the provider starts and drop it once the files are rewritten) and the output
/// server (which serves those tasks' logs and artifacts through it meanwhile).
#[derive(Debug, Clone, Default)]
pub(crate) struct LiveRedactions(Arc<Mutex<HashMap<TaskId, Arc<Redactor>>>>);

impl LiveRedactions {
    pub(crate) fn insert(&self, task: TaskId, redactor: Arc<Redactor>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(task, redactor);
    }

    pub(crate) fn remove(&self, task: TaskId) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&task);
    }

    pub(crate) fn get(&self, task: TaskId) -> Option<Arc<Redactor>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&task)
            .cloned()
    }
}

/// Regular files below `rel` in `outbox`, depth first, bounded.
fn collect_files(outbox: &Beneath, rel: &Path, out: &mut Vec<PathBuf>) {
    let Ok(dir) = outbox.dir(rel) else {
        return;
    };
    let Ok(entries) = dir.entries() else {
        return;
    };
    for entry in entries {
        if out.len() >= REDACTED_ARTIFACTS_MAX {
            return;
        }
        let path = rel.join(&entry.name);
        match entry.kind {
            EntryKind::File => out.push(path),
            EntryKind::Dir => collect_files(outbox, &path, out),
            _ => {}
        }
    }
}

/// Whether the manifest's redaction profile hides secrets by their shape.
pub(crate) fn redacts_shapes(spec: &TaskSpec) -> bool {
    spec.startup_profile.as_ref().is_some_and(|p| {
        p.observation.redaction_profile == squadron_core::manifest::REDACTION_PROFILE_SHAPES
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_replaced_longest_first_and_variables_name_the_mount() {
        let mut r = Redactor::default();
        r.add(b"abc", "cred_short");
        r.add(b"abcdef", "cred_long");
        let out = r.redact(b"x abcdef y abc z").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "x [REDACTED:cred_long] y [REDACTED:cred_short] z"
        );
        assert!(r.redact(b"nothing here").is_none());
        // A value still being written is held back; once complete, it is replaced.
        let mut one = Redactor::default();
        one.add(b"sk-123456", "cred_a");
        assert_eq!(one.view(b"key sk-12"), b"key ");
        assert_eq!(one.view(b"key sk-12345"), b"key ");
        assert_eq!(one.view(b"key sk-123456!"), b"key [REDACTED:cred_a]!");
        assert_eq!(one.view(b"plain text"), b"plain text");
        assert_eq!(one.view(b"ends with s"), b"ends with ");
        assert_eq!(file_variable("anthropic_api_key"), "ANTHROPIC_API_KEY_FILE");
        assert_eq!(file_variable("gh-token"), "GH_TOKEN_FILE");
    }

    /// Over every prefix of a text that mixes values (one the start of another, one whose
    /// end repeats its start) and secrets' shapes: each view extends the last, the final
    /// rewrite extends every view, and no view shows any part of a secret.
    #[test]
    fn every_live_view_extends_the_last_and_shows_no_part_of_a_secret() {
        let mut r = Redactor {
            shapes: true,
            ..Redactor::default()
        };
        r.add(b"abc", "cred_short");
        r.add(b"abc def", "cred_long");
        r.add(b"xyzxy", "cred_echo");
        r.add(b"Zq9", "cred_glued");
        let key = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz";
        let pem =
            "-----BEGIN RSA PRIVATE KEY-----\\nMIIEpAIBAAKCAQEA\\n-----END RSA PRIVATE KEY-----";
        let text = format!(
            "start abc def, abc x xyzxyzxy {{\"k\":\"{key}\"}} AKIAIOSFODNN7EXAMPLE\n{pem}\n\
             Zq9sk-AbCdEfGhIjKlMnOpQrStUvWx done\nabc"
        );
        let bytes = text.as_bytes();
        let end = r.redact(bytes).unwrap_or_else(|| bytes.to_vec());
        let mut last: Vec<u8> = Vec::new();
        for len in 0..=bytes.len() {
            let view = r.view(&bytes[..len]);
            assert!(
                view.starts_with(&last),
                "prefix {len}: {view:?} after {last:?}"
            );
            assert!(
                end.starts_with(&view),
                "prefix {len}: {view:?} vs the end {end:?}"
            );
            let shown = String::from_utf8_lossy(&view);
            for part in [
                "api03-Ab", "IOSFODNN", "MIIEpAIB", "def,", "xyzxy", "Zq9", "sk-Ab",
            ] {
                assert!(!shown.contains(part), "prefix {len} shows {part}: {shown}");
            }
            last = view;
        }
        // Runs that are all starts of something cost one pass, not one per byte.
        let long = vec![b'A'; 4 << 20];
        assert!(r.view(&long).is_empty());
    }

    proptest::proptest! {
        /// Texts made of values, keys, key blocks and their pieces in any order: every view
        /// of a prefix extends the view of the shorter prefix, the rewrite of the whole
        /// extends every view, and no view shows a whole value or key.
        #[test]
        fn views_of_any_text_only_grow_and_show_no_secret(
            pieces in proptest::collection::vec(0usize..PIECES.len(), 0..40)
        ) {
            let mut r = Redactor::shapes_only();
            r.add(b"abc", "cred_short");
            r.add(b"abc def", "cred_long");
            r.add(b"Zq9", "cred_glued");
            let text: Vec<u8> = pieces.iter().flat_map(|i| PIECES[*i].bytes()).collect();
            let end = r.redact(&text).unwrap_or_else(|| text.clone());
            let mut last: Vec<u8> = Vec::new();
            for len in 0..=text.len() {
                let view = r.view(&text[..len]);
                proptest::prop_assert!(view.starts_with(&last), "prefix {}", len);
                proptest::prop_assert!(end.starts_with(&view), "prefix {}", len);
                for secret in SECRETS {
                    proptest::prop_assert!(
                        memchr::memmem::find(&view, secret.as_bytes()).is_none(),
                        "prefix {} shows {}", len, secret
                    );
                }
                last = view;
            }
        }
    }

    /// What the property's texts are made of.
    const PIECES: [&str; 16] = [
        "abc",
        "abc def",
        "Zq9",
        "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv",
        "AKIAIOSFODNN7EXAMPLE",
        "-----BEGIN RSA PRIVATE KEY-----",
        "\nMIIEpAIB\n",
        "-----END RSA PRIVATE KEY-----",
        " ",
        "\n",
        "x",
        "-",
        "sk-",
        "ab",
        "c d",
        ".",
    ];
    /// What no view may show.
    const SECRETS: [&str; 4] = [
        "abc",
        "Zq9",
        "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv",
        "AKIAIOSFODNN7EXAMPLE",
    ];
}
