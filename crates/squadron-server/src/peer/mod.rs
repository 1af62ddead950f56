//! The node-to-node protocol: what one control node asks another (in practice, the leader) to
//! do for it — propose forwarded writes (one, or a batch), name a read index for a follower's
//! linearizable read, and run a relayed membership change.
//!
//! - `wire.rs`: its paths and bodies, defined here only.
//! - `client.rs`: the one HTTP client every node-to-node call goes through.
//! - `router.rs`: the receiving side. What arrives here runs on this node and is never passed
//!   on again: a node that is no longer the leader says so, and the sender tells its caller.
//!
//! The public API (`rest/`) knows none of it. `lib.rs` serves this router, with Raft's
//! `RaftService`, on the peer listener (`peer_listen`), where only node certificates are
//! admitted (`squadron_pki::NodesOnly`); the client dials `https://{peer}` with the node's
//! certificate and accepts only another node's.

pub mod client;
pub mod router;
pub mod wire;

pub use client::{PeerClient, PeerError};
pub use router::router;
