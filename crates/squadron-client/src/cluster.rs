//! Health and cluster membership.

use reqwest::Method;

use crate::http::{Body, Call};
use crate::types::*;
use crate::{ClientError, Consistency, SquadronClient};

impl SquadronClient {
    /// `GET /readyz` on each endpoint in turn: the first node's text if it knows a leader.
    pub async fn ready(&self) -> Result<String, ClientError> {
        let (_, bytes) = self
            .call_bytes(
                Method::GET,
                "/readyz",
                Vec::new(),
                Body::Empty,
                Call::Read(Consistency::Stale),
            )
            .await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// One node's view of the cluster (the first endpoint that answers).
    pub async fn cluster_status(&self, c: Consistency) -> Result<ClusterStatus, ClientError> {
        self.get("/api/v1/cluster/status", c).await
    }

    pub async fn add_learner(&self, req: &AddLearner) -> Result<MembershipChanged, ClientError> {
        self.write(Method::POST, "/api/v1/cluster/learners", Some(req), None)
            .await
    }

    pub async fn promote_voter(&self, id: u64) -> Result<MembershipChanged, ClientError> {
        self.write(
            Method::POST,
            "/api/v1/cluster/voters",
            Some(&PromoteVoter { id }),
            None,
        )
        .await
    }

    pub async fn remove_member(&self, id: u64) -> Result<MembershipChanged, ClientError> {
        self.write::<MembershipChanged, ()>(
            Method::DELETE,
            &format!("/api/v1/cluster/members/{id}"),
            None,
            None,
        )
        .await
    }
}
