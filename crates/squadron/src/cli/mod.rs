//! The command line: `squadron <command> [flags]`. Flags are named after the REST bodies'
//! fields (`--expected-generation` for `expected_generation`); the id of the command's own noun
//! (`task get ID`, `lease renew ID`) is positional.
//!
//! One module per command group, each holding its clap arguments and its handler; `main.rs`
//! only parses, sets up logging and the runtime, dispatches here and reports errors.

pub mod agent;
pub mod bench;
pub mod capsule;
pub mod cluster;
pub mod config_file;
pub mod credential_store;
pub mod credentials;
pub mod evidence;
pub mod init;
pub mod lease;
pub mod mailbox;
pub mod profile;
pub mod project;
pub mod serve;
pub mod soak;
pub mod task;
pub mod token;
pub mod vm_ssh_proxy;
pub mod worker;

use std::io::Read;
use std::path::Path;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::de::DeserializeOwned;
use squadron_client::{Consistency, SquadronClient};
use squadron_core::ids::{IdempotencyKey, ProjectId, TenantId};
use squadron_core::Outcome;

use crate::output::{emit, outcome_text};

#[derive(Debug, Parser)]
#[command(
    name = "squadron",
    version,
    about = "Squadron: a Raft-replicated control plane for AI coding agents",
    long_about = "Squadron: a Raft-replicated control plane for AI coding agents.\n\n\
        `squadron dev` runs a single-node control plane; `squadron server --config FILE` runs \
        one node of a cluster; every other command is a client of the REST API of the nodes \
        given with --endpoint (tried in order; a write whose outcome is unknown is never sent \
        twice unless it carries --idempotency-key)."
)]
pub struct Cli {
    /// A control node's REST base URL; repeat for several nodes (tried in order). Default:
    /// the configuration file's `endpoints`, else https://127.0.0.1:8120.
    #[arg(
        long = "endpoint",
        global = true,
        value_name = "URL",
        env = "SQUADRON_ENDPOINT",
        value_delimiter = ','
    )]
    pub endpoints: Vec<String>,

    /// How results are printed.
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,

    /// How log lines are written to stderr: `json` (one object a line, for collectors),
    /// `text`, or `auto` — JSON for `server`, `worker` and `agent`, text for `dev` and the
    /// client commands.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "SQUADRON_LOG_FORMAT",
        default_value_t = LogFormat::Auto
    )]
    pub log_format: LogFormat,

    /// Read the answering node's applied state instead of a linearizable read.
    #[arg(long, global = true)]
    pub stale: bool,

    /// Send this idempotency key with the write (a retry with the same key gets the first
    /// answer, and may safely go to another endpoint).
    #[arg(long, global = true, value_name = "KEY")]
    pub idempotency_key: Option<String>,

    #[command(flatten)]
    pub credentials: credentials::CredentialArgs,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Auto,
    Json,
    Text,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned text for people.
    Table,
    /// The typed value as pretty JSON.
    Json,
}

impl Cli {
    /// The endpoints given, else the configuration's, else the local default.
    pub fn endpoints_or(&self, config: &config_file::CliConfig) -> Vec<String> {
        if !self.endpoints.is_empty() {
            return self.endpoints.clone();
        }
        if !config.endpoints.is_empty() {
            return config.endpoints.clone();
        }
        vec![squadron_client::ENDPOINT_DEFAULT.to_string()]
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Make a new cluster's CA, node certificates and first admin token (or rotate the node
    /// certificates).
    Init(init::InitArgs),
    /// Run one control node of a cluster from a TOML configuration file.
    Server(serve::ServerArgs),
    /// Run a single-node cluster and a local worker on this machine.
    #[command(
        long_about = "Run a single-node cluster on this machine: embedded RocksDB under \
            --data-dir, the REST API and dashboard on --listen, gRPC on --grpc-listen, and a \
            local worker (data under --data-dir/worker) with the process runtime, plus the \
            Docker runtime when a Docker engine answers, and the KVM runtime when the build has \
            the libvirt feature and libvirt answers. --no-worker runs the control plane only."
    )]
    Dev(serve::DevArgs),
    /// Cluster membership and health.
    #[command(subcommand)]
    Cluster(cluster::ClusterCmd),
    /// Projects and their sandbox.
    #[command(subcommand)]
    Project(project::ProjectCmd),
    /// Agent profiles, capability manifests, MCP authorization.
    #[command(subcommand)]
    Profile(profile::ProfileCmd),
    /// Runtime leases and takeovers.
    #[command(subcommand)]
    Lease(lease::LeaseCmd),
    /// Continuity capsules.
    #[command(subcommand)]
    Capsule(capsule::CapsuleCmd),
    /// Profile mailboxes.
    #[command(subcommand)]
    Mailbox(mailbox::MailboxCmd),
    /// Run a worker (with no subcommand), or manage worker nodes.
    Worker(Box<worker::WorkerArgs>),
    /// Tasks.
    #[command(subcommand)]
    Task(task::TaskCmd),
    /// Operator tokens: create (the secret is shown once), list, revoke.
    #[command(subcommand)]
    Token(token::TokenCmd),
    /// Credentials (admin): put, list, rotate, revoke; values are sealed at rest and reach
    /// only the sandbox of a task that names them.
    #[command(subcommand)]
    Credential(credential_store::CredentialCmd),
    /// A project's release evidence: profiles, peak processes, takeovers, dual writers,
    /// refused stale commits, roster deliveries, MCP denials, leftovers.
    Evidence(evidence::EvidenceArgs),
    /// Closed-loop lease benchmark: acquire → renew → release cycles.
    Bench(bench::BenchTop),
    /// The release gate's soak: the canary in a loop, sampling after each cycle what it must
    /// give back (leases, slots, cgroup leaves, credential files, processes) and the memory
    /// and open files of every Squadron process on this host; ends with a verdict.
    Soak(Box<soak::SoakArgs>),
    /// The process inside a sandbox: enrolls, registers, heartbeats, runs the provider
    /// launcher once the task is RUNNING (the worker starts it; not for use by hand).
    Agent(agent::AgentArgs),
    /// The ProxyCommand of a kept KVM guest's break-glass SSH line (the line names it): the
    /// guest's break-glass port through its host socket.
    VmSshProxy(vm_ssh_proxy::VmSshProxyArgs),
}

impl Command {
    /// Whether the command runs a node or a worker (it logs at info) rather than a client call.
    pub fn serves(&self) -> bool {
        matches!(
            self,
            Command::Server(_) | Command::Dev(_) | Command::Agent(_)
        )
    }

    /// Whether `--log-format auto` writes JSON: the long-running services an operator's log
    /// collector reads, not a person's terminal.
    pub fn logs_json_by_default(&self) -> bool {
        match self {
            Command::Server(_) | Command::Agent(_) => true,
            Command::Worker(args) => args.cmd.is_none(),
            _ => false,
        }
    }

    /// Whether the command is a client of the REST API (and so needs credentials).
    pub fn is_client(&self) -> bool {
        !matches!(
            self,
            Command::Server(_)
                | Command::Dev(_)
                | Command::Init(_)
                | Command::Agent(_)
                | Command::VmSshProxy(_)
        )
    }
}

/// `--tenant T --project P`.
#[derive(Debug, Clone, Args)]
pub struct ProjectRef {
    #[arg(long)]
    pub tenant: TenantId,
    #[arg(long)]
    pub project: ProjectId,
}

/// What every client command needs.
#[derive(Debug)]
pub struct Ctx {
    pub client: SquadronClient,
    pub out: OutputFormat,
    pub consistency: Consistency,
    key: Option<IdempotencyKey>,
}

impl Ctx {
    /// The client, output format, read consistency and idempotency key the global flags ask for.
    pub fn new(cli: &Cli) -> anyhow::Result<Self> {
        let key = cli
            .idempotency_key
            .as_deref()
            .map(IdempotencyKey::new)
            .transpose()?;
        let (credentials, endpoints) = if cli.command.is_client() {
            let config = config_file::CliConfig::load()?;
            let credentials = cli.credentials.with_config(&config).resolve()?;
            (credentials, cli.endpoints_or(&config))
        } else {
            let none = config_file::CliConfig::default();
            (
                squadron_client::Credentials::default(),
                cli.endpoints_or(&none),
            )
        };
        Ok(Ctx {
            client: SquadronClient::secured(endpoints, &credentials)?,
            out: cli.output,
            consistency: if cli.stale {
                Consistency::Stale
            } else {
                Consistency::Linearizable
            },
            key,
        })
    }

    pub fn key(&self) -> Option<&IdempotencyKey> {
        self.key.as_ref()
    }

    /// Prints a write's outcome.
    pub fn outcome(&self, outcome: &Outcome) -> anyhow::Result<()> {
        emit(self.out, outcome, outcome_text)
    }
}

/// A file's text; `-` reads standard input.
pub fn read_input(path: &Path) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
        Ok(text)
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    }
}

/// Parses a snake_case keyword through the type's serde name.
pub fn parse_serde<T: DeserializeOwned>(s: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::lease::LeaseCmd;
    use super::*;
    use clap::CommandFactory;
    use squadron_core::lease::FenceReason;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_and_version_are_answered_by_the_parser() {
        let help = Cli::try_parse_from(["squadron", "--help"]).unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        let text = help.to_string();
        for command in ["server", "dev", "cluster", "task", "bench"] {
            assert!(text.contains(command), "{command} missing from --help");
        }
        let dev = Cli::try_parse_from(["squadron", "dev", "--help"]).unwrap_err();
        assert!(dev.to_string().contains("local worker"));
        let version = Cli::try_parse_from(["squadron", "--version"]).unwrap_err();
        assert_eq!(version.kind(), clap::error::ErrorKind::DisplayVersion);
    }

    #[test]
    fn endpoints_repeat_and_default() {
        let cli = Cli::try_parse_from(["squadron", "project", "list"]).unwrap();
        let none = config_file::CliConfig::default();
        assert_eq!(
            cli.endpoints_or(&none),
            vec![squadron_client::ENDPOINT_DEFAULT]
        );
        let configured =
            config_file::CliConfig::parse("endpoints = [\"https://n1:8120\"]").unwrap();
        assert_eq!(cli.endpoints_or(&configured), vec!["https://n1:8120"]);
        let cli = Cli::try_parse_from([
            "squadron",
            "cluster",
            "status",
            "--endpoint",
            "http://127.0.0.1:8211",
            "--endpoint",
            "http://127.0.0.1:8212",
            "--output",
            "json",
        ])
        .unwrap();
        assert_eq!(
            cli.endpoints_or(&configured).len(),
            2,
            "flags win over the file"
        );
        assert_eq!(cli.output, OutputFormat::Json);
    }

    #[test]
    fn bad_input_is_refused_by_the_parser() {
        assert!(Cli::try_parse_from(["squadron", "bench", "--profiles", "65"]).is_err());
        assert!(Cli::try_parse_from(["squadron", "task", "get", "zero"]).is_err());
        assert!(Cli::try_parse_from(["squadron", "task", "list", "--state", "nope"]).is_err());
        assert!(Cli::try_parse_from([
            "squadron",
            "project",
            "create",
            "--tenant",
            "Bad Name",
            "--project",
            "p"
        ])
        .is_err());
        let cli = Cli::try_parse_from([
            "squadron",
            "lease",
            "fence",
            "3",
            "--profile",
            "1",
            "--generation",
            "2",
            "--reason",
            "expired",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Lease(LeaseCmd::Fence {
                reason: FenceReason::Expired,
                ..
            })
        ));
    }
}
