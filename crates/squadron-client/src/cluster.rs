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

    /// [`Self::cluster_status`] without the state digest (`digest` is empty): roles, leader,
    /// term and indexes only. The digest costs the node about as much as a snapshot; a poller
    /// asks for this.
    pub async fn cluster_status_without_digest(
        &self,
        c: Consistency,
    ) -> Result<ClusterStatus, ClientError> {
        let query = vec![("digest", "false".to_string())];
        let call = Call::Read(c);
        self.call(
            Method::GET,
            "/api/v1/cluster/status",
            query,
            Body::Empty,
            call,
        )
        .await
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
