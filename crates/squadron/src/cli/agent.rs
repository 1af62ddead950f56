//! `squadron agent`: the process inside a sandbox (crate `squadron-agent`).

use std::path::PathBuf;

use clap::Args;

/// Where the worker puts the agent's environment file inside a sandbox.
pub const ENV_FILE_DEFAULT: &str = "/run/squadron/agent/agent.env";

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The environment file the worker wrote (task, relay sockets, CA, one-time token); the
    /// token is removed from it once read.
    #[arg(long, default_value = ENV_FILE_DEFAULT)]
    pub env_file: PathBuf,
    /// The provider launcher and its arguments, started once the task is RUNNING.
    #[arg(last = true, required_unless_present = "launch_file")]
    pub launch: Vec<String>,
    /// A warm sandbox's (the worker's pool): wait for this file, written once the container
    /// is claimed for a task; it names the launcher, its directory and its environment.
    #[arg(long, conflicts_with = "launch")]
    pub launch_file: Option<PathBuf>,
}

/// Runs the agent; the answer is the process's exit code (the launcher's, or 1 on failure).
pub async fn run(args: AgentArgs) -> u8 {
    let options = squadron_agent::AgentOptions {
        env_file: args.env_file,
        launch: args.launch,
        launch_file: args.launch_file,
    };
    match squadron_agent::run(options).await {
        Ok(code) => u8::try_from(code).unwrap_or(1),
        Err(e) => {
            tracing::error!(error = %e, "the agent stops");
            eprintln!("error: {e}");
            1
        }
    }
}
