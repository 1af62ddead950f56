//! Task manifests: the YAML or JSON a user submits, and the validated [`TaskSpec`] the state
//! machine stores.
//!
//! Two layers. The private `Raw*` structs (`raw`) mirror the document (unknown fields refused,
//! paths tracked by `serde_path_to_error`); converting them yields a typed `TaskSpec` (`spec`)
//! with durations in milliseconds, sizes in bytes and ids as newtypes. `TaskSpec` is encoded
//! into the Raft log with bincode's serde mode, so it uses only externally tagged enums,
//! `Option`, `Vec` and `BTreeMap`. Every semantic rule lives in [`TaskSpec::validate`]
//! (`validate`, one check per section, built from the field checks in `checks`), which the
//! parser (`parse`) also runs, so a spec decoded from the log is held to exactly the rules a
//! fresh submission is.

mod checks;
mod keywords;
mod parse;
mod raw;
mod spec;
mod validate;
mod yaml_budget;

#[cfg(test)]
mod tests;

pub use checks::check_repo_url;
pub use keywords::{
    FailureAction, Keyword, NetworkMode, RuntimeKind, StartupTrigger, TaskPriority,
};
pub use parse::{parse_manifest_json, parse_manifest_yaml};
pub use raw::TaskManifest;
pub use spec::{
    AgentSpec, CredentialRef, LifecycleSpec, ObservationSpec, Placement, ProbeSpec, ReadinessSpec,
    RepositorySpec, RetryPolicy, RetrySpec, SandboxSpec, SessionSpec, StartupProfileSpec, TaskSpec,
    PROBES,
};
pub use validate::check_credential_refs;

/// `startup_profile.observation.redaction_profile`: the leased credentials' values are
/// replaced in every output.
pub const REDACTION_PROFILE_VALUES: &str = "credentials";
/// The values, and the shapes of well-known secrets (API keys, tokens, private keys)
/// wherever they occur.
pub const REDACTION_PROFILE_SHAPES: &str = "provider-secrets-v1";
/// Every redaction profile a manifest may name.
pub const REDACTION_PROFILES: [&str; 2] = [REDACTION_PROFILE_VALUES, REDACTION_PROFILE_SHAPES];

/// `startup_profile.observation.retention_class`: how long a worker keeps a task's outputs
/// (logs, events, artifacts, its clone) after it ended; each worker sets the age of each class
/// (`squadron worker --output-retention`). The class of a task without a startup profile.
pub const RETENTION_CLASS_STANDARD: &str = "standard";
/// Kept briefly.
pub const RETENTION_CLASS_SHORT: &str = "short";
/// Kept briefly, for outputs made with credentials at hand (the seed's name).
pub const RETENTION_CLASS_CREDENTIALED_SHORT: &str = "credentialed-short";
/// Every retention class a manifest may name.
pub const RETENTION_CLASSES: [&str; 3] = [
    RETENTION_CLASS_STANDARD,
    RETENTION_CLASS_SHORT,
    RETENTION_CLASS_CREDENTIALED_SHORT,
];

/// The only manifest `version` this core reads.
pub const MANIFEST_VERSION: &str = "1";
/// The only manifest `kind` this core reads.
pub const MANIFEST_KIND: &str = "Task";
/// The label whose value sets [`TaskSpec::priority`].
pub const PRIORITY_LABEL: &str = "priority";
