//! The `squadron` binary: wiring only. The control node lives in `squadron-server`, the REST
//! client in `squadron-client`.

mod bench;
mod cli;
mod follow;
mod node;
mod output;
mod status;

use std::io::{IsTerminal, Read};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use squadron_client::{
    AckMessages, AddLearner, AttachSandbox, ClientError, CommitCapsule, Consistency, CrashTakeover,
    CreateProfile, CreateProject, Decommission, FenceLease, GracefulTakeover, LaunchAgent,
    LeaseFence, OutcomeExt, PostMessage, RecordEvidence, RegisterWorker, RenewLease,
    SandboxRepository, SetCapabilities, SquadronClient, StopAgent, TakeoverAgent, TakeoverEvidence,
    TakeoverKind, TaskQuery,
};
use squadron_core::capsule::{CapsuleDraft, CapsulePayload};
use squadron_core::command::NextHolder;
use squadron_core::ids::IdempotencyKey;
use squadron_core::lease::LeaseHolder;
use squadron_core::mailbox::MessageSender;
use squadron_core::Outcome;
use tracing_subscriber::EnvFilter;

use cli::{
    CapsuleArgs, CapsuleCmd, Cli, ClusterCmd, Command, EvidenceArgs, HolderArgs, LeaseCmd,
    MailboxCmd, OutputFormat, ProfileCmd, ProjectCmd, TakeoverKindArg, TaskCmd, WorkerCmd,
};
use output::{emit, emit_generic, outcome_text, short, Table};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let serving = matches!(cli.command, Command::Server { .. } | Command::Dev { .. });
    // openraft narrates every election at info; its warnings are what an operator needs.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(if serving {
            "info,openraft=warn"
        } else {
            "warn"
        })
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
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
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e);
            ExitCode::FAILURE
        }
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

/// What every client command needs.
struct Ctx {
    client: SquadronClient,
    out: OutputFormat,
    consistency: Consistency,
    key: Option<IdempotencyKey>,
}

impl Ctx {
    fn key(&self) -> Option<&IdempotencyKey> {
        self.key.as_ref()
    }

    fn outcome(&self, outcome: &Outcome) -> anyhow::Result<()> {
        emit(self.out, outcome, outcome_text)
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let key = cli
        .idempotency_key
        .as_deref()
        .map(IdempotencyKey::new)
        .transpose()?;
    let ctx = Ctx {
        client: SquadronClient::new(cli.endpoints.clone()),
        out: cli.output,
        consistency: if cli.stale {
            Consistency::Stale
        } else {
            Consistency::Linearizable
        },
        key,
    };
    match cli.command {
        Command::Server { config } => node::server(&config).await,
        Command::Dev {
            data_dir,
            listen,
            grpc_listen,
            worker_listen,
            no_worker,
        } => {
            node::dev(
                data_dir,
                listen,
                grpc_listen,
                (!no_worker).then_some(worker_listen),
            )
            .await
        }
        Command::Cluster(cmd) => cluster(&ctx, cmd).await,
        Command::Project(cmd) => project(&ctx, cmd).await,
        Command::Profile(cmd) => profile(&ctx, cmd).await,
        Command::Evidence(args) => project_evidence(&ctx, args).await,
        Command::Lease(cmd) => lease(&ctx, cmd).await,
        Command::Capsule(cmd) => capsule(&ctx, cmd).await,
        Command::Mailbox(cmd) => mailbox(&ctx, cmd).await,
        Command::Worker(args) => match args.cmd {
            Some(cmd) => worker(&ctx, cmd).await,
            None => node::worker(args.run).await,
        },
        Command::Task(cmd) => task(&ctx, cmd).await,
        Command::Bench(top) => match top.cmd {
            None => {
                let report = bench::run(&ctx.client, &top.args).await?;
                emit(ctx.out, &report, bench::render)
            }
            Some(cli::BenchCmd::Compare(args)) => compare(ctx.out, args).await,
        },
    }
}

/// `squadron bench compare`: both clusters are stopped when the comparison ends or on Ctrl-C.
async fn compare(out: OutputFormat, args: cli::CompareArgs) -> anyhow::Result<()> {
    let bin = match args.squadron {
        Some(p) => p,
        None => std::env::current_exe().context("locating this squadron binary")?,
    };
    let mut opts = squadron_bench::CompareOptions::new(bin);
    opts.nodes = args.nodes;
    opts.clients = args.clients;
    opts.duration = Duration::from_secs(args.duration);
    if !args.workloads.is_empty() {
        opts.workloads = args
            .workloads
            .iter()
            .map(|w| w.parse())
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("--workloads: {e}"))?;
    }
    opts.failover = !args.no_failover;
    opts.etcd_bin = args.etcd;
    opts.seed = args.seed;
    opts.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let report = tokio::select! {
        r = squadron_bench::compare(&opts) => r?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; both clusters were stopped"),
    };
    emit(out, &report, squadron_bench::render_table)
}

async fn cluster(ctx: &Ctx, cmd: ClusterCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        ClusterCmd::Status => {
            let probes = status::gather(c).await;
            if probes.iter().all(|p| p.answer.is_err()) {
                let why: Vec<String> = probes
                    .iter()
                    .map(|p| {
                        format!(
                            "{}: {}",
                            p.rest,
                            p.answer.as_ref().err().map_or("", String::as_str)
                        )
                    })
                    .collect();
                anyhow::bail!("unavailable: no node answered ({})", why.join("; "));
            }
            let view = status::assemble(&probes);
            emit(ctx.out, &view, status::render)
        }
        ClusterCmd::Add { id, rest, grpc } => {
            let changed = c.add_learner(&AddLearner { id, rest, grpc }).await?;
            emit_generic(ctx.out, &changed)
        }
        ClusterCmd::Promote { id } => emit_generic(ctx.out, &c.promote_voter(id).await?),
        ClusterCmd::Remove { id } => emit_generic(ctx.out, &c.remove_member(id).await?),
    }
}

async fn project(ctx: &Ctx, cmd: ProjectCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        ProjectCmd::Create {
            at,
            max_profiles,
            max_active,
        } => {
            let req = CreateProject {
                tenant: at.tenant,
                project: at.project,
                max_profiles,
                max_active,
            };
            ctx.outcome(&c.create_project(&req, ctx.key()).await?)
        }
        ProjectCmd::List => {
            let list = c.list_projects(ctx.consistency).await?;
            emit(ctx.out, &list, |list| {
                let mut t = Table::new(&["tenant", "project", "profiles", "slots", "sandbox"]);
                for p in list {
                    t.row(vec![
                        p.tenant.to_string(),
                        p.project.to_string(),
                        p.profiles.to_string(),
                        format!("{}/{}", p.slots_held, p.max_active),
                        p.sandbox.clone().unwrap_or_else(|| "-".into()),
                    ]);
                }
                t.render()
            })
        }
        ProjectCmd::Get { at } => {
            let p = c
                .get_project(&at.tenant, &at.project, ctx.consistency)
                .await?;
            emit_generic(ctx.out, &p)
        }
        ProjectCmd::AttachSandbox {
            at,
            worker,
            runtime,
            sandbox_ref,
        } => {
            let req = AttachSandbox {
                worker,
                runtime,
                sandbox_ref,
            };
            ctx.outcome(
                &c.attach_sandbox(&at.tenant, &at.project, &req, ctx.key())
                    .await?,
            )
        }
        ProjectCmd::DetachSandbox { at, sandbox_ref } => ctx.outcome(
            &c.detach_sandbox(&at.tenant, &at.project, &sandbox_ref, ctx.key())
                .await?,
        ),
        ProjectCmd::Roster { at } => {
            let roster = c.roster(&at.tenant, &at.project, ctx.consistency).await?;
            emit(ctx.out, &roster, |r| {
                let items: Vec<serde_json::Value> = r
                    .entries
                    .iter()
                    .filter_map(|e| serde_json::to_value(e).ok())
                    .collect();
                format!(
                    "revision: {}\n{}",
                    r.revision,
                    output::value_table(&items).render()
                )
            })
        }
    }
}

fn profiles_table(list: &[squadron_core::profile::AgentProfile]) -> String {
    let mut t = Table::new(&[
        "id",
        "key",
        "providers",
        "generation",
        "live_lease",
        "fenced",
        "capsule_head",
    ]);
    for p in list {
        t.row(vec![
            p.id.to_string(),
            p.key.to_string(),
            p.providers
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(","),
            p.generation.to_string(),
            p.live_lease
                .map(|l| l.to_string())
                .unwrap_or_else(|| "-".into()),
            p.fenced_unreaped.len().to_string(),
            p.capsule_head
                .map(|h| format!("{}:{}", h.sequence, short(&h.digest.to_hex())))
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    t.render()
}

async fn profile(ctx: &Ctx, cmd: ProfileCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        ProfileCmd::Launch {
            id,
            provider,
            worker,
            repository,
            branch,
            prompt_file,
        } => {
            let prompt = match prompt_file {
                Some(f) => Some(
                    std::fs::read_to_string(&f)
                        .with_context(|| format!("--prompt-file {}", f.display()))?,
                ),
                None => None,
            };
            let req = LaunchAgent {
                provider,
                worker,
                repository: repository.map(|url| SandboxRepository { url, branch }),
                prompt,
            };
            emit_generic(ctx.out, &agent_client(ctx).agent_launch(id, &req).await?)
        }
        ProfileCmd::Observe { id } => emit_generic(ctx.out, &c.agent_view(id).await?),
        ProfileCmd::Takeover {
            id,
            kind,
            provider,
            wait_for_expiry_ms,
        } => {
            let req = TakeoverAgent {
                kind: match kind {
                    TakeoverKindArg::Graceful => TakeoverKind::Graceful,
                    TakeoverKindArg::Crash => TakeoverKind::Crash,
                },
                provider,
                wait_for_expiry_ms,
                prompt: None,
            };
            emit_generic(ctx.out, &agent_client(ctx).agent_takeover(id, &req).await?)
        }
        ProfileCmd::Stop { id, grace_ms } => emit_generic(
            ctx.out,
            &agent_client(ctx)
                .agent_stop(id, &StopAgent { grace_ms })
                .await?,
        ),
        ProfileCmd::Reap { id } => emit_generic(ctx.out, &agent_client(ctx).agent_reap(id).await?),
        ProfileCmd::Create {
            at,
            key,
            providers,
            context_ref,
        } => {
            let req = CreateProfile {
                key,
                providers,
                context_ref,
            };
            ctx.outcome(
                &c.create_profile(&at.tenant, &at.project, &req, ctx.key())
                    .await?,
            )
        }
        ProfileCmd::Get { id } => emit_generic(ctx.out, &c.get_profile(id, ctx.consistency).await?),
        ProfileCmd::List { at } => {
            let list = c
                .list_profiles(&at.tenant, &at.project, ctx.consistency)
                .await?;
            emit(ctx.out, &list, |l| profiles_table(l))
        }
        ProfileCmd::Capabilities {
            id,
            expected_version,
            required_skills,
            mcp_servers,
        } => {
            let req = SetCapabilities {
                expected_version,
                required_skills,
                mcp_servers,
            };
            ctx.outcome(&c.set_capabilities(id, &req, ctx.key()).await?)
        }
        ProfileCmd::McpGrant { id, server } => {
            ctx.outcome(&c.grant_mcp(id, &server, ctx.key()).await?)
        }
        ProfileCmd::McpRevoke { id, server } => {
            ctx.outcome(&c.revoke_mcp(id, &server, ctx.key()).await?)
        }
        ProfileCmd::McpCheck { id, server } => {
            emit_generic(ctx.out, &c.check_mcp(id, &server, ctx.consistency).await?)
        }
    }
}

fn holder(h: &HolderArgs) -> LeaseHolder {
    LeaseHolder {
        worker: h.worker.clone(),
        process: h.process.clone(),
        cgroup: h.cgroup.clone(),
    }
}

fn next_holder(h: HolderArgs) -> NextHolder {
    NextHolder {
        provider: h.provider,
        holder: holder(&h),
        ttl_ms: h.ttl_ms,
    }
}

fn evidence(cgroup: Option<String>) -> Option<TakeoverEvidence> {
    cgroup.map(|cgroup| TakeoverEvidence {
        cgroup,
        populated: false,
        observed_at_ms: squadron_client::now_ms(),
    })
}

fn read_input(path: &std::path::Path) -> anyhow::Result<String> {
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

fn capsule_draft(a: CapsuleArgs) -> anyhow::Result<CapsuleDraft> {
    if let Some(path) = &a.capsule_file {
        let text = read_input(path)?;
        return serde_json::from_str(&text)
            .with_context(|| format!("{} is not a capsule draft", path.display()));
    }
    let sequence = a
        .sequence
        .context("--sequence is required (or give --capsule-file)")?;
    Ok(CapsuleDraft {
        sequence,
        previous: a.previous,
        schema_version: a.schema_version,
        payload: CapsulePayload {
            task_state: a.task_state,
            decisions: a.decisions,
            pending_work: a.pending_work,
            repository_revision: a.repository_revision,
            mailbox_cursor: a.mailbox_cursor,
            context_ref: a.context_ref,
        },
        expected_digest: a.expected_digest,
    })
}

fn leases_table(list: &[squadron_core::lease::RuntimeLease]) -> String {
    let mut t = Table::new(&[
        "id",
        "profile",
        "generation",
        "state",
        "provider",
        "worker",
        "expires_at_ms",
    ]);
    for l in list {
        t.row(vec![
            l.id.to_string(),
            l.profile.to_string(),
            l.generation.to_string(),
            l.state.name().into(),
            l.provider.to_string(),
            l.holder.worker.to_string(),
            l.expires_at_ms.to_string(),
        ]);
    }
    t.render()
}

async fn lease(ctx: &Ctx, cmd: LeaseCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        LeaseCmd::Acquire {
            profile,
            expected_generation,
            holder: h,
        } => {
            let req = squadron_client::AcquireLease {
                expected_generation,
                provider: h.provider,
                holder: holder(&h),
                ttl_ms: h.ttl_ms,
            };
            ctx.outcome(&c.acquire_lease(profile, &req, ctx.key()).await?)
        }
        LeaseCmd::Renew {
            id,
            profile,
            generation,
            ttl_ms,
        } => {
            let req = RenewLease {
                profile,
                generation,
                ttl_ms,
            };
            ctx.outcome(&c.renew_lease(id, &req, ctx.key()).await?)
        }
        LeaseCmd::Release {
            id,
            profile,
            generation,
        } => ctx.outcome(
            &c.release_lease(
                id,
                &LeaseFence {
                    profile,
                    generation,
                },
                ctx.key(),
            )
            .await?,
        ),
        LeaseCmd::Fence {
            id,
            profile,
            generation,
            reason,
        } => {
            let req = FenceLease {
                profile,
                generation,
                reason,
            };
            ctx.outcome(&c.fence_lease(id, &req, ctx.key()).await?)
        }
        LeaseCmd::Evidence {
            id,
            profile,
            generation,
            cgroup,
            populated,
            observed_at_ms,
        } => {
            let req = RecordEvidence {
                profile,
                generation,
                cgroup,
                populated,
                observed_at_ms: observed_at_ms.unwrap_or_else(squadron_client::now_ms),
            };
            ctx.outcome(&c.record_evidence(id, &req, ctx.key()).await?)
        }
        LeaseCmd::Get { id } => emit_generic(ctx.out, &c.get_lease(id, ctx.consistency).await?),
        LeaseCmd::List { at } => {
            let list = c
                .list_leases(&at.tenant, &at.project, ctx.consistency)
                .await?;
            emit(ctx.out, &list, |l| leases_table(l))
        }
        LeaseCmd::TakeoverGraceful {
            profile,
            lease,
            generation,
            capsule,
            next,
            old_evidence_cgroup,
        } => {
            let req = GracefulTakeover {
                lease,
                generation,
                capsule: capsule_draft(capsule)?,
                next: next_holder(next),
                old_reap_evidence: evidence(old_evidence_cgroup),
            };
            let out = c.takeover_graceful(profile, &req, ctx.key()).await?;
            ctx.outcome(&out)
        }
        LeaseCmd::TakeoverCrash {
            profile,
            lease,
            generation,
            next,
            evidence_cgroup,
        } => {
            let req = CrashTakeover {
                lease,
                generation,
                next: next_holder(next),
                reap_evidence: evidence(evidence_cgroup),
            };
            ctx.outcome(&c.takeover_crash(profile, &req, ctx.key()).await?)
        }
    }
}

async fn capsule(ctx: &Ctx, cmd: CapsuleCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        CapsuleCmd::Commit {
            profile,
            lease,
            generation,
            capsule,
        } => {
            let req = CommitCapsule {
                lease,
                generation,
                capsule: capsule_draft(capsule)?,
            };
            ctx.outcome(&c.commit_capsule(profile, &req, ctx.key()).await?)
        }
        CapsuleCmd::List { profile } => {
            let list = c.list_capsules(profile, ctx.consistency).await?;
            emit(ctx.out, &list, |list| {
                let mut t = Table::new(&[
                    "sequence",
                    "generation",
                    "lease",
                    "digest",
                    "previous",
                    "committed_at_ms",
                ]);
                for k in list {
                    t.row(vec![
                        k.sequence.to_string(),
                        k.generation.to_string(),
                        k.lease.to_string(),
                        short(&k.digest.to_hex()),
                        k.previous
                            .map(|d| short(&d.to_hex()))
                            .unwrap_or_else(|| "-".into()),
                        k.committed_at_ms.to_string(),
                    ]);
                }
                t.render()
            })
        }
    }
}

async fn mailbox(ctx: &Ctx, cmd: MailboxCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        MailboxCmd::Post {
            profile,
            kind,
            body,
            operator,
        } => {
            let req = PostMessage {
                sender: MessageSender::Operator(operator),
                kind,
                body,
            };
            ctx.outcome(&c.post_message(profile, &req, ctx.key()).await?)
        }
        MailboxCmd::Read { profile } => {
            let mailbox = c.read_mailbox(profile, ctx.consistency).await?;
            emit(ctx.out, &mailbox, |m| {
                let mut out = format!(
                    "profile: {}   next_seq: {}   acked_through: {}\n",
                    m.profile, m.next_seq, m.acked_through
                );
                let mut t = Table::new(&["seq", "kind", "sender", "posted_at_ms", "body"]);
                for msg in m.messages.values() {
                    let value = |v: serde_json::Result<serde_json::Value>| {
                        v.map(|v| output::cell(&v)).unwrap_or_default()
                    };
                    t.row(vec![
                        msg.seq.to_string(),
                        value(serde_json::to_value(msg.kind)),
                        value(serde_json::to_value(&msg.sender)),
                        msg.posted_at_ms.to_string(),
                        value(serde_json::to_value(&msg.payload)),
                    ]);
                }
                out.push_str(&t.render());
                out
            })
        }
        MailboxCmd::Ack {
            profile,
            lease,
            generation,
            through_seq,
        } => {
            let req = AckMessages {
                lease,
                generation,
                through_seq,
            };
            ctx.outcome(&c.ack_messages(profile, &req, ctx.key()).await?)
        }
    }
}

async fn worker(ctx: &Ctx, cmd: WorkerCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        WorkerCmd::Register {
            worker,
            address,
            runtimes,
            capacity,
            labels,
            heartbeat_interval_ms,
        } => {
            let req = RegisterWorker {
                worker,
                address,
                runtimes,
                capacity,
                labels: labels.into_iter().collect(),
                heartbeat_interval_ms,
            };
            ctx.outcome(&c.register_worker(&req, ctx.key()).await?)
        }
        WorkerCmd::List => {
            let list = c.list_workers(ctx.consistency).await?;
            emit(ctx.out, &list, |list| {
                let mut t = Table::new(&[
                    "id",
                    "status",
                    "runtimes",
                    "capacity",
                    "tasks",
                    "last_heartbeat_ms",
                    "address",
                ]);
                for w in list {
                    t.row(vec![
                        w.id.to_string(),
                        serde_json::to_value(w.status)
                            .map(|v| output::cell(&v))
                            .unwrap_or_default(),
                        w.runtimes
                            .iter()
                            .map(|r| r.to_string())
                            .collect::<Vec<_>>()
                            .join(","),
                        w.capacity.to_string(),
                        w.tasks.len().to_string(),
                        w.last_heartbeat_ms.to_string(),
                        w.address.clone(),
                    ]);
                }
                t.render()
            })
        }
        WorkerCmd::Get { id } => emit_generic(ctx.out, &c.get_worker(&id, ctx.consistency).await?),
        WorkerCmd::Heartbeat { id } => ctx.outcome(&c.worker_heartbeat(&id, ctx.key()).await?),
        WorkerCmd::Decommission {
            id,
            operator,
            reason,
        } => ctx.outcome(
            &c.decommission_worker(&id, &Decommission { operator, reason }, ctx.key())
                .await?,
        ),
    }
}

fn task_pairs(t: &squadron_core::task::Task) -> Vec<(String, String)> {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    vec![
        ("id".into(), t.id.to_string()),
        ("name".into(), t.spec.name.clone()),
        ("state".into(), t.state.to_string()),
        ("attempt".into(), t.attempt.to_string()),
        (
            "worker".into(),
            opt(t.worker.as_ref().map(|w| w.to_string())),
        ),
        ("provider".into(), t.spec.agent.provider.to_string()),
        ("repository".into(), t.spec.repository.url.clone()),
        ("exit_code".into(), opt(t.exit_code.map(|c| c.to_string()))),
        ("error".into(), opt(t.error.clone())),
        ("cancel_requested".into(), opt(t.cancel_requested.clone())),
        (
            "artifacts".into(),
            if t.artifacts.is_empty() {
                "-".into()
            } else {
                t.artifacts.join(",")
            },
        ),
        ("submitted_at_ms".into(), t.submitted_at_ms.to_string()),
    ]
}

async fn task(ctx: &Ctx, cmd: TaskCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        TaskCmd::Submit {
            file,
            wait,
            follow,
            timeout,
        } => {
            let text = read_input(&file)?;
            let is_json =
                file.extension().is_some_and(|e| e == "json") || text.trim_start().starts_with('{');
            let out = if is_json {
                c.submit_task_json(&text, ctx.key()).await?
            } else {
                c.submit_task_yaml(&text, ctx.key()).await?
            };
            if !wait && !follow {
                return ctx.outcome(&out);
            }
            let id = out
                .task_id()
                .with_context(|| format!("unexpected answer to a submission: {out:?}"))?;
            eprintln!("submitted task {id}; waiting until it ends");
            let started = Instant::now();
            let limit = Duration::from_secs(timeout);
            let mut follower = follow.then(|| follow::Follower::new(id));
            loop {
                let seen = c.get_task(id, ctx.consistency).await;
                if let (Some(f), Ok(t)) = (follower.as_mut(), &seen) {
                    f.show(c, t).await;
                }
                match seen {
                    Ok(t) if t.state.is_terminal() => {
                        return emit(ctx.out, &t, |t| output::key_values(&task_pairs(t)));
                    }
                    Ok(t) if started.elapsed() >= limit => {
                        anyhow::bail!(
                            "task {id} is still {} after {timeout} s (--timeout)",
                            t.state
                        );
                    }
                    Ok(_) => {}
                    // A node may be between leaders: keep polling until the deadline.
                    Err(e) if e.is_transport() && started.elapsed() < limit => {}
                    Err(e) => return Err(e.into()),
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        TaskCmd::List {
            state,
            after,
            limit,
        } => {
            let page = c
                .list_tasks(
                    &TaskQuery {
                        state,
                        after,
                        limit,
                    },
                    ctx.consistency,
                )
                .await?;
            emit(ctx.out, &page, |page| {
                let mut t = Table::new(&[
                    "id",
                    "name",
                    "state",
                    "attempt",
                    "worker",
                    "exit_code",
                    "artifacts",
                ]);
                for task in &page.tasks {
                    t.row(vec![
                        task.id.to_string(),
                        task.spec.name.clone(),
                        task.state.to_string(),
                        task.attempt.to_string(),
                        task.worker
                            .as_ref()
                            .map(|w| w.to_string())
                            .unwrap_or_else(|| "-".into()),
                        task.exit_code
                            .map(|c| c.to_string())
                            .unwrap_or_else(|| "-".into()),
                        task.artifacts.len().to_string(),
                    ]);
                }
                let mut text = t.render();
                if let Some(next) = page.next_after {
                    text.push_str(&format!("more: --after {next}\n"));
                }
                text
            })
        }
        TaskCmd::Get { id } => {
            let t = c.get_task(id, ctx.consistency).await?;
            emit(ctx.out, &t, |t| output::key_values(&task_pairs(t)))
        }
        TaskCmd::Logs {
            id,
            stream,
            tail,
            follow,
        } => follow::logs(c, id, &stream, tail, follow).await,
        TaskCmd::Artifacts { id, download, to } => match download {
            None => {
                let list = c.task_artifacts(id).await?;
                emit(ctx.out, &list, |list| {
                    let mut t = Table::new(&["name", "size"]);
                    for a in list {
                        t.row(vec![a.name.clone(), a.size.to_string()]);
                    }
                    t.render()
                })
            }
            Some(name) => {
                let bytes = c.task_artifact(id, &name).await?;
                let to = to.unwrap_or_else(|| {
                    std::path::PathBuf::from(name.rsplit('/').next().unwrap_or("artifact"))
                });
                if to.as_os_str() == "-" {
                    use std::io::Write;
                    std::io::stdout().write_all(&bytes)?;
                } else {
                    std::fs::write(&to, &bytes)
                        .with_context(|| format!("writing {}", to.display()))?;
                    eprintln!("wrote {} ({} bytes)", to.display(), bytes.len());
                }
                Ok(())
            }
        },
        TaskCmd::Cancel { id, reason } => {
            ctx.outcome(&c.cancel_task(id, reason.as_deref(), ctx.key()).await?)
        }
    }
}

/// Agent operations wait for grace periods and lease expiry: a longer timeout than reads.
fn agent_client(ctx: &Ctx) -> SquadronClient {
    SquadronClient::with_timeouts(
        ctx.client.endpoints().to_vec(),
        AGENT_CALL_TIMEOUT,
        squadron_client::CONNECT_TIMEOUT_DEFAULT,
    )
}

/// Longer than the node's relay timeout, so the node's own error arrives first.
const AGENT_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(320);

/// `squadron evidence`: one node's evidence, with the MCP denials of every member added up
/// (each node counts the checks it answered).
async fn project_evidence(ctx: &Ctx, args: EvidenceArgs) -> anyhow::Result<()> {
    let c = &ctx.client;
    let mut ev = c.project_evidence(&args.tenant, &args.project).await?;
    let status = c.cluster_status(Consistency::Stale).await?;
    let mut denied = 0;
    let mut asked = 0;
    for m in &status.members {
        let node = c.with_endpoints(vec![format!("http://{}", m.rest)]);
        match node.project_evidence(&args.tenant, &args.project).await {
            Ok(e) => {
                denied += e.unauthorized_mcp_denied;
                asked += 1;
            }
            Err(e) => eprintln!("member {} ({}) not counted: {e}", m.id, m.rest),
        }
    }
    if asked > 0 {
        ev.unauthorized_mcp_denied = denied;
    }
    emit_generic(ctx.out, &ev)
}
