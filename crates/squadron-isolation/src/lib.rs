//! Per-process containment: a cgroup v2 leaf per attempt, a bubblewrap boundary around the
//! provider process, and a reaper whose result is the reap evidence the control plane needs.
//!
//! Nothing here knows about tasks or leases; callers name leaves and paths.
//!
//! Map: `cgroup_root` (where leaves live: the v2 mount, the v1 memory/pids/cpu fallbacks, one
//! parent per worker), `cgroup_leaf` (one leaf: create, limits, populated, freeze, kill,
//! remove), `leaf_usage` (a leaf's CPU time and memory by the kernel's accounting), `bubblewrap` (the boundary's argv), `sandbox_process` (the shim that joins the
//! leaf, runs the boundary and records the exit code), `sandbox_network` (an `outbound`
//! sandbox's own network namespace: veth pair, NAT), `egress_filter` (the nftables table
//! that limits where a sandbox interface's traffic goes), `disk_quota` (a directory's quota: a
//! loop-mounted ext4 image), `termination` (SIGTERM, grace, SIGKILL), `reaper` (freeze → kill → `populated 0` → rmdir, as evidence),
//! `process_entry` (a pid with its start time, read from /proc), and
//! `git_broker` (the generation-fenced Git broker: provider processes commit through it).
//!
//! The containment code is synchronous std code: callers on an async runtime wrap the
//! waiting calls (`Reaper::reap`, `Termination::run`, `SandboxProcess::spawn`) in a blocking
//! task. The Git broker is async (tokio) and does its blocking Git work on blocking tasks.

pub mod beneath;
pub mod bubblewrap;
pub mod cgroup_leaf;
pub mod cgroup_root;
pub mod disk_quota;
pub mod egress_filter;
pub mod error;
pub mod git_broker;
pub mod leaf_usage;
pub mod limit_hits;
pub mod namespace_listener;
pub mod process_entry;
pub mod reaper;
pub mod sandbox_network;
pub mod sandbox_process;
pub mod secret_tmpfs;
pub mod slot_mounts;
pub mod termination;

mod clock;
mod fs_util;

pub use bubblewrap::BubblewrapCommand;
pub use cgroup_leaf::{AppliedLimits, CgroupLeaf, CgroupLimits};
pub use cgroup_root::{CgroupRoot, CgroupRootConfig};
pub use egress_filter::EgressFilter;
pub use error::IsolationError;
pub use git_broker::{
    BrokerError, BrokerServer, BrokerStats, CommitOutcome, CommitRequest, FenceCheck, FenceFuture,
    FenceVerdict, GitBroker, GitBrokerClient, HeadOutcome, HeadRequest, Refusal, RefusalCode,
};
pub use leaf_usage::LeafUsage;
pub use limit_hits::LimitHits;
pub use process_entry::ProcessEntry;
pub use reaper::{ReapEvidence, Reaper};
pub use sandbox_network::{NetworkConfig, SandboxNetwork};
pub use sandbox_process::{SandboxLaunch, SandboxProcess};
pub use termination::{Termination, TerminationOutcome};
