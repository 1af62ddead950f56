//! What the worker and the agent in its sandboxes agree on. The wire of a VM's agent channel:
//! the one virtio-serial port between the agent in the guest and its worker carries yamux
//! streams, each opened by the agent and starting with one byte that names what it leads to: a
//! control listener, or the worker's egress proxy for the sandbox.

/// The name the host gives the port (`/dev/virtio-ports/<name>` in the guest).
pub const PORT_NAME: &str = "org.squadron.agent";
/// The port on which the worker asks the guest to stop its agent (one line, [`STOP_LINE`]).
pub const CONTROL_PORT_NAME: &str = "org.squadron.control";
/// What the worker writes on the control port for a graceful stop.
pub const STOP_LINE: &str = "stop";
/// The port a guest kept for break-glass serves SSH on. Its bytes are one stream with no
/// session boundaries, so each session starts with a handshake: the host's end writes
/// `BREAK_GLASS_HELLO NONCE` on a line (again, now and then, until answered), the guest
/// answers `BREAK_GLASS_READY NONCE` on a line, and what follows is the SSH session. The host's
/// end drops whatever came before its own answer: the tail of an earlier session. `vm-init`
/// spells both words out.
pub const BREAK_GLASS_PORT_NAME: &str = "org.squadron.breakglass";
pub const BREAK_GLASS_HELLO: &str = "squadron-break-glass";
pub const BREAK_GLASS_READY: &str = "squadron-break-glass-ready";
/// First byte of a stream to a control node's REST listener (enrollment).
pub const TARGET_REST: u8 = b'R';
/// First byte of a stream to the leader's gRPC listener.
pub const TARGET_GRPC: u8 = b'G';
/// First byte of a stream to the worker's egress-injection proxy for the sandbox: a guest's
/// provider calls its own loopback's [`EGRESS_PORT`], where the agent accepts for the worker,
/// which cannot bind a socket inside another kernel.
pub const TARGET_EGRESS: u8 = b'E';
/// The port of egress injection's proxy on a sandbox's loopback (every runtime's).
pub const EGRESS_PORT: u16 = 4180;
/// Control streams (to REST or gRPC) one VM's channel carries at once.
pub const CONTROL_STREAMS_MAX: usize = 8;
/// Egress streams one VM's channel carries at once: the proxy's own connection bound.
pub const EGRESS_STREAMS_MAX: usize = 32;
/// Streams one VM's channel carries at once, both ends' yamux bound.
pub const CHANNEL_STREAMS_MAX: usize = CONTROL_STREAMS_MAX + EGRESS_STREAMS_MAX;
/// Where a sandbox finds the shared libraries of the worker's binary it runs as its agent
/// (`LD_LIBRARY_PATH` for the agent, never for the provider it starts).
pub const AGENT_LIBRARY_DIR: &str = "/usr/local/lib/squadron";

/// The file a pooled sandbox's agent waits for (`squadron agent --launch-file`): a warm
/// container starts before any task is known, so what its provider runs arrives here, written
/// by the worker into the task's `run/` (read-only in every sandbox) at the claimed
/// container's start.
pub const POOLED_LAUNCH_FILE_NAME: &str = "pooled-launch.json";
/// The largest launch file an agent reads.
pub const POOLED_LAUNCH_BYTES_MAX: u64 = 1024 * 1024;

/// What a pooled sandbox's provider runs: the launcher, its working directory and its whole
/// environment (the container's own carries only what the agent needs).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PooledLaunch {
    pub argv: Vec<String>,
    pub workdir: String,
    pub env: std::collections::BTreeMap<String, String>,
}
