//! Worker registration, heartbeats, listing and decommission.

use reqwest::Method;
use squadron_core::ids::{IdempotencyKey, WorkerId};
use squadron_core::Outcome;

use crate::types::*;
use crate::{ClientError, Consistency, SquadronClient};
use squadron_core::worker::Worker;

impl SquadronClient {
    pub async fn register_worker(
        &self,
        req: &RegisterWorker,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post("/api/v1/workers", req, key).await
    }

    /// States what the worker agrees to run (its own certificate).
    pub async fn set_worker_policy(
        &self,
        worker: &WorkerId,
        policy: &squadron_core::worker_policy::WorkerPolicy,
    ) -> Result<Outcome, ClientError> {
        let path = format!("/api/v1/workers/{worker}/policy");
        self.write(Method::PUT, &path, Some(policy), None).await
    }

    pub async fn worker_heartbeat(
        &self,
        worker: &WorkerId,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.send_empty(
            Method::POST,
            &format!("/api/v1/workers/{worker}/heartbeat"),
            key,
        )
        .await
    }

    pub async fn list_workers(&self, c: Consistency) -> Result<Vec<Worker>, ClientError> {
        self.get("/api/v1/workers", c).await
    }

    pub async fn get_worker(
        &self,
        worker: &WorkerId,
        c: Consistency,
    ) -> Result<Worker, ClientError> {
        self.get(&format!("/api/v1/workers/{worker}"), c).await
    }

    pub async fn decommission_worker(
        &self,
        worker: &WorkerId,
        req: &Decommission,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/workers/{worker}/decommission"), req, key)
            .await
    }
}
