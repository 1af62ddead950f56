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
/// A worker that has not heartbeated for this long is lost.
pub const WORKER_TTL_MS_DEFAULT: u64 = 90_000;
/// Length of a worker's advertised address.
pub const ADDRESS_BYTES_MAX: usize = 256;

/// Idempotency records kept; the oldest go first.
pub const IDEMPOTENCY_RECORDS_MAX: usize = 100_000;
/// Age after which an idempotency record may be pruned.
pub const IDEMPOTENCY_RETENTION_MS: u64 = 24 * 60 * 60 * 1_000;
