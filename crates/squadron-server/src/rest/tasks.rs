//! Tasks: submit (YAML or JSON manifest), list, get, cancel, and the worker's reports.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::Json;
use squadron_core::command as cmd;
use squadron_core::ids::TaskId;
use squadron_core::manifest::{parse_manifest_json, parse_manifest_yaml};
use squadron_core::task::{Task, TaskState};
use squadron_core::task_record::TaskRecord;
use squadron_core::{Command, Outcome};

use super::{
    body, json, parse_id, query, read, write, AppState, ConsistencyQuery, JsonBody, QueryParams,
    RouteBook,
};
use crate::authz::{AuthError, Caller};
use crate::error::ApiError;
use crate::node::Consistency;
use squadron_api::{
    Access, CancelQuery, ReportProgress, ReportTransition, Scope, TaskListQuery, TaskOrder,
    TaskPage,
};
use squadron_core::access::AgentIdentity;

use squadron_api::queries::TASK_LIST_LIMIT_DEFAULT;

pub fn routes(book: RouteBook) -> RouteBook {
    book.add(
        "POST",
        "/api/v1/tasks",
        "Submit a task manifest (YAML or JSON by Content-Type)",
        body::<squadron_core::manifest::TaskManifest>().or_yaml(),
        json::<Outcome>(),
        Access::operator(Scope::Body).and_agents(),
        post(submit),
    )
    .add(
        "GET",
        "/api/v1/tasks",
        "List tasks: ?state=RUNNING&parent=ID&after=ID&limit=N",
        query::<TaskListQuery>(),
        json::<TaskPage>(),
        Access::viewer(Scope::Unbound).and_agents(),
        get(list),
    )
    .add(
        "GET",
        "/api/v1/tasks/:id",
        "Get a task",
        query::<ConsistencyQuery>(),
        json::<Task>(),
        Access::viewer(Scope::Task).and_workers().and_agents(),
        get(get_task),
    )
    .add(
        "GET",
        "/api/v1/tasks/:id/agent",
        "The agent registered in the task's sandbox: when it registered, when it last checked in, \
         and what the sandbox uses (CPU, memory, disk); 404 before it registers and after the \
         attempt ends",
        query::<ConsistencyQuery>(),
        json::<squadron_core::agent_session::AgentSession>(),
        Access::viewer(Scope::Task).and_workers(),
        get(get_agent),
    )
    .add(
        "GET",
        "/api/v1/tasks/:id/provider",
        "What the provider CLI's own stream said of the current attempt's run, as its worker \
         last reported it: tool calls, the current tool, tokens, cost where stated; null before \
         the first report and for a provider without a stream (script)",
        query::<ConsistencyQuery>(),
        json::<Option<squadron_core::task::AttemptProviderProgress>>(),
        Access::viewer(Scope::Task).and_workers(),
        get(get_provider),
    )
    .add(
        "DELETE",
        "/api/v1/tasks/:id",
        "Cancel a task: a queued one ends at once, an assigned one is asked to stop",
        query::<CancelQuery>(),
        json::<Outcome>(),
        Access::operator(Scope::Task),
        axum::routing::delete(cancel),
    )
    .add(
        "POST",
        "/api/v1/tasks/:id/transitions",
        "A worker reports a lifecycle transition (INV-10)",
        body::<squadron_api::ReportTransition>(),
        json::<Outcome>(),
        Access::worker_only(Scope::Body),
        post(transition),
    )
    .add(
        "POST",
        "/api/v1/tasks/:id/progress",
        "A worker reports output counters and what the provider's own stream said so far",
        body::<squadron_api::ReportProgress>(),
        json::<Outcome>(),
        Access::worker_only(Scope::Body),
        post(progress),
    )
}

fn task_id(raw: &str) -> Result<TaskId, ApiError> {
    parse_id("task_id", raw)
}

async fn submit(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Outcome>, ApiError> {
    let text =
        std::str::from_utf8(&body).map_err(|_| ApiError::invalid("body", "must be UTF-8"))?;
    let is_json = match super::browser_guard::media_type(&headers).as_deref() {
        Some("application/json") => true,
        Some("application/yaml" | "application/x-yaml" | "text/yaml") => false,
        other => {
            return Err(super::browser_guard::unsupported(format!(
                "a manifest is application/json or application/yaml, got {}",
                other.map_or("no Content-Type".to_string(), |t| format!("{t:?}"))
            )))
        }
    };
    let spec = if is_json {
        parse_manifest_json(text)?
    } else {
        parse_manifest_yaml(text)?
    };
    let project = spec.placement.project();
    caller.require_project(project.as_ref().map(|(t, p)| (t, p)))?;
    // A typo in a credential id fails here, not when the sandbox starts (the grant checks
    // again: this node's view may be behind).
    let now_ms = node.clock.now_ms();
    read(&node, Consistency::Stale, |s| {
        s.check_credential_refs(&spec).map_err(ApiError::from)?;
        // Nothing is stored for a manifest no live worker would ever run.
        match squadron_core::worker_policy::no_worker_accepts(s, &spec, now_ms) {
            Some(refused) => Err(ApiError::invalid(refused.field, refused.reason)),
            None => Ok(()),
        }
    })
    .await?;
    write(
        &node,
        &caller,
        &headers,
        Command::SubmitTask(cmd::SubmitTask {
            spec: Box::new(spec),
        }),
    )
    .await
}

async fn list(
    State(node): State<AppState>,
    caller: Caller,
    QueryParams(q): QueryParams<TaskListQuery>,
) -> Result<Json<TaskPage>, ApiError> {
    let state = q
        .state
        .as_deref()
        .map(|s| TaskState::parse("state", s))
        .transpose()?;
    // In 1..=TASK_LIST_LIMIT_MAX: the query's decoder refused anything else.
    let limit = q.limit.unwrap_or(TASK_LIST_LIMIT_DEFAULT);
    let after = q.after.unwrap_or(0);
    let parent = q.parent.as_deref();
    let parent = parent
        .map(|raw| parse_id::<TaskId>("parent", raw))
        .transpose()?;
    if let Caller::Agent(me) = &caller {
        // An agent lists only the children of its own task.
        let own = matches!((me, parent), (AgentIdentity::Task(mine), Some(p)) if *mine == p);
        if !own {
            return Err(AuthError::Forbidden(format!(
                "agent {me} may list only its own task's children (?parent=<its task>)"
            ))
            .into());
        }
    }
    let before = q.before.unwrap_or(u64::MAX);
    read(&node, q.consistency, |s| {
        // Records are filtered by id, state and the caller's projects before the page's are
        // decoded: an ended task is held encoded, and a scoped caller may walk past many.
        let listed: Box<dyn Iterator<Item = (TaskId, &TaskRecord)>> = match (parent, q.order) {
            // The other bound ends the walk, not only filters it.
            (None, TaskOrder::Oldest) => Box::new(
                s.task_records_after(after)
                    .take_while(move |(id, _)| id.get() < before),
            ),
            (None, TaskOrder::Newest) => Box::new(
                s.task_records_before(before)
                    .take_while(move |(id, _)| id.get() > after),
            ),
            (Some(p), order) => {
                let children = s
                    .lineage()
                    .children(p)
                    .filter_map(|id| s.task_record(id).map(|r| (id, r)));
                match order {
                    TaskOrder::Oldest => Box::new(children),
                    TaskOrder::Newest => Box::new(children.collect::<Vec<_>>().into_iter().rev()),
                }
            }
        };
        let tasks: Vec<Task> = listed
            .filter(|(id, r)| {
                id.get() > after
                    && id.get() < before
                    && state.is_none_or(|st| r.state() == st)
                    && caller.sees(r.project())
            })
            .take(limit + 1)
            .map(|(_, r)| r.view().into_owned())
            .collect();
        let (tasks, next) = super::page(tasks, limit, |t| t.id.get());
        let (next_after, next_before) = match q.order {
            TaskOrder::Oldest => (next, None),
            TaskOrder::Newest => (None, next),
        };
        Ok(Json(TaskPage {
            tasks,
            next_after,
            next_before,
        }))
    })
    .await
}

async fn get_task(
    State(node): State<AppState>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<Task>, ApiError> {
    let id = task_id(&id)?;
    read(&node, q.consistency, |s| task_of(s, id).map(Json)).await
}

async fn get_provider(
    State(node): State<AppState>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<Option<squadron_core::task::AttemptProviderProgress>>, ApiError> {
    let id = task_id(&id)?;
    read(&node, q.consistency, |s| {
        let task = task_of(s, id)?;
        Ok(Json(
            s.provider_progress(id)
                .filter(|p| p.attempt == task.attempt)
                .cloned(),
        ))
    })
    .await
}

async fn get_agent(
    State(node): State<AppState>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<squadron_core::agent_session::AgentSession>, ApiError> {
    let id = task_id(&id)?;
    read(&node, q.consistency, |s| {
        task_of(s, id)?;
        s.agent_session(id)
            .copied()
            .map(Json)
            .ok_or_else(|| ApiError::not_found(format!("task {id} has no registered agent")))
    })
    .await
}

pub(crate) fn task_of(s: &squadron_core::State, id: TaskId) -> Result<Task, ApiError> {
    s.task(id)
        .map(Arc::unwrap_or_clone)
        .ok_or_else(|| task_not_found(s, id))
}

/// 404 for a task the state does not hold, saying whether it never existed or ended and was
/// pruned by the retention policy.
pub(crate) fn task_not_found(s: &squadron_core::State, id: TaskId) -> ApiError {
    if s.task_was_pruned(id) {
        ApiError::not_found(format!(
            "task {id} ended and was pruned by the retention policy \
             ([retention.terminal_tasks]); its logs and artifacts stay on its worker's disk"
        ))
    } else {
        ApiError::not_found(format!("task {id} not found"))
    }
}

async fn cancel(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<CancelQuery>,
) -> Result<Json<Outcome>, ApiError> {
    let task = task_id(&id)?;
    let reason = q.reason.unwrap_or_else(|| "cancelled by operator".into());
    write(
        &node,
        &caller,
        &headers,
        Command::CancelTask(cmd::CancelTask { task, reason }),
    )
    .await
}

async fn transition(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<ReportTransition>,
) -> Result<Json<Outcome>, ApiError> {
    let task = task_id(&id)?;
    write(
        &node,
        &caller,
        &headers,
        Command::ReportTransition(cmd::ReportTransition {
            task,
            worker: b.worker,
            attempt: b.attempt,
            from: b.from,
            to: b.to,
            detail: b.detail,
        }),
    )
    .await
}

async fn progress(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<ReportProgress>,
) -> Result<Json<Outcome>, ApiError> {
    let task = task_id(&id)?;
    write(
        &node,
        &caller,
        &headers,
        Command::ReportProgressV2(cmd::ReportProgressV2 {
            counts: cmd::ReportProgress {
                task,
                worker: b.worker,
                attempt: b.attempt,
                stdout_bytes: b.stdout_bytes,
                stderr_bytes: b.stderr_bytes,
                lines: b.lines,
                events: b.events,
            },
            provider: b.provider,
        }),
    )
    .await
}
