//! `squadron task`: submit, follow, list, inspect and cancel tasks.

use crate::progress::Progress;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use backon::{ConstantBuilder, RetryableWithContext};
use clap::Subcommand;
use squadron_client::{
    ArtifactEntry, ClientError, Consistency, TaskListQuery, TaskOrder, TaskPage,
};
use squadron_core::ids::TaskId;
use squadron_core::manifest::Keyword as _;
use squadron_core::task::{AttemptProviderProgress, Task, TaskState};
use squadron_core::worker::WorkerStatus;
use squadron_core::ValidationError;

use super::{read_input, Ctx};
use crate::follow;
use crate::output::{self, emit, Table};

/// Pause between two looks at a task `--wait` waits for.
const WAIT_POLL_MS: u64 = 500;

#[derive(Debug, Subcommand)]
pub enum TaskCmd {
    /// Submit a task manifest (YAML, or JSON when the file ends in .json or starts with `{`).
    Submit {
        /// The manifest file; `-` reads standard input.
        file: PathBuf,
        /// Wait until the task is terminal and print it (with --output json: the task as
        /// JSON, with `id`, `state`, `exit_code` and `artifacts`).
        #[arg(long)]
        wait: bool,
        /// Show state changes and live output until the task ends (implies --wait).
        #[arg(long)]
        follow: bool,
        /// Give up waiting after this many seconds.
        #[arg(long, value_name = "SECS", default_value_t = 600)]
        timeout: u64,
    },
    /// A task's output: stdout (default), stderr or events.
    Logs {
        id: TaskId,
        #[arg(long, default_value = "stdout", value_parser = ["stdout", "stderr", "events"])]
        stream: String,
        /// Only the last N lines.
        #[arg(long, value_name = "N")]
        tail: Option<u64>,
        /// Keep printing output as it arrives until the task ends.
        #[arg(long)]
        follow: bool,
    },
    /// List a task's artifacts, or download one with --download NAME.
    Artifacts {
        id: TaskId,
        #[arg(long, value_name = "NAME")]
        download: Option<String>,
        /// Where to write the download (default: the artifact's base name; `-` for stdout).
        #[arg(long, value_name = "PATH", requires = "download")]
        to: Option<PathBuf>,
    },
    /// List tasks, oldest first (`--newest` for newest first).
    List {
        #[arg(long, value_parser = parse_task_state)]
        state: Option<TaskState>,
        /// Only tasks with a larger id (the previous page's `next_after`).
        #[arg(long)]
        after: Option<u64>,
        /// Only tasks with a smaller id (the previous page's `next_before`).
        #[arg(long)]
        before: Option<u64>,
        /// Newest first.
        #[arg(long)]
        newest: bool,
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Show a task.
    Get { id: TaskId },
    /// Cancel a task.
    Cancel {
        id: TaskId,
        #[arg(long)]
        reason: Option<String>,
    },
}

pub async fn run(ctx: &Ctx, cmd: TaskCmd) -> anyhow::Result<()> {
    let c = &ctx.client;
    match cmd {
        TaskCmd::Submit {
            file,
            wait,
            follow,
            timeout,
        } => submit(ctx, &file, wait, follow, timeout).await,
        TaskCmd::List {
            state,
            after,
            before,
            newest,
            limit,
        } => {
            let query = TaskListQuery {
                state: state.map(|s| s.as_str().to_string()),
                after,
                before,
                order: if newest {
                    TaskOrder::Newest
                } else {
                    TaskOrder::Oldest
                },
                limit,
                parent: None,
                consistency: ctx.consistency,
            };
            let page = c.list_tasks(&query).await?;
            emit(ctx.out, &page, tasks_table)
        }
        TaskCmd::Get { id } => {
            let t = c.get_task(id, ctx.consistency).await?;
            // Shown in the table only: the JSON output stays the task record.
            let provider = c.task_provider(id, ctx.consistency).await.ok().flatten();
            emit(ctx.out, &t, |t| {
                let mut pairs = task_pairs(t);
                pairs.extend(provider_pairs(provider.as_ref()));
                output::key_values(&pairs)
            })
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
                emit(ctx.out, &list, |list| artifacts_table(list))
            }
            Some(name) => download_artifact(ctx, id, &name, to).await,
        },
        TaskCmd::Cancel { id, reason } => {
            ctx.outcome(&c.cancel_task(id, reason.as_deref(), ctx.key()).await?)
        }
    }
}

/// `task submit`: the outcome, or with `--wait`/`--follow` the task once it ended.
async fn submit(
    ctx: &Ctx,
    file: &std::path::Path,
    wait: bool,
    follow: bool,
    timeout: u64,
) -> anyhow::Result<()> {
    let c = &ctx.client;
    let text = read_input(file)?;
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
    let id = squadron_client::OutcomeExt::task_id(&out)
        .with_context(|| format!("unexpected answer to a submission: {out:?}"))?;
    eprintln!("submitted task {id}; waiting until it ends");
    warn_if_no_worker_offers(ctx, id, timeout).await;
    // Following prints the task's output instead.
    let progress = (!follow).then(|| Progress::start(ctx.out, format!("task {id}: submitted")));
    let t = wait_until_terminal(ctx, id, follow, progress.as_ref(), timeout).await?;
    if let Some(p) = progress {
        p.finish(format!("task {id}: {}", t.state));
    }
    emit(ctx.out, &t, |t| output::key_values(&task_pairs(t)))
}

/// A task whose runtime no live worker offers waits in PENDING until one registers: say so
/// up front rather than wait in silence. Best effort — a caller that may not list workers
/// (a scoped token) just waits.
async fn warn_if_no_worker_offers(ctx: &Ctx, id: TaskId, timeout: u64) {
    let c = &ctx.client;
    let (Ok(task), Ok(workers)) = (
        c.get_task(id, Consistency::Stale).await,
        c.list_workers(Consistency::Stale).await,
    ) else {
        return;
    };
    let runtime = task.spec.sandbox.runtime;
    let offered = workers
        .iter()
        .any(|w| w.status == WorkerStatus::Alive && w.runtimes.contains(&runtime));
    if !offered {
        eprintln!(
            "warning: no live worker offers the {} runtime; task {id} stays PENDING until one \
             registers (waiting up to --timeout {timeout} s)",
            runtime.as_str()
        );
    }
}

/// Why a look at a waited-for task did not end the wait.
enum Waiting {
    /// Not terminal yet, in this state.
    Running(TaskState),
    /// The look failed.
    Failed(ClientError),
}

/// Polls the task until it is terminal (showing its progress when following); a look that
/// reached no node is repeated until the deadline, as a node may be between leaders.
async fn wait_until_terminal(
    ctx: &Ctx,
    id: TaskId,
    follow: bool,
    progress: Option<&Progress>,
    timeout: u64,
) -> anyhow::Result<Task> {
    let c = &ctx.client;
    let consistency = ctx.consistency;
    let started = Instant::now();
    let limit = Duration::from_secs(timeout);
    let look = |mut follower: Option<follow::Follower>| async move {
        let seen = c.get_task(id, consistency).await;
        if let (Some(f), Ok(t)) = (follower.as_mut(), &seen) {
            f.show(c, t).await;
        }
        if let (Some(p), Ok(t)) = (progress, &seen) {
            p.say(format!("task {id}: {}", t.state));
        }
        let outcome = match seen {
            Ok(t) if t.state.is_terminal() => Ok(t),
            Ok(t) => Err(Waiting::Running(t.state)),
            Err(e) => Err(Waiting::Failed(e)),
        };
        (follower, outcome)
    };
    let polls = ConstantBuilder::default()
        .with_delay(Duration::from_millis(WAIT_POLL_MS))
        .with_max_times(usize::MAX);
    let (_, outcome) = look
        .retry(polls)
        .context(follow.then(|| follow::Follower::new(id)))
        .when(|w| {
            started.elapsed() < limit
                && match w {
                    Waiting::Running(_) => true,
                    Waiting::Failed(e) => e.is_transport(),
                }
        })
        .await;
    match outcome {
        Ok(t) => Ok(t),
        Err(Waiting::Running(state)) => {
            anyhow::bail!("task {id} is still {state} after {timeout} s (--timeout)")
        }
        Err(Waiting::Failed(e)) => Err(e.into()),
    }
}

async fn download_artifact(
    ctx: &Ctx,
    id: TaskId,
    name: &str,
    to: Option<PathBuf>,
) -> anyhow::Result<()> {
    let bytes = ctx.client.task_artifact(id, name).await?;
    let to = to.unwrap_or_else(|| PathBuf::from(name.rsplit('/').next().unwrap_or("artifact")));
    if to.as_os_str() == "-" {
        use std::io::Write;
        std::io::stdout().write_all(&bytes)?;
    } else {
        std::fs::write(&to, &bytes).with_context(|| format!("writing {}", to.display()))?;
        eprintln!("wrote {} ({} bytes)", to.display(), bytes.len());
    }
    Ok(())
}

fn tasks_table(page: &TaskPage) -> String {
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
    if let Some(next) = page.next_before {
        text.push_str(&format!("more: --newest --before {next}\n"));
    }
    text
}

fn artifacts_table(list: &[ArtifactEntry]) -> String {
    let mut t = Table::new(&["name", "size"]);
    for a in list {
        t.row(vec![a.name.clone(), a.size.to_string()]);
    }
    t.render()
}

fn task_pairs(t: &Task) -> Vec<(String, String)> {
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

/// The provider's own account of its run, when it gave one.
fn provider_pairs(p: Option<&AttemptProviderProgress>) -> Vec<(String, String)> {
    let Some(AttemptProviderProgress { attempt, progress }) = p else {
        return Vec::new();
    };
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    vec![
        (
            "tool_calls".into(),
            format!("{} (attempt {attempt})", progress.tool_calls),
        ),
        ("current_tool".into(), opt(&progress.current_tool)),
        (
            "tokens".into(),
            format!(
                "{} in, {} out",
                progress.input_tokens, progress.output_tokens
            ),
        ),
        (
            "cost_usd".into(),
            progress
                .cost_micro_usd
                .map_or("-".into(), |m| format!("{:.6}", m as f64 / 1e6)),
        ),
    ]
}

fn parse_task_state(s: &str) -> Result<TaskState, ValidationError> {
    TaskState::parse("state", s)
}
