//! Tasks: submission, listing, output and artifacts relayed from the worker, cancel, and the
//! worker's reports.

use reqwest::Method;
use squadron_core::ids::{IdempotencyKey, TaskId};
use squadron_core::Outcome;

use crate::http::{segment, Body, Call};
use crate::types::*;
use crate::{ClientError, Consistency, SquadronClient};
use squadron_core::task::Task;

impl SquadronClient {
    /// Submits a manifest written in YAML.
    pub async fn submit_task_yaml(
        &self,
        manifest: &str,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.call(
            Method::POST,
            "/api/v1/tasks",
            Vec::new(),
            Body::Text("application/yaml", manifest.to_string()),
            Call::Write(key),
        )
        .await
    }

    /// Submits a manifest written in JSON.
    pub async fn submit_task_json(
        &self,
        manifest: &str,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.call(
            Method::POST,
            "/api/v1/tasks",
            Vec::new(),
            Body::Text("application/json", manifest.to_string()),
            Call::Write(key),
        )
        .await
    }

    /// A page of `GET /api/v1/tasks`, read with the query's consistency.
    pub async fn list_tasks(&self, q: &TaskListQuery) -> Result<TaskPage, ClientError> {
        let mut query = Vec::new();
        if let Some(state) = &q.state {
            query.push(("state", state.clone()));
        }
        if let Some(after) = q.after {
            query.push(("after", after.to_string()));
        }
        if let Some(before) = q.before {
            query.push(("before", before.to_string()));
        }
        if q.order == TaskOrder::Newest {
            query.push(("order", "newest".into()));
        }
        if let Some(limit) = q.limit {
            query.push(("limit", limit.to_string()));
        }
        if let Some(parent) = &q.parent {
            query.push(("parent", parent.clone()));
        }
        self.call(
            Method::GET,
            "/api/v1/tasks",
            query,
            Body::Empty,
            Call::Read(q.consistency),
        )
        .await
    }

    pub async fn get_task(&self, task: TaskId, c: Consistency) -> Result<Task, ClientError> {
        self.get(&format!("/api/v1/tasks/{task}"), c).await
    }

    /// What the task's provider CLI said of its current attempt's run (tool calls, current
    /// tool, tokens), as its worker last reported it; `None` before the first report.
    pub async fn task_provider(
        &self,
        task: TaskId,
        c: Consistency,
    ) -> Result<Option<squadron_core::task::AttemptProviderProgress>, ClientError> {
        self.get(&format!("/api/v1/tasks/{task}/provider"), c).await
    }

    /// A slice of a task's output, relayed from its worker: `stream` is `stdout`, `stderr` or
    /// `events`; `offset` starts at a byte, `tail` at the last lines (give one or neither).
    pub async fn task_logs(
        &self,
        task: TaskId,
        stream: &str,
        offset: Option<u64>,
        tail: Option<u64>,
    ) -> Result<Vec<u8>, ClientError> {
        let mut query = vec![("stream", stream.to_string())];
        if let Some(o) = offset {
            query.push(("offset", o.to_string()));
        }
        if let Some(t) = tail {
            query.push(("tail", t.to_string()));
        }
        let path = format!("/api/v1/tasks/{task}/logs");
        self.call_bytes(
            Method::GET,
            &path,
            query,
            Body::Empty,
            Call::Read(Consistency::Linearizable),
        )
        .await
        .map(|(_, b)| b)
    }

    /// The artifacts a task's worker holds for it.
    pub async fn task_artifacts(&self, task: TaskId) -> Result<Vec<ArtifactEntry>, ClientError> {
        self.get(
            &format!("/api/v1/tasks/{task}/artifacts"),
            Consistency::Linearizable,
        )
        .await
    }

    /// One artifact's bytes.
    pub async fn task_artifact(&self, task: TaskId, name: &str) -> Result<Vec<u8>, ClientError> {
        let encoded: Vec<String> = name.split('/').map(segment).collect();
        let path = format!("/api/v1/tasks/{task}/artifacts/{}", encoded.join("/"));
        self.call_bytes(
            Method::GET,
            &path,
            Vec::new(),
            Body::Empty,
            Call::Read(Consistency::Linearizable),
        )
        .await
        .map(|(_, b)| b)
    }

    /// Cancels a task: a queued one ends at once, an assigned one is asked to stop.
    pub async fn cancel_task(
        &self,
        task: TaskId,
        reason: Option<&str>,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        let query = reason
            .map(|r| vec![("reason", r.to_string())])
            .unwrap_or_default();
        self.call(
            Method::DELETE,
            &format!("/api/v1/tasks/{task}"),
            query,
            Body::Empty,
            Call::Write(key),
        )
        .await
    }

    /// A worker reports a lifecycle transition.
    pub async fn report_transition(
        &self,
        task: TaskId,
        req: &ReportTransition,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/tasks/{task}/transitions"), req, key)
            .await
    }

    /// A worker reports output counters.
    pub async fn report_progress(
        &self,
        task: TaskId,
        req: &ReportProgress,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/tasks/{task}/progress"), req, key)
            .await
    }
}
