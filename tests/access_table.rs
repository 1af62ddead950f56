//! The trust boundary's table, walked: every route of the OpenAPI document and every gRPC
//! method, called with no credential, bad tokens, each role (in and out of scope), two
//! workers' certificates, two agents' certificates and a node's, and each answer checked
//! against what the route's published rule (`x-squadron-access`) says — computed here by a
//! second, independent reading of the rule (the reference model).

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use squadron_pki::{AgentSubject, SpiffeId};
use support::*;

/// What a probe presents.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cred {
    Nothing,
    /// A well-formed token no cluster issued.
    UnknownToken,
    /// An `Authorization` header that is not a bearer token.
    Malformed,
    Token {
        role: &'static str,
        /// `None`: unscoped; `Some(true)`: scoped to the fixtures' project; `Some(false)`:
        /// scoped to another tenant.
        in_scope: Option<bool>,
        secret: String,
    },
    Worker(&'static str),
    AgentOfTask(u64),
    AgentOfProfile(u64, u64),
    Node,
}

/// The objects the probes name.
#[derive(Debug, Clone)]
struct Fixtures {
    profile: u64,
    lease: u64,
    generation: u64,
    /// A dedicated task, its child (submitted by its agent), and an unrelated task.
    task: u64,
    child: u64,
    other_task: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Allowed,
    Unauthenticated,
    Forbidden,
}

fn verdict_of((status, body): (u16, String)) -> Verdict {
    match status {
        401 => Verdict::Unauthenticated,
        // The MCP check's own answer for a profile without the relation (INV-14) comes from
        // an admitted call.
        403 if body.contains("has no mcp_server:use relation") => Verdict::Allowed,
        403 => Verdict::Forbidden,
        _ => Verdict::Allowed,
    }
}

/// The reference model: what the rule says for this credential and this object.
fn expected(access: &Value, cred: &Cred, path: &str, task: Option<u64>, fx: &Fixtures) -> Verdict {
    if access["public"] == json!(true) {
        return Verdict::Allowed;
    }
    let scope = access["scope"].as_str().expect("scope");
    let allow = |yes: bool| {
        if yes {
            Verdict::Allowed
        } else {
            Verdict::Forbidden
        }
    };
    match cred {
        Cred::Nothing | Cred::UnknownToken | Cred::Malformed => Verdict::Unauthenticated,
        Cred::Node => Verdict::Forbidden,
        Cred::Token { role, in_scope, .. } => {
            let rank = |r: &str| ["viewer", "operator", "admin"].iter().position(|x| *x == r);
            let Some(needed) = access["role"].as_str() else {
                return Verdict::Forbidden;
            };
            if rank(role) < rank(needed) {
                return Verdict::Forbidden;
            }
            match in_scope {
                None => Verdict::Allowed,
                Some(inside) => match scope {
                    "unbound" | "body" => Verdict::Allowed,
                    "project" | "profile" | "lease" => allow(*inside),
                    // Dedicated tasks and cluster-wide routes are beyond any scoped token.
                    _ => Verdict::Forbidden,
                },
            }
        }
        Cred::Worker(w) => {
            if access["worker"] != json!(true) {
                return Verdict::Forbidden;
            }
            allow(scope != "worker" || *w == "w1")
        }
        Cred::AgentOfTask(t) => {
            if access["agent"] != json!(true) {
                return Verdict::Forbidden;
            }
            match scope {
                "task" => allow(task == Some(*t) || (*t == fx.task && task == Some(fx.child))),
                "body" => Verdict::Allowed,
                // The task listing, probed with ?parent=<fixture task>.
                "unbound" => allow(path == "/api/v1/tasks" && *t == fx.task),
                _ => Verdict::Forbidden,
            }
        }
        Cred::AgentOfProfile(p, _) => {
            if access["agent"] != json!(true) {
                return Verdict::Forbidden;
            }
            match scope {
                "profile" => allow(*p == fx.profile),
                "body" => Verdict::Allowed,
                _ => Verdict::Forbidden,
            }
        }
    }
}

fn agent_for_cred(cred: &Cred, url: &str) -> ureq::Agent {
    let presenting = |id: SpiffeId| agent_with(pki().presenting_id(&id));
    match cred {
        Cred::Worker(w) => presenting(SpiffeId::Worker(w.parse().expect("worker id"))),
        Cred::AgentOfTask(t) => presenting(SpiffeId::Agent(AgentSubject::Task(*t))),
        Cred::AgentOfProfile(p, g) => {
            presenting(SpiffeId::Agent(AgentSubject::ProfileGeneration {
                profile: *p,
                generation: *g,
            }))
        }
        Cred::Node => node_agent(),
        _ => agent_with(pki().operator_for(url)),
    }
}

fn probe(agent: &ureq::Agent, cred: &Cred, method: &str, url: &str) -> (u16, String) {
    let mut req = agent.request(method, url).timeout(Duration::from_secs(20));
    match cred {
        Cred::UnknownToken => {
            let fake = format!("sqd_op_{}_{}", "0".repeat(16), "0".repeat(64));
            req = req.set("Authorization", &format!("Bearer {fake}"));
        }
        Cred::Malformed => req = req.set("Authorization", "Basic YWRtaW46YWRtaW4="),
        Cred::Token { secret, .. } => req = req.set("Authorization", &format!("Bearer {secret}")),
        _ => {}
    }
    let res = if method == "POST" || method == "PUT" {
        // An invalid body: an admitted call is refused by its handler (400), never run.
        req.set("Content-Type", "application/json")
            .send_string("{\"probe\": true}")
    } else {
        req.call()
    };
    match res {
        Ok(r) => (r.status(), String::new()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{method} {url}: no answer: {e}"),
    }
}

fn dedicated_task(url: &str, name: &str) -> u64 {
    let r = submit_yaml(url, &inert_manifest(name, "process"));
    assert!(r.ok(), "submission refused: {r:?}");
    r.body["task_submitted"]["task"].as_u64().expect("task id")
}

/// The child of `parent`, submitted by the parent's agent under its certificate.
fn child_task(url: &str, parent: u64) -> u64 {
    let agent = agent_with(pki().presenting_id(&SpiffeId::Agent(AgentSubject::Task(parent))));
    let r = reply(
        agent
            .post(&format!("{url}/api/v1/tasks"))
            .set("Content-Type", "application/yaml")
            .send_string(&inert_manifest("child", "process")),
    )
    .expect("answer");
    assert!(r.ok(), "an agent's child task was refused: {r:?}");
    r.body["task_submitted"]["task"].as_u64().expect("task id")
}

fn fixtures(url: &str) -> Fixtures {
    let profile = setup_project(url, "p", 1, 4)[0];
    let r = post(
        &format!("{url}/api/v1/profiles/{profile}/leases"),
        acquire_body(0),
    )
    .expect("acquire");
    assert!(r.ok(), "{r:?}");
    let grant = &r.body["lease_granted"];
    let task = dedicated_task(url, "parent");
    Fixtures {
        profile,
        lease: grant["lease"].as_u64().expect("lease"),
        generation: grant["generation"].as_u64().expect("generation"),
        task,
        child: child_task(url, task),
        other_task: dedicated_task(url, "other"),
    }
}

fn credentials(url: &str, fx: &Fixtures) -> Vec<Cred> {
    let admin = pki().token_for(url).expect("admin token");
    let inside = json!([{"tenant": "acme", "project": "p"}]);
    let outside = json!([{"tenant": "zeta"}]);
    vec![
        Cred::Nothing,
        Cred::UnknownToken,
        Cred::Malformed,
        Cred::Token {
            role: "admin",
            in_scope: None,
            secret: admin,
        },
        Cred::Token {
            role: "viewer",
            in_scope: None,
            secret: operator_token(url, "v", "viewer", json!([])),
        },
        Cred::Token {
            role: "viewer",
            in_scope: Some(true),
            secret: operator_token(url, "vin", "viewer", inside.clone()),
        },
        Cred::Token {
            role: "operator",
            in_scope: Some(true),
            secret: operator_token(url, "oin", "operator", inside),
        },
        Cred::Token {
            role: "operator",
            in_scope: Some(false),
            secret: operator_token(url, "oout", "operator", outside),
        },
        Cred::Worker("w1"),
        Cred::Worker("w2"),
        Cred::AgentOfTask(fx.task),
        Cred::AgentOfTask(fx.other_task),
        Cred::AgentOfProfile(fx.profile, fx.generation),
        Cred::AgentOfProfile(fx.profile + 1000, 1),
        Cred::Node,
    ]
}

/// The concrete URLs of a route template, with the task a task-scoped one names.
fn instances(template: &str, scope: &str, fx: &Fixtures) -> Vec<(String, Option<u64>)> {
    let fill = |id: String| {
        template
            .replace("{tenant}", "acme")
            .replace("{project}", "p")
            .replace("{server}", "mcp-probe")
            .replace("{sandbox_ref}", "sb-none")
            .replace("{name}", "none.txt")
            .replace("{id}", &id)
    };
    let with_query = |u: String| {
        if template == "/api/v1/tasks" {
            format!("{u}?parent={}", fx.task)
        } else {
            u
        }
    };
    match scope {
        "task" => [fx.task, fx.child, fx.other_task]
            .iter()
            .map(|t| (fill(t.to_string()), Some(*t)))
            .collect(),
        "profile" => vec![(fill(fx.profile.to_string()), None)],
        "lease" => vec![(fill(fx.lease.to_string()), None)],
        "worker" => vec![(fill("w1".into()), None)],
        // Cluster routes with an id name a member or a token that does not exist.
        _ if template.contains("/tokens/") => vec![(fill("0".repeat(16)), None)],
        _ => vec![(with_query(fill("99".into())), None)],
    }
}

#[test]
fn every_route_and_method_answers_as_its_rule_says() {
    let cluster = Cluster::start(1);
    cluster.wait_for_leader(Duration::from_secs(20));
    let url = cluster.url(1);
    let fx = fixtures(&url);
    let creds = credentials(&url, &fx);
    let doc = http_get(&format!("{url}/api/v1/openapi.json")).expect("document");
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() > 40, "the document lists {} paths", paths.len());
    let mut mismatches = Vec::new();
    let mut probes = 0;
    let agents: BTreeMap<usize, ureq::Agent> = creds
        .iter()
        .enumerate()
        .map(|(i, c)| (i, agent_for_cred(c, &url)))
        .collect();
    for (template, ops) in paths {
        for (method, op) in ops.as_object().expect("operations") {
            let access = &op["x-squadron-access"];
            assert!(access.is_object(), "{method} {template} has no access rule");
            let scope = access["scope"].as_str().expect("scope");
            for (instance, task) in instances(template, scope, &fx) {
                for (i, cred) in creds.iter().enumerate() {
                    let method = method.to_uppercase();
                    let got = verdict_of(probe(
                        &agents[&i],
                        cred,
                        &method,
                        &format!("{url}{instance}"),
                    ));
                    let want = expected(access, cred, template, task, &fx);
                    probes += 1;
                    if got != want {
                        mismatches.push(format!(
                            "{method} {instance} as {cred:?}: got {got:?}, the rule says {want:?}"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {probes} probes disagree with the table:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    eprintln!("{probes} REST probes agree with the access table");
    grpc_methods_answer_as_their_rules_say(&cluster, &fx);
}

/// Each gRPC method with each certificate (the listener takes no bearer token: an operator
/// without a certificate cannot complete the handshake).
fn grpc_methods_answer_as_their_rules_say(cluster: &Cluster, fx: &Fixtures) {
    use squadron_proto::v1 as pb;
    use squadron_proto::v1::agent_service_client::AgentServiceClient;
    use squadron_proto::v1::worker_service_client::WorkerServiceClient;

    let addr = cluster.nodes[&1].spec.grpc.clone();
    let dir = cluster.dir.path().join("grpc-ids");
    let ids = [
        SpiffeId::Worker("w1".parse().expect("id")),
        SpiffeId::Worker("w2".parse().expect("id")),
        SpiffeId::Agent(AgentSubject::Task(fx.task)),
        SpiffeId::Agent(AgentSubject::ProfileGeneration {
            profile: fx.profile,
            generation: fx.generation,
        }),
        SpiffeId::Agent(AgentSubject::ProfileGeneration {
            profile: fx.profile,
            generation: fx.generation + 7,
        }),
        SpiffeId::Node(999),
    ];
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let fence = pb::FencingToken {
        profile: fx.profile,
        lease: fx.lease,
        generation: fx.generation,
    };
    let mut probes = 0;
    let mut probed = std::collections::BTreeSet::new();
    for (i, id) in ids.iter().enumerate() {
        let identity = pki().issue_identity(id, &dir.join(i.to_string()), "id");
        let credentials = squadron_client::Credentials::identity(identity);
        rt.block_on(async {
            let connector = credentials.grpc_connector().expect("tls").expect("connector");
            let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
                .expect("endpoint")
                .connect_with_connector(connector)
                .await
                .expect("TLS connect");
            let mut w = WorkerServiceClient::new(channel.clone());
            let channel_for_control = channel.clone();
            let mut a = AgentServiceClient::new(channel);
            let worker = "w1".to_string();
            let is_w1 = matches!(id, SpiffeId::Worker(w) if w.as_str() == "w1");
            let own_agent = matches!(id, SpiffeId::Agent(AgentSubject::ProfileGeneration { profile, generation }) if *profile == fx.profile && *generation == fx.generation);
            let own_task = matches!(id, SpiffeId::Agent(AgentSubject::Task(t)) if *t == fx.task);
            let own_profile = matches!(id, SpiffeId::Agent(AgentSubject::ProfileGeneration { profile, .. }) if *profile == fx.profile);
            // A lease the profile does not hold: the fenced calls are refused by the state,
            // not the rule, and change nothing.
            let answers: Vec<(&str, Result<(), tonic::Status>, bool)> = vec![
                ("WorkerService/Register", w.register(pb::RegisterWorkerRequest { worker: worker.clone(), address: "127.0.0.1:1".into(), runtimes: vec!["process".into()], capacity: 8, labels: Default::default(), heartbeat_interval_ms: 600_000, policy: None }).await.map(|_| ()), is_w1),
                ("WorkerService/Heartbeat", w.heartbeat(pb::WorkerHeartbeatRequest { worker: worker.clone() }).await.map(|_| ()), is_w1),
                ("WorkerService/SetWorkerPolicy", w.set_worker_policy(pb::SetWorkerPolicyRequest { worker: worker.clone(), policy: Some((&squadron_core::worker_policy::WorkerPolicy::default()).into()) }).await.map(|_| ()), is_w1),
                ("WorkerService/WatchAssignments", w.watch_assignments(pb::WatchAssignmentsRequest { worker: worker.clone() }).await.map(|_| ()), is_w1),
                ("WorkerService/ReportTransition", w.report_transition(pb::ReportTransitionRequest { task: fx.task, worker: worker.clone(), attempt: 1, from: "STAGING".into(), to: "PROVISIONING".into(), ..Default::default() }).await.map(|_| ()), is_w1),
                ("WorkerService/ReportProgress", w.report_progress(pb::ReportProgressRequest { task: fx.task, worker: worker.clone(), attempt: 1, ..Default::default() }).await.map(|_| ()), is_w1),
                ("WorkerService/RenewLeases", w.renew_leases(pb::RenewLeasesRequest { worker: worker.clone(), fences: vec![fence], ttl_ms: 60_000 }).await.map(|_| ()), is_w1),
                ("WorkerService/RecordReapEvidence", w.record_reap_evidence(pb::ReapEvidenceRequest { profile: fx.profile, lease: fx.lease, generation: fx.generation, cgroup: "/x".into(), populated: true, observed_at_ms: 1 }).await.map(|_| ()), is_w1),
                ("AgentService/AcquireLease", a.acquire_lease(pb::AcquireLeaseRequest { profile: fx.profile, expected_generation: 0, provider: "codex".into(), holder: Some(pb::LeaseHolder { worker: worker.clone(), process: "probe".into(), cgroup: String::new() }), ttl_ms: 60_000 }).await.map(|_| ()), own_profile),
                ("AgentService/RenewLease", a.renew_lease(pb::RenewLeaseRequest { fence: Some(fence), ttl_ms: 60_000 }).await.map(|_| ()), own_agent),
                ("AgentService/ReleaseLease", a.release_lease(pb::FencingToken { lease: fx.lease + 1000, ..fence }).await.map(|_| ()), own_agent),
                ("AgentService/CommitCapsule", a.commit_capsule(pb::CommitCapsuleRequest { fence: Some(pb::FencingToken { lease: fx.lease + 1000, ..fence }), sequence: 1, schema_version: 1, payload: Some(pb::CapsulePayload::default()), ..Default::default() }).await.map(|_| ()), own_agent),
                ("AgentService/CheckMcpUse", a.check_mcp_use(pb::CheckMcpUseRequest { profile: fx.profile, server: "mcp-probe".into() }).await.map(|_| ()), own_profile),
                // The fixture's task has no sandbox: its own agent's check-in is refused by
                // the state (no session is made), another caller's by the rule.
                ("AgentService/Register", a.register(pb::AgentCheckInRequest { task: fx.task, attempt: 1, usage: None, exit_code: None }).await.map(|_| ()), own_task),
                ("AgentService/Heartbeat", a.heartbeat(pb::AgentCheckInRequest { task: fx.task, attempt: 1, usage: Some(pb::SandboxUsage::default()), exit_code: None }).await.map(|_| ()), own_task),
                ("AgentService/AwaitRun", a.await_run(pb::AwaitRunRequest { task: fx.task, attempt: 1, wait_ms: 0 }).await.map(|_| ()), own_task),
                // A CSR that does not parse: an agent's call is refused by the signer (it
                // changes nothing), anyone else's by the rule.
                ("AgentService/RenewCertificate", a.renew_certificate(pb::RenewAgentCertificateRequest { csr_pem: "not a CSR".into() }).await.map(|_| ()), matches!(id, SpiffeId::Agent(_))),
            ];
            let is_worker = matches!(id, SpiffeId::Worker(_));
            let control = worker_control_probes(channel_for_control.clone(), fx, is_worker, is_w1).await;
            let answers = answers.into_iter().chain(control);
            for (method, answer, allowed) in answers {
                probed.insert(method);
                probes += 1;
                let denied = matches!(&answer, Err(s) if matches!(s.code(), tonic::Code::PermissionDenied | tonic::Code::Unauthenticated) && !s.message().contains("mcp_server:use"));
                assert_eq!(!denied, allowed, "{method} as {id}: {answer:?}");
            }
        });
    }
    // Without a certificate the listener does not complete the handshake.
    rt.block_on(async {
        let operator = squadron_client::Credentials::operator(pki().ca_pem(), None).expect("creds");
        let connector = operator.grpc_connector().expect("tls").expect("connector");
        let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
            .expect("endpoint")
            .connect_with_connector(connector)
            .await;
        if let Ok(channel) = channel {
            let r = WorkerServiceClient::new(channel)
                .heartbeat(pb::WorkerHeartbeatRequest {
                    worker: "w1".into(),
                })
                .await;
            assert!(
                r.is_err(),
                "a call without a certificate was answered: {r:?}"
            );
        }
    });
    // Every method the table lists was probed (a method added without a probe fails here).
    let listed: std::collections::BTreeSet<&str> = squadron_api::GRPC_METHODS
        .iter()
        .map(|(path, _)| path.trim_start_matches("/squadron.v1."))
        .collect();
    let missing: Vec<_> = listed.difference(&probed).collect();
    assert!(
        missing.is_empty(),
        "gRPC methods without a probe: {missing:?}"
    );
    eprintln!("{probes} gRPC probes agree with the access table");
}

/// One call of each `WorkerControl` method, with values the state refuses or that change
/// nothing (a wrong generation, a project that does not exist), so the probes leave the
/// fixtures as they were. Any worker may call them; the core holds a worker to itself where
/// the call names one (a holder, an attempt, a sandbox), and the handler where it asks for itself
/// (its certificate, the leases it holds).
async fn worker_control_probes(
    channel: tonic::transport::Channel,
    fx: &Fixtures,
    any_worker: bool,
    is_w1: bool,
) -> Vec<(&'static str, Result<(), tonic::Status>, bool)> {
    use squadron_api::leases::{
        AckMessages, AcquireLease, CommitCapsule, CrashTakeover, LeaseFence, Takeover,
    };
    use squadron_api::{
        Addressed, AttachSandbox, GrantCredentialLease, ProjectRef, RenewCertificate,
    };
    use squadron_core::command::NextHolder;
    use squadron_core::ids::{
        CredentialLeaseId, Generation, LeaseId, McpServerId, ProfileId, TaskId, WorkerId,
    };
    use squadron_core::lease::{FencingToken, LeaseHolder};
    use squadron_proto::v1::worker_control_client::WorkerControlClient;

    let mut c = WorkerControlClient::new(channel);
    let profile = ProfileId::new(fx.profile).expect("profile");
    let lease = LeaseId::new(fx.lease).expect("lease");
    let task = TaskId::new(fx.task).expect("task");
    let w1 = WorkerId::new("w1").expect("worker");
    let stale = Generation::new(fx.generation + 100);
    let nowhere = ProjectRef {
        tenant: "nobody".parse().expect("tenant"),
        project: "nothing".parse().expect("project"),
    };
    let here = ProjectRef {
        tenant: "acme".parse().expect("tenant"),
        project: "p".parse().expect("project"),
    };
    let holder = LeaseHolder {
        worker: w1.clone(),
        process: "probe".into(),
        cgroup: None,
    };
    let token = FencingToken {
        profile,
        lease,
        generation: Generation::new(fx.generation),
    };
    let fenced = LeaseFence {
        profile,
        generation: stale,
    };
    vec![
        (
            "WorkerControl/AcquireLease",
            c.acquire_lease(Addressed::new(
                profile,
                AcquireLease {
                    expected_generation: stale,
                    provider: squadron_core::provider::Provider::Codex,
                    holder: holder.clone(),
                    ttl_ms: 60_000,
                },
            ))
            .await
            .map(|_| ()),
            is_w1,
        ),
        (
            "WorkerControl/ReleaseLease",
            c.release_lease(Addressed::new(lease, fenced))
                .await
                .map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/Takeover",
            c.takeover(Addressed::new(
                profile,
                Takeover::Crash(CrashTakeover {
                    lease,
                    generation: stale,
                    next: NextHolder {
                        provider: squadron_core::provider::Provider::Codex,
                        holder,
                        ttl_ms: 60_000,
                    },
                    reap_evidence: None,
                }),
            ))
            .await
            .map(|_| ()),
            is_w1,
        ),
        (
            "WorkerControl/CommitCapsule",
            c.commit_capsule(Addressed::new(
                profile,
                CommitCapsule {
                    lease,
                    generation: stale,
                    capsule: squadron_core::capsule::CapsuleDraft {
                        sequence: 1,
                        previous: None,
                        schema_version: 1,
                        payload: Default::default(),
                        expected_digest: None,
                    },
                },
            ))
            .await
            .map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/AckMessages",
            c.ack_messages(Addressed::new(
                profile,
                AckMessages {
                    lease,
                    generation: stale,
                    through_seq: 1,
                },
            ))
            .await
            .map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/AttachSandbox",
            c.attach_sandbox(Addressed::new(
                nowhere.clone(),
                AttachSandbox {
                    worker: w1.clone(),
                    runtime: squadron_core::manifest::RuntimeKind::Process,
                    sandbox_ref: "probe".into(),
                },
            ))
            .await
            .map(|_| ()),
            is_w1,
        ),
        (
            "WorkerControl/GrantCredentialLease",
            c.grant_credential_lease(Addressed::new(
                task,
                GrantCredentialLease {
                    worker: w1.clone(),
                    attempt: 99,
                    only_lease: None,
                },
            ))
            .await
            .map(|_| ()),
            is_w1,
        ),
        (
            "WorkerControl/RenewCertificate",
            c.renew_certificate(Addressed::new(
                w1.clone(),
                RenewCertificate {
                    csr_pem: "not a CSR".into(),
                    hosts: vec![],
                },
            ))
            .await
            .map(|_| ()),
            is_w1,
        ),
        (
            "WorkerControl/CheckFence",
            c.check_fence(token).await.map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/GetProfile",
            c.get_profile(profile).await.map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/GetLease",
            c.get_lease(lease).await.map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/ListCapsules",
            c.list_capsules(profile).await.map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/GetProject",
            c.get_project(here.clone()).await.map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/GetRoster",
            c.get_roster(here).await.map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/ReadMailbox",
            c.read_mailbox(profile).await.map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/GetTask",
            c.get_task(task).await.map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/HeldLeases",
            c.held_leases(w1.clone()).await.map(|_| ()),
            is_w1,
        ),
        (
            // A task that does not exist: refused by the state, not the rule.
            "WorkerControl/MintAgentToken",
            c.mint_agent_token(Addressed::new(
                TaskId::new(fx.task + 1000).expect("task"),
                squadron_api::MintAgentToken { ttl_ms: 60_000 },
            ))
            .await
            .map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/GetAgentSession",
            c.get_agent_session(task).await.map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/GrantAgentCredentialLease",
            c.grant_agent_credential_lease(Addressed::new(
                profile,
                squadron_api::GrantAgentCredentialLease {
                    worker: w1.clone(),
                    fence: token,
                    only_lease: None,
                },
            ))
            .await
            .map(|_| ()),
            is_w1,
        ),
        (
            "WorkerControl/GetProfileCredentials",
            c.get_profile_credentials(profile).await.map(|_| ()),
            any_worker,
        ),
        (
            // Not granted: refused by the state ("mcp_server:use"), not the rule.
            "WorkerControl/CheckMcpUse",
            c.check_mcp_use(Addressed::new(
                profile,
                squadron_api::McpUse {
                    server: McpServerId::new("mcp-probe").expect("server"),
                },
            ))
            .await
            .map(|_| ()),
            any_worker,
        ),
        (
            "WorkerControl/McpGrants",
            c.mcp_grants(profile).await.map(|_| ()),
            any_worker,
        ),
        (
            // No such lease: refused by the state (not found), not the rule.
            "WorkerControl/GetCredentialLease",
            c.get_credential_lease(CredentialLeaseId::new(999).expect("id"))
                .await
                .map(|_| ()),
            any_worker,
        ),
        (
            // No such lease: refused by the state (not found), not the rule.
            "WorkerControl/GetAgentCredentialLease",
            c.get_agent_credential_lease(CredentialLeaseId::new(999).expect("id"))
                .await
                .map(|_| ()),
            any_worker,
        ),
    ]
}

/// A gRPC channel to node 1's API listener presenting `id`'s certificate.
async fn grpc_channel(cluster: &Cluster, id: &SpiffeId, name: &str) -> tonic::transport::Channel {
    let dir = cluster.dir.path().join("grpc-channels").join(name);
    let identity = pki().issue_identity(id, &dir, "id");
    let connector = squadron_client::Credentials::identity(identity)
        .grpc_connector()
        .expect("tls")
        .expect("connector");
    let addr = cluster.nodes[&1].spec.grpc.clone();
    tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .expect("endpoint")
        .connect_with_connector(connector)
        .await
        .expect("TLS connect")
}

/// The "only for itself" rules over gRPC, the workers' transport: another worker's
/// certificate cannot register over, set the policy of, or heartbeat for the first worker,
/// and nothing of the first worker changes; its own certificate can.
#[test]
fn a_worker_speaks_only_for_itself_over_grpc() {
    use squadron_core::worker_policy::WorkerPolicy;
    use squadron_proto::v1 as pb;
    use squadron_proto::v1::worker_service_client::WorkerServiceClient;

    let cluster = Cluster::start(1);
    cluster.wait_for_leader(Duration::from_secs(20));
    let url = cluster.url(1);
    fixtures(&url);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let policy = |full_control| pb::SetWorkerPolicyRequest {
        worker: "w1".into(),
        policy: Some(
            (&WorkerPolicy {
                full_control,
                ..WorkerPolicy::default()
            })
                .into(),
        ),
    };
    rt.block_on(async {
        let w1 = SpiffeId::Worker("w1".parse().expect("id"));
        let mut own = WorkerServiceClient::new(grpc_channel(&cluster, &w1, "w1").await);
        own.set_worker_policy(policy(false))
            .await
            .expect("w1 sets its own policy");
        own.heartbeat(pb::WorkerHeartbeatRequest {
            worker: "w1".into(),
        })
        .await
        .expect("w1 heartbeats for itself");
    });
    let before = http_get(&format!("{url}/api/v1/workers/w1")).expect("w1");
    rt.block_on(async {
        let w2 = SpiffeId::Worker("w2".parse().expect("id"));
        let mut other = WorkerServiceClient::new(grpc_channel(&cluster, &w2, "w2").await);
        let register = pb::RegisterWorkerRequest {
            worker: "w1".into(),
            address: "127.0.0.1:9".into(),
            runtimes: vec!["process".into()],
            capacity: 1,
            labels: Default::default(),
            heartbeat_interval_ms: 1_000,
            policy: None,
        };
        let answers = [
            ("Register", other.register(register).await.map(|_| ())),
            (
                "SetWorkerPolicy",
                other.set_worker_policy(policy(true)).await.map(|_| ()),
            ),
            (
                "Heartbeat",
                other
                    .heartbeat(pb::WorkerHeartbeatRequest {
                        worker: "w1".into(),
                    })
                    .await
                    .map(|_| ()),
            ),
        ];
        for (method, answer) in answers {
            let code = answer.as_ref().err().map(tonic::Status::code);
            assert_eq!(
                code,
                Some(tonic::Code::PermissionDenied),
                "w2's {method} for w1: {answer:?}"
            );
        }
    });
    let after = http_get(&format!("{url}/api/v1/workers/w1")).expect("w1");
    for field in [
        "address",
        "capacity",
        "ttl_ms",
        "last_heartbeat_ms",
        "registered_at_ms",
    ] {
        assert_eq!(before[field], after[field], "w2 changed w1's {field}");
    }
    let policy = http_get(&format!("{url}/api/v1/workers/w1/policy")).expect("policy");
    assert_eq!(
        policy["full_control"],
        json!(false),
        "w2 set w1's policy: {policy}"
    );
}

/// The "only for itself" rules, end to end over REST: another worker's certificate cannot
/// heartbeat, register over, renew, report for, or post evidence on the first worker's
/// objects, and nothing changes.
#[test]
fn a_worker_speaks_only_for_itself() {
    let cluster = Cluster::start(1);
    cluster.wait_for_leader(Duration::from_secs(20));
    let url = cluster.url(1);
    let fx = fixtures(&url);
    let before = http_get(&format!("{url}/api/v1/workers/w1")).expect("w1");
    let forged = [
        ("/api/v1/workers/w1/heartbeat".to_string(), json!(null)),
        (
            "/api/v1/workers".to_string(),
            json!({"worker": "w1", "address": "127.0.0.1:9", "runtimes": ["process"], "capacity": 1}),
        ),
        (
            "/api/v1/workers/w1/renewals".to_string(),
            json!({"fences": [{"profile": fx.profile, "lease": fx.lease, "generation": fx.generation}], "ttl_ms": 60000}),
        ),
        (
            format!("/api/v1/tasks/{}/transitions", fx.task),
            json!({"worker": "w1", "attempt": 1, "from": "STAGING", "to": "FAILED"}),
        ),
        (
            format!("/api/v1/leases/{}/evidence", fx.lease),
            json!({"profile": fx.profile, "generation": fx.generation, "cgroup": "/forged",
                   "populated": false, "observed_at_ms": squadron_client::now_ms()}),
        ),
    ];
    for (path, body) in forged {
        let r = worker_post("w2", &format!("{url}{path}"), body).expect("answer");
        assert_eq!(r.status, 403, "worker w2 was not refused on {path}: {r:?}");
    }
    let after = http_get(&format!("{url}/api/v1/workers/w1")).expect("w1");
    assert_eq!(before["address"], after["address"], "w2 moved w1's address");
    let lease = http_get(&format!("{url}/api/v1/leases/{}", fx.lease)).expect("lease");
    assert_eq!(
        lease["state"],
        json!("active"),
        "the forged evidence ended the lease: {lease}"
    );
    let task = http_get(&format!("{url}/api/v1/tasks/{}", fx.task)).expect("task");
    assert_ne!(
        task["state"],
        json!("failed"),
        "the forged report moved the task: {task}"
    );
}

/// A `WorkerControl` message that does not decode is refused before any handler runs, naming
/// the field, and changes nothing.
#[test]
fn a_worker_control_message_that_does_not_decode_names_its_field() {
    use squadron_proto::json_codec::JsonCodec;

    let cluster = Cluster::start(1);
    cluster.wait_for_leader(Duration::from_secs(20));
    let url = cluster.url(1);
    let fx = fixtures(&url);
    let lease_url = format!("{url}/api/v1/leases/{}", fx.lease);
    let before = http_get(&lease_url).expect("lease");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let w1 = SpiffeId::Worker("w1".parse().expect("id"));
    let refusals = rt.block_on(async {
        let channel = grpc_channel(&cluster, &w1, "w1-bad").await;
        let mut grpc = tonic::client::Grpc::new(channel);
        let mut answers = Vec::new();
        for (method, message) in [
            ("ReleaseLease", json!({"id": fx.lease, "body": {"profile": "one", "generation": 1}})),
            ("ReleaseLease", json!({"id": fx.lease, "body": {"profile": fx.profile, "generation": 1, "extra": true}})),
            ("GetLease", json!("not a lease id")),
            // Past the service's message limit: refused before it is decoded.
            ("GetLease", json!("x".repeat(squadron_api::worker_control::WORKER_CONTROL_MESSAGE_BYTES_MAX))),
        ] {
            grpc.ready().await.expect("ready");
            let path = format!("/squadron.v1.WorkerControl/{method}")
                .parse()
                .expect("path");
            let answer = grpc
                .unary(
                    tonic::Request::new(message),
                    path,
                    JsonCodec::<Value, Value>::default(),
                )
                .await;
            answers.push(answer.expect_err("a malformed message was answered"));
        }
        answers
    });
    assert!(refusals[..3]
        .iter()
        .all(|s| s.code() == tonic::Code::InvalidArgument));
    // tonic's code for a message past the limit, and the limit it names.
    assert_eq!(
        refusals[3].code(),
        tonic::Code::OutOfRange,
        "{:?}",
        refusals[3]
    );
    assert!(
        refusals[3].message().contains("8388608"),
        "{:?}",
        refusals[3]
    );
    assert!(
        refusals[0].message().contains("body.profile"),
        "{:?}",
        refusals[0]
    );
    assert!(refusals[1].message().contains("extra"), "{:?}", refusals[1]);
    assert!(
        refusals[2].message().contains("invalid"),
        "{:?}",
        refusals[2]
    );
    assert_eq!(http_get(&lease_url).expect("lease"), before);
}
