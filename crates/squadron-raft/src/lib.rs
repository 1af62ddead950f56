//! Raft between control nodes: openraft's configuration, the versioned wire encoding of its
//! RPCs, the gRPC client side (`GrpcNetworkFactory`) and server side (`RaftGrpcService`).

pub mod append_stream;
pub mod config;
pub mod leader_contact;
pub mod network;
pub mod service;
pub mod wire;

pub use append_stream::AppendStats;
pub use config::RaftTimeouts;
pub use leader_contact::LeaderContact;
pub use network::{GrpcNetworkFactory, PeerChannels};
pub use service::RaftGrpcService;

/// The Raft handle of a control node.
pub type RaftNode = openraft::Raft<squadron_store::TypeConfig>;
