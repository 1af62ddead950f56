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
    #[arg(last = true, required = true)]
    pub launch: Vec<String>,
}

/// Runs the agent; the answer is the process's exit code (the launcher's, or 1 on failure).
pub async fn run(args: AgentArgs) -> u8 {
    let options = squadron_agent::AgentOptions {
        env_file: args.env_file,
        launch: args.launch,
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
