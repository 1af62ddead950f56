//! Per-process containment: a cgroup v2 leaf per attempt, a bubblewrap boundary around the
//! provider process, and a reaper whose result is the reap evidence the control plane needs.
//!
//! Nothing here knows about tasks or leases; callers name leaves and paths.
