//! Every bound the core enforces, in one place. Units come last in the name.

/// Longest name accepted for tenants, projects, profile keys, workers and credentials.
pub const NAME_BYTES_MAX: usize = 63;
/// Longest idempotency key.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 128;

/// Profiles a project may hold unless it asks for fewer (INV-2).
pub const PROFILES_PER_PROJECT_DEFAULT: u32 = 8;
/// Largest `max_profiles` a project may ask for.
pub const PROFILES_PER_PROJECT_MAX: u32 = 64;
/// Slot-holding leases a project admits unless it asks for fewer (INV-5).
pub const ACTIVE_LEASES_PER_PROJECT_DEFAULT: u32 = 4;
/// Largest `max_active` a project may ask for.
pub const ACTIVE_LEASES_PER_PROJECT_MAX: u32 = 64;

/// Entries in one profile's provider priority list.
pub const PROVIDERS_PER_PROFILE_MAX: usize = 4;
/// Shortest lease TTL: shorter would expire between two heartbeats of a healthy agent.
pub const LEASE_TTL_MS_MIN: u64 = 1_000;
/// Longest lease TTL: a crashed holder blocks its profile at most this long.
pub const LEASE_TTL_MS_MAX: u64 = 600_000;
/// Terminal leases kept per profile for audit; older ones are pruned.
pub const TERMINAL_LEASES_PER_PROFILE_KEPT: usize = 16;
/// Leases renewed by one batched renewal command.
pub const RENEWALS_PER_BATCH_MAX: usize = 4_096;
/// Most commands in one `Command::Batch` (one log entry).
pub const COMMANDS_PER_BATCH_MAX: usize = 1_024;
/// Length of a process descriptor or cgroup reference.
pub const DESCRIPTOR_BYTES_MAX: usize = 512;

/// Capsule schema versions this core can verify.
pub const CAPSULE_SCHEMA_VERSION_CURRENT: u32 = 1;
/// Canonical size of one capsule payload.
pub const CAPSULE_PAYLOAD_BYTES_MAX: usize = 256 * 1024;
/// Items in a capsule's decisions or pending-work lists.
pub const CAPSULE_LIST_ITEMS_MAX: usize = 1_024;
/// Capsules kept per profile (the chain head is always kept).
pub const CAPSULES_PER_PROFILE_KEPT: usize = 16;

/// Unacknowledged messages one mailbox holds.
pub const MAILBOX_MESSAGES_MAX: usize = 1_024;
/// Size of one mailbox message body.
pub const MESSAGE_BODY_BYTES_MAX: usize = 16 * 1024;
/// Roster revisions kept per project for delta queries.
pub const ROSTER_REVISIONS_KEPT: usize = 64;

/// Required skills or MCP servers in one capability manifest.
pub const CAPABILITY_ENTRIES_MAX: usize = 256;
/// Relation tuples in the whole authorization store.
pub const RELATION_TUPLES_MAX: usize = 1_000_000;

/// Tasks in the PENDING queue; submission beyond this is refused.
pub const PENDING_TASKS_MAX: usize = 100_000;
/// Attempts of one task (first run plus re-queues after a lost worker).
pub const TASK_ATTEMPTS_MAX: u32 = 3;
/// Length of an error message recorded on a task.
pub const TASK_ERROR_BYTES_MAX: usize = 4 * 1024;
/// Artifact names recorded on one task.
pub const TASK_ARTIFACTS_MAX: usize = 1_024;
/// Assignments in one scheduling command.
pub const ASSIGNMENTS_PER_BATCH_MAX: usize = 1_024;

/// Tasks one worker may run at once.
pub const WORKER_CAPACITY_MAX: u32 = 1_024;
/// Labels on a worker or in a manifest's metadata.
pub const LABELS_MAX: usize = 64;
/// Heartbeat interval a worker may declare; it is lost after three silent intervals.
pub const WORKER_HEARTBEAT_INTERVAL_MS_MIN: u64 = 100;
pub const WORKER_HEARTBEAT_INTERVAL_MS_MAX: u64 = 600_000;
/// Heartbeats a worker may miss before it is lost.
pub const WORKER_MISSED_HEARTBEATS_MAX: u64 = 3;
/// Length of an operator name or a free-text reason.
pub const REASON_BYTES_MAX: usize = 1_024;
/// Length of an artifact name.
pub const ARTIFACT_NAME_BYTES_MAX: usize = 256;
/// Length of a worker's advertised address.
pub const ADDRESS_BYTES_MAX: usize = 256;

/// Idempotency records kept; the oldest go first.
pub const IDEMPOTENCY_RECORDS_MAX: usize = 100_000;
/// Age after which an idempotency record may be pruned.
pub const IDEMPOTENCY_RETENTION_MS: u64 = 24 * 60 * 60 * 1_000;

// Task manifests. Durations in milliseconds, sizes in bytes; defaults follow the lifecycle
// seed's timeout and retry tables.

/// Size of a manifest as submitted, checked before it is parsed.
pub const MANIFEST_BYTES_MAX: usize = 512 * 1024;
/// Nodes a YAML manifest may expand to with its aliases followed, at the least. The budget is
/// this or the document's length in bytes, whichever is larger: every node takes at least a
/// byte, so only aliases can exceed it.
pub const MANIFEST_YAML_NODES_MIN: usize = 10_000;
/// Nesting of a YAML manifest, in collections; a valid manifest nests at most 5.
pub const MANIFEST_YAML_DEPTH_MAX: usize = 32;
/// Length of `metadata.name`.
pub const TASK_NAME_BYTES_MAX: usize = 256;
/// Length of a label key.
pub const LABEL_KEY_BYTES_MAX: usize = 63;
/// Length of a label value.
pub const LABEL_VALUE_BYTES_MAX: usize = 256;
/// Length of `repository.url`.
pub const REPO_URL_BYTES_MAX: usize = 2_048;
/// Length of `repository.branch`; git refuses longer ref names on common file systems.
pub const GIT_BRANCH_BYTES_MAX: usize = 255;
/// Shortest abbreviated commit id git resolves by default.
pub const GIT_COMMIT_DIGITS_MIN: usize = 7;
/// Longest commit id (SHA-256 object format).
pub const GIT_COMMIT_DIGITS_MAX: usize = 64;
/// Length of `repository.subpath`.
pub const REPO_SUBPATH_BYTES_MAX: usize = 1_024;
/// Length of the agent prompt.
pub const PROMPT_BYTES_MAX: usize = 256 * 1024;
/// Length of `agent.model`.
pub const MODEL_BYTES_MAX: usize = 128;
/// Smallest `agent.max_turns`.
pub const AGENT_TURNS_MIN: u32 = 1;
/// Largest `agent.max_turns`.
pub const AGENT_TURNS_MAX: u32 = 10_000;
/// Entries in `agent.allowed_tools`.
pub const ALLOWED_TOOLS_MAX: usize = 64;
/// Length of one allowed tool name.
pub const TOOL_NAME_BYTES_MAX: usize = 128;
/// Length of `agent.script` for the script provider.
pub const SCRIPT_BYTES_MAX: usize = 64 * 1024;
/// Smallest `vm.cpus`.
pub const SANDBOX_CPUS_MIN: u32 = 1;
/// Largest `vm.cpus`.
pub const SANDBOX_CPUS_MAX: u32 = 256;
/// Smallest `vm.memory`.
pub const SANDBOX_MEMORY_BYTES_MIN: u64 = 16 << 20;
/// Largest `vm.memory`.
pub const SANDBOX_MEMORY_BYTES_MAX: u64 = 1 << 40;
/// Smallest `vm.disk`: the task directory's quota, which a small task may keep small.
pub const SANDBOX_DISK_BYTES_MIN: u64 = 16 << 20;
/// Largest `vm.disk`.
pub const SANDBOX_DISK_BYTES_MAX: u64 = 16 << 40;
/// Entries in `startup_profile.credential_refs`.
pub const CREDENTIAL_REFS_MAX: usize = 32;
/// Entries in `startup_profile.readiness.probes`.
pub const READINESS_PROBES_MAX: usize = 32;
/// Length of `startup_profile.session.workdir`.
pub const WORKDIR_BYTES_MAX: usize = 1_024;
/// Narrowest session terminal.
pub const TERMINAL_COLS_MIN: u16 = 20;
/// Widest session terminal.
pub const TERMINAL_COLS_MAX: u16 = 1_000;
/// Shortest session terminal.
pub const TERMINAL_ROWS_MIN: u16 = 5;
/// Tallest session terminal.
pub const TERMINAL_ROWS_MAX: u16 = 1_000;

/// `lifecycle.timeout` when omitted: the whole task.
pub const TASK_TIMEOUT_MS_DEFAULT: u64 = 24 * 60 * 60 * 1_000;
/// Shortest `lifecycle.timeout`.
pub const TASK_TIMEOUT_MS_MIN: u64 = 1_000;
/// Longest `lifecycle.timeout`.
pub const TASK_TIMEOUT_MS_MAX: u64 = 7 * 24 * 60 * 60 * 1_000;
/// `lifecycle.stage_timeout` when omitted.
pub const STAGE_TIMEOUT_MS_DEFAULT: u64 = 15 * 60 * 1_000;
/// Shortest `lifecycle.stage_timeout`.
pub const STAGE_TIMEOUT_MS_MIN: u64 = 1_000;
/// Longest `lifecycle.stage_timeout`.
pub const STAGE_TIMEOUT_MS_MAX: u64 = 24 * 60 * 60 * 1_000;
/// `lifecycle.provision_timeout` when omitted.
pub const PROVISION_TIMEOUT_MS_DEFAULT: u64 = 10 * 60 * 1_000;
/// Shortest `lifecycle.provision_timeout`.
pub const PROVISION_TIMEOUT_MS_MIN: u64 = 1_000;
/// Longest `lifecycle.provision_timeout`.
pub const PROVISION_TIMEOUT_MS_MAX: u64 = 24 * 60 * 60 * 1_000;
/// `lifecycle.hang_timeout` when omitted: this long without output counts as a hang.
pub const HANG_TIMEOUT_MS_DEFAULT: u64 = 30 * 60 * 1_000;
/// Shortest `lifecycle.hang_timeout`.
pub const HANG_TIMEOUT_MS_MIN: u64 = 1_000;
/// Longest `lifecycle.hang_timeout`.
pub const HANG_TIMEOUT_MS_MAX: u64 = 7 * 24 * 60 * 60 * 1_000;
/// `lifecycle.cancel_grace` when omitted: SIGTERM to SIGKILL.
pub const CANCEL_GRACE_MS_DEFAULT: u64 = 30 * 1_000;
/// Longest `lifecycle.cancel_grace` (the shortest is zero).
pub const CANCEL_GRACE_MS_MAX: u64 = 60 * 60 * 1_000;
/// Entries in `lifecycle.artifact_patterns`.
pub const ARTIFACT_PATTERNS_MAX: usize = 64;
/// Length of one artifact pattern.
pub const ARTIFACT_PATTERN_BYTES_MAX: usize = 256;
/// Entries in `lifecycle.success_exit_codes`.
pub const SUCCESS_EXIT_CODES_MAX: usize = 32;
/// Largest process exit code (the smallest is zero).
pub const EXIT_CODE_MAX: i32 = 255;
/// Largest `max` of one retry policy.
pub const RETRIES_MAX: u32 = 100;
/// Entries in one retry policy's `backoff`.
pub const RETRY_BACKOFF_ENTRIES_MAX: usize = 16;
/// Longest single backoff delay.
pub const RETRY_BACKOFF_MS_MAX: u64 = 60 * 60 * 1_000;
/// Git clone retries when omitted.
pub const CLONE_RETRIES_DEFAULT: u32 = 3;
/// Git clone backoff when omitted.
pub const CLONE_BACKOFF_MS_DEFAULT: [u64; 3] = [5_000, 10_000, 20_000];
/// Sandbox provision retries when omitted.
pub const PROVISION_RETRIES_DEFAULT: u32 = 2;
/// Sandbox provision backoff when omitted.
pub const PROVISION_BACKOFF_MS_DEFAULT: [u64; 2] = [10_000, 30_000];
/// Agent connect retries when omitted: with 2s apart, about five minutes.
pub const AGENT_CONNECT_RETRIES_DEFAULT: u32 = 30;
/// Agent connect backoff when omitted.
pub const AGENT_CONNECT_BACKOFF_MS_DEFAULT: [u64; 1] = [2_000];

// --- the trust boundary (DESIGN §5) ---------------------------------------------------------

/// Operator tokens the state holds, revoked and expired ones included until pruned.
pub const OPERATOR_TOKENS_MAX: usize = 10_000;
/// Bootstrap tokens the state holds, used and expired ones included until pruned.
pub const BOOTSTRAP_TOKENS_MAX: usize = 10_000;
/// Shortest life of a bootstrap token: shorter could expire before the worker is started.
pub const BOOTSTRAP_TOKEN_TTL_MS_MIN: u64 = 10_000;
/// Longest life of a bootstrap token: enrollment material should not lie around.
pub const BOOTSTRAP_TOKEN_TTL_MS_MAX: u64 = 24 * 3_600 * 1_000;
/// Longest life of the token a worker mints for a sandbox's agent: the sandbox's
/// provisioning, which is all the agent has to enroll (it starts at once).
pub const AGENT_TOKEN_TTL_MS_MAX: u64 = 3_600 * 1_000;
/// Certificate records the state holds (each worker renews about once a day; expired ones
/// are pruned).
pub const CERTIFICATES_MAX: usize = 100_000;
/// Longest validity of a certificate issued to an enrolled identity.
pub const CERT_VALIDITY_MS_MAX: u64 = 7 * 24 * 3_600 * 1_000;
/// How far a certificate's expiry, made from the signing node's clock, may run past the
/// leader's clock plus the longest validity.
pub const CERT_CLOCK_SKEW_MS_MAX: u64 = 10 * 60 * 1_000;
/// Length of a token's name.
pub const TOKEN_NAME_BYTES_MAX: usize = 128;
/// Entries in one token's scope.
pub const TOKEN_SCOPE_ENTRIES_MAX: usize = 64;
/// How long revoked or expired tokens and certificates, and used bootstrap tokens, stay
/// listed before the sweep prunes them.
pub const ACCESS_RECORD_RETENTION_MS: u64 = 7 * 24 * 3_600 * 1_000;
/// Audit records kept; older ones are pruned first.
pub const AUDIT_RECORDS_KEPT: usize = 10_000;
/// Child tasks one task may submit.
pub const CHILD_TASKS_PER_TASK_MAX: usize = 1_000;
/// Length of a revocation reason.
pub const REVOCATION_REASON_BYTES_MAX: usize = 512;

// --- credentials (INV-13) ---------------------------------------------------------------------

/// Credentials the state holds, revoked ones included.
pub const CREDENTIALS_MAX: usize = 10_000;
/// Largest secret value, before sealing (an API key, a token, a small key file).
pub const CREDENTIAL_VALUE_BYTES_MAX: usize = 64 * 1024;
/// Largest sealed value the state accepts: the value plus the AEAD's nonce and tag.
pub const CREDENTIAL_SEALED_BYTES_MAX: usize = CREDENTIAL_VALUE_BYTES_MAX + 64;
/// Length of a credential's description.
pub const CREDENTIAL_DESCRIPTION_BYTES_MAX: usize = 256;
/// Length of an egress binding's upstream URL.
pub const EGRESS_UPSTREAM_BYTES_MAX: usize = 512;
/// Length of the header name an egress binding puts its value in.
pub const EGRESS_HEADER_BYTES_MAX: usize = 64;
/// Length of the text an egress binding puts in front of its value (`Bearer `).
pub const EGRESS_VALUE_PREFIX_BYTES_MAX: usize = 32;
/// Credential leases the state holds, revoked ones included until pruned.
pub const CREDENTIAL_LEASES_MAX: usize = 100_000;
/// How long a revoked credential lease stays listed before the sweep prunes it.
pub const CREDENTIAL_LEASE_RETENTION_MS: u64 = 24 * 3_600 * 1_000;

/// Most tasks one `PruneTasks` command prunes, so its apply stays short (DESIGN §7: apply p99
/// ≤ 1 ms); the leader proposes another while more are due.
pub const TASKS_PRUNED_PER_COMMAND_MAX: u64 = 1_000;
