//! The `squadron` binary: wiring only. The control node lives in `squadron-server`, the REST
//! client in `squadron-client`; the commands are in `cli/`, one module per command group.

mod cli;
mod enroll;
mod follow;
mod lease_bench;
mod node;
mod output;
mod progress;
mod start_bench;
mod status;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use squadron_client::ClientError;
use tracing_subscriber::EnvFilter;

use cli::{Cli, Command, Ctx, LogFormat};

/// mimalloc rather than glibc's malloc: a node under load frees many small allocations of
/// varied sizes (ended tasks sealed into their encodings, requests, responses), and glibc's
/// bin searches and consolidation took 17 % of its CPU in a profile (`_int_malloc` 11.6 %,
/// `malloc_consolidate` 3.5 %, against 2.9 % and 1.3 % before ended tasks were sealed;
/// docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // openraft narrates every election at info; its warnings are what an operator needs.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(if cli.command.serves() {
            "info,openraft=warn"
        } else {
            "warn"
        })
    });
    let json = match cli.log_format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => cli.command.logs_json_by_default(),
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        logs.json().init();
    } else {
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }
    if let Command::VmSshProxy(args) = cli.command {
        return match cli::vm_ssh_proxy::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                report(&e);
                ExitCode::FAILURE
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Command::Agent(args) = cli.command {
        return ExitCode::from(runtime.block_on(cli::agent::run(args)));
    }
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e);
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Offline evidence commands need no endpoint, CA or token.
    if let Command::Evidence(args) = &cli.command {
        if let Some(action) = args.action.clone() {
            return cli::evidence::run_offline(cli.output, action);
        }
    }
    let ctx = Ctx::new(&cli)?;
    match cli.command {
        Command::Init(args) => cli::init::run(args),
        Command::Server(args) => cli::serve::server(args).await,
        Command::Dev(args) => cli::serve::dev(args).await,
        Command::Cluster(cmd) => cli::cluster::run(&ctx, cmd).await,
        Command::Project(cmd) => cli::project::run(&ctx, cmd).await,
        Command::Profile(cmd) => cli::profile::run(&ctx, cmd).await,
        Command::Evidence(args) => cli::evidence::run(&ctx, args).await,
        Command::Soak(args) => cli::soak::run(&ctx, *args).await,
        Command::Lease(cmd) => cli::lease::run(&ctx, cmd).await,
        Command::Capsule(cmd) => cli::capsule::run(&ctx, cmd).await,
        Command::Mailbox(cmd) => cli::mailbox::run(&ctx, cmd).await,
        Command::Worker(args) => cli::worker::run(&ctx, *args, cli.credentials.cacert).await,
        Command::Task(cmd) => cli::task::run(&ctx, cmd).await,
        Command::Token(cmd) => cli::token::run(&ctx, cmd).await,
        Command::Credential(cmd) => cli::credential_store::run(&ctx, cmd).await,
        Command::Bench(top) => cli::bench::run(&ctx, top).await,
        Command::Agent(_) | Command::VmSshProxy(_) => unreachable!("main runs it itself"),
    }
}

/// `error: <code>: <message>` (and `field: …`) for a server's answer; the chain otherwise.
fn report(e: &anyhow::Error) {
    if let Some(ce) = e.downcast_ref::<ClientError>() {
        let context: Vec<String> = e
            .chain()
            .take_while(|c| c.downcast_ref::<ClientError>().is_none())
            .map(|c| c.to_string())
            .collect();
        let prefix = if context.is_empty() {
            String::new()
        } else {
            format!(" ({})", context.join(": "))
        };
        eprintln!("error: {}: {}{prefix}", ce.code().as_str(), ce.message());
        if let Some(field) = ce.body().and_then(|b| b.field.as_deref()) {
            eprintln!("field: {field}");
        }
    } else {
        eprintln!("error: {e:#}");
    }
}
