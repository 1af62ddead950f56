//! Credentials (INV-13): an admin puts, lists, rotates and revokes, and names those an agent
//! profile is given; the worker running a task, or a profile's generation, takes its lease. The value is sealed here, under the cluster data key, before the
//! command is proposed — only ciphertext reaches the log — and opened here again for the one
//! worker the core granted it to.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{delete, get, post, put as put_route};
use axum::Json;
use squadron_api::{
    Access, AgentCredentialLeaseView, CredentialLeaseGrant, CredentialLeaseView, CredentialView,
    GrantAgentCredentialLease, GrantCredentialLease, LeasedValue, ProfileCredentialsView,
    PutCredential, PutCredentialEgress, RotateCredential, Scope, SetProfileCredentials,
};
use squadron_core::command as cmd;
use squadron_core::credential::SealedSecret;
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{CredentialId, IdempotencyKey, ProfileId, TaskId};
use squadron_core::response::GrantedCredential;
use squadron_core::{Command, Outcome};
use squadron_pki::DataKey;

use super::{
    body, json, parse_id, query, read, write, AppState, ConsistencyQuery, Input, JsonBody,
    QueryParams, RouteBook,
};
use crate::authz::Caller;
use crate::error::ApiError;
use crate::node::Consistency;

pub fn routes(book: RouteBook) -> RouteBook {
    book.add(
        "POST",
        "/api/v1/credentials",
        "Store a credential; the value is sealed under the cluster data key before it is replicated",
        body::<squadron_api::PutCredential>(),
        json::<Outcome>(),
        Access::admin(),
        post(put),
    )
    .add(
        "GET",
        "/api/v1/credentials",
        "List credentials (ids, versions, descriptions; never a value)",
        query::<ConsistencyQuery>(),
        json::<Vec<CredentialView>>(),
        Access::admin(),
        get(list),
    )
    .add(
        "POST",
        "/api/v1/credentials/:id/rotate",
        "Replace a credential's value; leases granted before keep their version",
        body::<squadron_api::RotateCredential>(),
        json::<Outcome>(),
        Access::admin(),
        post(rotate),
    )
    .add(
        "DELETE",
        "/api/v1/credentials/:id",
        "Revoke a credential: its value leaves the state and the leases holding it end",
        Input::NONE,
        json::<Outcome>(),
        Access::admin(),
        delete(revoke),
    )
    .add(
        "PUT",
        "/api/v1/credentials/:id/egress",
        "Inject a credential at egress: from the next lease on, the worker's proxy sends it to this upstream only, and it never enters a sandbox",
        body::<PutCredentialEgress>(),
        json::<Outcome>(),
        Access::admin(),
        put_route(set_egress),
    )
    .add(
        "DELETE",
        "/api/v1/credentials/:id/egress",
        "Stop injecting a credential at egress: from the next lease on, it is a file in the sandbox again",
        Input::NONE,
        json::<Outcome>(),
        Access::admin(),
        delete(clear_egress),
    )
    .add(
        "POST",
        "/api/v1/tasks/:id/credential-lease",
        "The worker running the task's attempt takes the values its manifest names",
        body::<squadron_api::GrantCredentialLease>(),
        json::<CredentialLeaseGrant>(),
        Access::worker_only(Scope::Body),
        post(grant),
    )
    .add(
        "GET",
        "/api/v1/tasks/:id/credential-leases",
        "A task's credential leases: versions, holders, when they ended (never a value)",
        query::<ConsistencyQuery>(),
        json::<Vec<CredentialLeaseView>>(),
        Access::viewer(Scope::Task),
        get(leases),
    )
    .add(
        "PUT",
        "/api/v1/profiles/:id/credentials",
        "Name the credentials the profile's providers are given, from its next generation on",
        body::<SetProfileCredentials>(),
        json::<Outcome>(),
        Access::admin(),
        put_route(set_profile_credentials),
    )
    .add(
        "GET",
        "/api/v1/profiles/:id/credentials",
        "The credentials a profile is given and its generations' leases (never a value)",
        query::<ConsistencyQuery>(),
        json::<ProfileCredentialsView>(),
        Access::viewer(Scope::Profile).and_workers(),
        get(profile_credentials),
    )
    .add(
        "POST",
        "/api/v1/profiles/:id/credential-lease",
        "The worker holding the profile's active lease takes the values for that generation",
        body::<GrantAgentCredentialLease>(),
        json::<CredentialLeaseGrant>(),
        Access::worker_only(Scope::Body),
        post(grant_agent),
    )
}

fn data_key(node: &AppState) -> Result<&DataKey, ApiError> {
    node.tls.data_key.as_ref().ok_or_else(|| {
        ApiError::new(
            ErrorCode::FailedPrecondition,
            format!(
                "node {} has no cluster data key (pki/{}): credentials cannot be sealed or \
                 opened here; copy the cluster's key there (squadron init --data-key)",
                node.id,
                squadron_pki::DATA_KEY_FILE_NAME
            ),
        )
    })
}

fn seal(node: &AppState, id: &CredentialId, value: &str) -> Result<SealedSecret, ApiError> {
    data_key(node)?
        .seal(id, value.as_bytes())
        .map_err(|e| ApiError::invalid("value", e.to_string()))
}

async fn put(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(b): JsonBody<PutCredential>,
) -> Result<Json<Outcome>, ApiError> {
    let sealed = seal(&node, &b.id, &b.value)?;
    let command = Command::PutCredential(cmd::PutCredential {
        id: b.id,
        description: b.description,
        sealed,
    });
    write(&node, &caller, &headers, command).await
}

async fn rotate(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<RotateCredential>,
) -> Result<Json<Outcome>, ApiError> {
    let id: CredentialId = parse_id("credential_id", &id)?;
    let sealed = seal(&node, &id, &b.value)?;
    let command = Command::RotateCredential(cmd::RotateCredential { id, sealed });
    write(&node, &caller, &headers, command).await
}

async fn revoke(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Outcome>, ApiError> {
    let id: CredentialId = parse_id("credential_id", &id)?;
    let command = Command::RevokeCredential(cmd::RevokeCredential { id });
    write(&node, &caller, &headers, command).await
}

async fn set_egress(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<PutCredentialEgress>,
) -> Result<Json<Outcome>, ApiError> {
    let id: CredentialId = parse_id("credential_id", &id)?;
    let command = Command::SetCredentialEgress(cmd::SetCredentialEgress {
        id,
        egress: Some(b.into()),
    });
    write(&node, &caller, &headers, command).await
}

async fn clear_egress(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Outcome>, ApiError> {
    let id: CredentialId = parse_id("credential_id", &id)?;
    let command = Command::SetCredentialEgress(cmd::SetCredentialEgress { id, egress: None });
    write(&node, &caller, &headers, command).await
}

async fn list(
    State(node): State<AppState>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<Vec<CredentialView>>, ApiError> {
    read(&node, q.consistency, |s| {
        let views = s.credentials().credentials().map(|c| CredentialView {
            id: c.id.clone(),
            version: c.version,
            description: c.description.clone(),
            created_at_ms: c.created_at_ms,
            created_by: c.created_by.clone(),
            updated_at_ms: c.updated_at_ms,
            revoked_at_ms: c.revoked_at_ms,
            egress: s.credential_egress(&c.id).cloned(),
        });
        Ok(Json(views.collect()))
    })
    .await
}

async fn grant(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<GrantCredentialLease>,
) -> Result<Json<CredentialLeaseGrant>, ApiError> {
    let task: TaskId = parse_id("task_id", &id)?;
    let key = super::idempotency_key(&headers)?;
    grant_lease(&node, &caller, key, task, b).await.map(Json)
}

/// Records the lease, then opens the values it grants with the cluster's data key (REST and
/// gRPC `WorkerControl`).
pub(crate) async fn grant_lease(
    node: &AppState,
    caller: &Caller,
    idempotency: Option<IdempotencyKey>,
    task: TaskId,
    b: GrantCredentialLease,
) -> Result<CredentialLeaseGrant, ApiError> {
    data_key(node)?;
    let command = match b.only_lease {
        None => Command::GrantCredentialLease(cmd::GrantCredentialLease {
            task,
            worker: b.worker,
            attempt: b.attempt,
        }),
        Some(only_lease) => Command::RegrantCredentialLease(cmd::RegrantCredentialLease {
            task,
            worker: b.worker,
            attempt: b.attempt,
            only_lease,
        }),
    };
    open_grant(node, caller, idempotency, command).await
}

/// Records the profile generation's lease, then opens its values (REST and gRPC
/// `WorkerControl`). The path's profile must be the one the fence names.
pub(crate) async fn grant_agent_lease(
    node: &AppState,
    caller: &Caller,
    idempotency: Option<IdempotencyKey>,
    profile: ProfileId,
    b: GrantAgentCredentialLease,
) -> Result<CredentialLeaseGrant, ApiError> {
    if b.fence.profile != profile {
        return Err(ApiError::invalid(
            "fence.profile",
            format!(
                "names profile {}, the request is for {profile}",
                b.fence.profile
            ),
        ));
    }
    let command = match b.only_lease {
        None => Command::GrantAgentCredentialLease(cmd::GrantAgentCredentialLease {
            fence: b.fence,
            worker: b.worker,
        }),
        Some(only_lease) => {
            Command::RegrantAgentCredentialLease(cmd::RegrantAgentCredentialLease {
                fence: b.fence,
                worker: b.worker,
                only_lease,
            })
        }
    };
    open_grant(node, caller, idempotency, command).await
}

/// Proposes a grant and opens the values it answers with the cluster's data key.
async fn open_grant(
    node: &AppState,
    caller: &Caller,
    idempotency: Option<IdempotencyKey>,
    command: Command,
) -> Result<CredentialLeaseGrant, ApiError> {
    let key = data_key(node)?;
    let outcome = super::write_keyed(node, caller.subject()?, idempotency, command).await?;
    let Outcome::CredentialLeaseGranted {
        lease,
        session,
        credentials,
    } = outcome
    else {
        return Err(ApiError::internal(format!(
            "unexpected outcome {outcome:?}"
        )));
    };
    let mut credentials: Vec<LeasedValue> = credentials
        .iter()
        .map(|g| open(key, g))
        .collect::<Result<_, _>>()?;
    // Read through the barrier: the grant is applied here, and so is every binding before it.
    read(node, Consistency::Linearizable, |s| {
        for value in &mut credentials {
            value.egress = s.credential_egress(&value.id).cloned();
        }
        Ok(())
    })
    .await?;
    Ok(CredentialLeaseGrant {
        lease,
        session,
        credentials,
    })
}

fn open(key: &DataKey, granted: &GrantedCredential) -> Result<LeasedValue, ApiError> {
    let plain = key
        .open(&granted.id, &granted.sealed)
        .map_err(|e| ApiError::new(ErrorCode::FailedPrecondition, e.to_string()))?;
    let value = std::str::from_utf8(&plain)
        .map_err(|_| ApiError::internal(format!("credential {} is not UTF-8", granted.id)))?
        .to_string();
    Ok(LeasedValue {
        id: granted.id.clone(),
        mount: granted.mount.clone(),
        version: granted.version,
        value,
        egress: None,
    })
}

async fn leases(
    State(node): State<AppState>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<Vec<CredentialLeaseView>>, ApiError> {
    let task: TaskId = parse_id("task_id", &id)?;
    read(&node, q.consistency, |s| {
        // A pruned task's leases stay listed for their own retention (a day after their end).
        if s.task_state(task).is_none() && !s.task_was_pruned(task) {
            return Err(ApiError::not_found(format!("task {task} not found")));
        }
        let views = s
            .credentials()
            .leases_of(task)
            .map(CredentialLeaseView::from);
        Ok(Json(views.collect()))
    })
    .await
}

async fn set_profile_credentials(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<SetProfileCredentials>,
) -> Result<Json<Outcome>, ApiError> {
    let profile: ProfileId = parse_id("profile_id", &id)?;
    let command = Command::SetProfileCredentials(cmd::SetProfileCredentials {
        profile,
        credential_refs: b.credential_refs,
    });
    write(&node, &caller, &headers, command).await
}

async fn profile_credentials(
    State(node): State<AppState>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ConsistencyQuery>,
) -> Result<Json<ProfileCredentialsView>, ApiError> {
    let profile: ProfileId = parse_id("profile_id", &id)?;
    read(&node, q.consistency, |s| {
        super::projects::profile_of(s, profile)?;
        let given = s.profile_credentials();
        Ok(Json(ProfileCredentialsView {
            profile,
            credential_refs: given.refs_of(profile).to_vec(),
            leases: given
                .leases_of(profile)
                .map(AgentCredentialLeaseView::from)
                .collect(),
        }))
    })
    .await
}

async fn grant_agent(
    State(node): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<GrantAgentCredentialLease>,
) -> Result<Json<CredentialLeaseGrant>, ApiError> {
    let profile: ProfileId = parse_id("profile_id", &id)?;
    let key = super::idempotency_key(&headers)?;
    grant_agent_lease(&node, &caller, key, profile, b)
        .await
        .map(Json)
}
