//! Model-based property tests of the replicated state machine (DESIGN.md §2).
//!
//! A small reference model, written here with plain collections, is run beside the core on
//! random command sequences over a tiny universe (one tenant, one or two projects, up to six
//! profiles, two workers). After every step the test checks the core's own invariant checker,
//! that the core and the model agree on the answer and on every view the model keeps, that a
//! refused command changed nothing but the clock (and its idempotency record), and, in the
//! INV-12 test, that a second replica and snapshot round trips agree byte for byte.
//!
//! Commands are generated as abstract operations ("acquire for profile 2 with a stale
//! generation") and turned into concrete commands against the model's current view when they
//! run, so most fencing tokens, generations and chain positions are valid and some are
//! deliberately wrong.

mod generators;
mod ops;
mod reference;
mod resolve;
mod run;
mod universe;

mod capsules;
mod idempotency;
mod leases;
mod replicas;
mod tasks;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::strategy::Union;

use squadron_core::agent_session::SandboxUsage;
use squadron_core::capsule::{CapsuleDigestInput, CapsuleDraft, CapsulePayload};
use squadron_core::codec::{
    command_fingerprint, decode_command, decode_response, encode_command, encode_response,
};
use squadron_core::command::AgentCheckIn;
use squadron_core::command::{
    AcquireLease, AssignTasks, Assignment, AttachSandbox, CancelTask, Command, CommandEnvelope,
    CommitCapsule, CrashTakeover, CreateProfile, CreateProject, FenceLease, GracefulTakeover,
    NextHolder, RecordReapEvidence, RegisterWorker, ReleaseLease, RenewLease, ReportTransition,
    SubmitTask, TransitionDetail, WorkerHeartbeat,
};
use squadron_core::ids::{
    Digest, Generation, IdempotencyKey, LeaseId, ProfileId, ProfileKey, ProjectId, TaskId,
    TenantId, WorkerId,
};
use squadron_core::lease::{
    EvidenceSource, FenceReason, FencingToken, LeaseHolder, LeaseState, ReapEvidence,
};
use squadron_core::limits::TERMINAL_LEASES_PER_PROFILE_KEPT;
use squadron_core::manifest::{
    parse_manifest_yaml, FailureAction, Keyword as _, RuntimeKind, TaskSpec,
};
use squadron_core::provider::Provider;
use squadron_core::rejection::Rejection;
use squadron_core::response::{LeaseGrant, Outcome, Response, SweepReport};
use squadron_core::snapshot::{decode_snapshot, encode_snapshot, state_digest};
use squadron_core::task::TaskState;
use squadron_core::State;

use generators::*;
use ops::*;
use reference::*;
use run::*;
use universe::*;
