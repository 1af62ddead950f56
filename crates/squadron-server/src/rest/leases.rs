//! Fenced operations: leases, takeovers, reap evidence, capsules and mailboxes.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::Json;
use squadron_api::leases::{
    AckMessages, AcquireLease, CommitCapsule, FenceLease, GracefulTakeover, LeaseFence,
    PostMessage, RecordEvidence, RenewLease, RenewLeases, Takeover, TakeoverEvidence,
};
use squadron_core::capsule::ContinuityCapsule;
use squadron_core::command as cmd;
use squadron_core::ids::{Generation, LeaseId, ProfileId, WorkerId};
use squadron_core::lease::{EvidenceSource, FencingToken, ReapEvidence, RuntimeLease};
use squadron_core::mailbox::Mailbox;
use squadron_core::{Command, Outcome};

use super::projects::{profile_id, project_key};
use super::{
    body, json, parse_id, query, read, write, AppState, ConsistencyQuery, JsonBody, QueryParams,
    RouteBook,
};
use crate::authz::Caller;
use crate::error::ApiError;
use squadron_api::{Access, Scope};

pub fn routes(book: RouteBook) -> RouteBook {
    continuity_routes(lease_routes(book))
}

/// Leases and what ends them: renewals, release, fencing, reap evidence, takeovers.
fn lease_routes(book: RouteBook) -> RouteBook {
    book.add(
        "POST",
        "/api/v1/profiles/:id/leases",
        "Acquire a lease: compare-and-swap on the expected generation, within project capacity",
        body::<AcquireLease>(),
        json::<Outcome>(),
        Access::operator(Scope::Profile).and_workers(),
        post(acquire),
    )
    .add(
        "GET",
        "/api/v1/leases/:id",
        "Get a lease",
        query::<ConsistencyQuery>(),
        json::<RuntimeLease>(),
        Access::viewer(Scope::Lease).and_workers(),
        get(get_lease),
    )
    .add(
        "GET",
        "/api/v1/projects/:tenant/:project/leases",
        "List the project's leases",
        query::<ConsistencyQuery>(),
        json::<Vec<RuntimeLease>>(),
        Access::viewer(Scope::Project).and_workers(),
        get(project_leases),
    )
    .add(
        "POST",
        "/api/v1/leases/:id/renew",
        "Heartbeat: renew the lease (fenced)",
        body::<RenewLease>(),
        json::<Outcome>(),
        Access::operator(Scope::Lease).and_workers(),
        post(renew),
    )
    .add(
        "POST",
        "/api/v1/leases/:id/release",
        "Release the lease (fenced); frees its slot",
        body::<LeaseFence>(),
        json::<Outcome>(),
        Access::operator(Scope::Lease).and_workers(),
        post(release),
    )
    .add(
        "POST",
        "/api/v1/leases/:id/fence",
        "Fence the lease (operator, or expired); it keeps its slot until reaped",
        body::<FenceLease>(),
        json::<Outcome>(),
        Access::operator(Scope::Lease),
        post(fence),
    )
    .add(
        "POST",
        "/api/v1/leases/:id/evidence",
        "Record reap evidence (cgroup populated 0) for the lease's generation",
        body::<RecordEvidence>(),
        json::<Outcome>(),
        Access::worker_only(Scope::Body),
        post(evidence),
    )
    .add(
        "POST",
        "/api/v1/workers/:id/renewals",
        "Renew every lease a worker holds in one command",
        body::<RenewLeases>(),
        json::<Outcome>(),
        Access::worker_only(Scope::Worker),
        post(renew_batch),
    )
    .add(
        "POST",
        "/api/v1/profiles/:id/takeover",
        "Graceful (capsule, fence, grant) or crash (expiry, evidence, grant) takeover",
        body::<Takeover>(),
        json::<Outcome>(),
        Access::operator(Scope::Profile).and_workers(),
        post(takeover),
    )
}

/// What a profile carries across generations: its capsule chain and its mailbox.
fn continuity_routes(book: RouteBook) -> RouteBook {
    book.add(
        "POST",
        "/api/v1/profiles/:id/capsules",
        "Commit a continuity capsule (fenced, chained)",
        body::<CommitCapsule>(),
        json::<Outcome>(),
        Access::operator(Scope::Profile).and_workers(),
        post(commit_capsule),
    )
    .add(
        "GET",
        "/api/v1/profiles/:id/capsules",
        "The profile's recent capsules, oldest first",
        query::<ConsistencyQuery>(),
        json::<Vec<ContinuityCapsule>>(),
        Access::viewer(Scope::Profile).and_workers(),
        get(capsules),
    )
    .add(
        "POST",
        "/api/v1/profiles/:id/mailbox",
        "Post a message to the profile's mailbox",
        body::<PostMessage>(),
        json::<Outcome>(),
        Access::operator(Scope::Profile).and_workers(),
        post(post_message),
    )
    .add(
        "GET",
        "/api/v1/profiles/:id/mailbox",
        "Read the profile's mailbox",
        query::<ConsistencyQuery>(),
        json::<Mailbox>(),
        Access::viewer(Scope::Profile).and_workers(),
        get(mailbox),
    )
    .add(
        "POST",
        "/api/v1/profiles/:id/mailbox/ack",
        "Acknowledge messages through a sequence (fenced)",
        body::<AckMessages>(),
        json::<Outcome>(),
        Access::operator(Scope::Profile).and_workers(),
        post(ack),
    )
}

fn lease_id(raw: &str) -> Result<LeaseId, ApiError> {
    parse_id("lease_id", raw)
}

async fn acquire(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<AcquireLease>,
) -> Result<Json<Outcome>, ApiError> {
    let command = acquire_command(profile_id(&id)?, b);
    write(&node, &caller, &headers, command).await
}

/// The command REST and gRPC (`WorkerControl`) propose for an acquire.
pub(crate) fn acquire_command(profile: ProfileId, b: AcquireLease) -> Command {
    Command::AcquireLease(cmd::AcquireLease {
        profile,
        expected_generation: b.expected_generation,
        provider: b.provider,
        holder: b.holder,
        ttl_ms: b.ttl_ms,
    })
}

async fn get_lease(
    State(node): State<AppState>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<RuntimeLease>, ApiError> {
    let id = lease_id(&id)?;
    read(&node, q.consistency, |s| lease_of(s, id).map(Json)).await
}

pub(crate) fn lease_of(s: &squadron_core::State, id: LeaseId) -> Result<RuntimeLease, ApiError> {
    s.lease(id)
        .cloned()
        .ok_or_else(|| ApiError::not_found(format!("lease {id} not found")))
}

async fn project_leases(
    State(node): State<AppState>,
    Path((tenant, project)): Path<(String, String)>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<Vec<RuntimeLease>>, ApiError> {
    let (tenant, project) = project_key(&tenant, &project)?;
    read(&node, q.consistency, |s| {
        Ok(Json(
            s.leases()
                .filter(|l| l.tenant == tenant && l.project == project)
                .cloned()
                .collect(),
        ))
    })
    .await
}

/// The fencing triple of a lease route: the lease from the path, the rest from the body.
fn token(profile: ProfileId, lease: LeaseId, generation: Generation) -> FencingToken {
    FencingToken {
        profile,
        lease,
        generation,
    }
}

async fn renew(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<RenewLease>,
) -> Result<Json<Outcome>, ApiError> {
    let fence = token(b.profile, lease_id(&id)?, b.generation);
    write(
        &node,
        &caller,
        &headers,
        Command::RenewLease(cmd::RenewLease {
            fence,
            ttl_ms: b.ttl_ms,
        }),
    )
    .await
}

async fn release(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<LeaseFence>,
) -> Result<Json<Outcome>, ApiError> {
    let command = release_command(lease_id(&id)?, b);
    write(&node, &caller, &headers, command).await
}

pub(crate) fn release_command(lease: LeaseId, b: LeaseFence) -> Command {
    let fence = token(b.profile, lease, b.generation);
    Command::ReleaseLease(cmd::ReleaseLease { fence })
}

async fn fence(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<FenceLease>,
) -> Result<Json<Outcome>, ApiError> {
    let fence = token(b.profile, lease_id(&id)?, b.generation);
    write(
        &node,
        &caller,
        &headers,
        Command::FenceLease(cmd::FenceLease {
            fence,
            reason: b.reason,
        }),
    )
    .await
}

async fn evidence(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<RecordEvidence>,
) -> Result<Json<Outcome>, ApiError> {
    let lease = lease_id(&id)?;
    let evidence = TakeoverEvidence {
        cgroup: b.cgroup,
        populated: b.populated,
        observed_at_ms: b.observed_at_ms,
    };
    write(
        &node,
        &caller,
        &headers,
        Command::RecordReapEvidence(cmd::RecordReapEvidence {
            profile: b.profile,
            evidence: reap_evidence(evidence, lease, b.generation),
        }),
    )
    .await
}

async fn renew_batch(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(worker): Path<String>,
    JsonBody(b): JsonBody<RenewLeases>,
) -> Result<Json<Outcome>, ApiError> {
    let worker: WorkerId = parse_id("worker", &worker)?;
    write(
        &node,
        &caller,
        &headers,
        Command::RenewLeases(cmd::RenewLeases {
            worker,
            fences: b.fences,
            ttl_ms: b.ttl_ms,
        }),
    )
    .await
}

/// Evidence from a worker's cgroup watch, for `lease`'s `generation`.
fn reap_evidence(e: TakeoverEvidence, lease: LeaseId, generation: Generation) -> ReapEvidence {
    ReapEvidence {
        lease,
        generation,
        cgroup: e.cgroup,
        populated: e.populated,
        observed_at_ms: e.observed_at_ms,
        source: EvidenceSource::CgroupEvents,
    }
}

async fn takeover(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<Takeover>,
) -> Result<Json<Outcome>, ApiError> {
    let command = takeover_command(profile_id(&id)?, b);
    write(&node, &caller, &headers, command).await
}

pub(crate) fn takeover_command(profile: ProfileId, b: Takeover) -> Command {
    match b {
        Takeover::Graceful(g) => {
            let GracefulTakeover {
                lease,
                generation,
                capsule,
                next,
                old_reap_evidence,
            } = *g;
            Command::GracefulTakeover(cmd::GracefulTakeover {
                fence: token(profile, lease, generation),
                capsule,
                next,
                old_reap_evidence: old_reap_evidence.map(|e| reap_evidence(e, lease, generation)),
            })
        }
        Takeover::Crash(c) => Command::CrashTakeover(cmd::CrashTakeover {
            profile,
            lease: c.lease,
            generation: c.generation,
            next: c.next,
            reap_evidence: c
                .reap_evidence
                .map(|e| reap_evidence(e, c.lease, c.generation)),
        }),
    }
}

async fn commit_capsule(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<CommitCapsule>,
) -> Result<Json<Outcome>, ApiError> {
    let profile = profile_id(&id)?;
    write(&node, &caller, &headers, commit_capsule_command(profile, b)).await
}

pub(crate) fn commit_capsule_command(profile: ProfileId, b: CommitCapsule) -> Command {
    Command::CommitCapsule(cmd::CommitCapsule {
        fence: token(profile, b.lease, b.generation),
        capsule: b.capsule,
    })
}

async fn capsules(
    State(node): State<AppState>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<Vec<ContinuityCapsule>>, ApiError> {
    let id = profile_id(&id)?;
    read(&node, q.consistency, |s| capsules_of(s, id).map(Json)).await
}

pub(crate) fn capsules_of(
    s: &squadron_core::State,
    id: ProfileId,
) -> Result<Vec<ContinuityCapsule>, ApiError> {
    s.profile(id)
        .map(|p| p.capsules.iter().cloned().collect())
        .ok_or_else(|| ApiError::not_found(format!("profile {id} not found")))
}

async fn post_message(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<PostMessage>,
) -> Result<Json<Outcome>, ApiError> {
    let to = profile_id(&id)?;
    write(
        &node,
        &caller,
        &headers,
        Command::PostMessage(cmd::PostMessage {
            to,
            sender: b.sender,
            kind: b.kind,
            body: b.body,
        }),
    )
    .await
}

async fn mailbox(
    State(node): State<AppState>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<Mailbox>, ApiError> {
    let id = profile_id(&id)?;
    read(&node, q.consistency, |s| mailbox_of(s, id).map(Json)).await
}

pub(crate) fn mailbox_of(s: &squadron_core::State, id: ProfileId) -> Result<Mailbox, ApiError> {
    s.mailbox(id)
        .cloned()
        .ok_or_else(|| ApiError::not_found(format!("profile {id} not found")))
}

async fn ack(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<AckMessages>,
) -> Result<Json<Outcome>, ApiError> {
    let command = ack_command(profile_id(&id)?, b);
    write(&node, &caller, &headers, command).await
}

pub(crate) fn ack_command(profile: ProfileId, b: AckMessages) -> Command {
    Command::AckMessages(cmd::AckMessages {
        fence: token(profile, b.lease, b.generation),
        through_seq: b.through_seq,
    })
}
