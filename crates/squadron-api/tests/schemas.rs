//! The JSON Schemas of the request bodies say what the server's decoder says: for a valid body
//! of every type, and for every mutation of it at every field (removed, retyped, an unknown
//! field added), the schema accepts exactly when serde accepts. A schema-driven fuzzer that
//! trusts `/api/v1/openapi.json` therefore generates bodies the server reads as it expects.

use std::collections::{BTreeMap, BTreeSet};

use schemars::{schema_for, JsonSchema};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use squadron_api::agents::{
    LaunchAgent, SandboxRepository, StopAgent, TakeoverAgent, TakeoverKind,
};
use squadron_api::leases::*;
use squadron_api::*;
use squadron_core::access::{ProjectScope, Role};
use squadron_core::capsule::{CapsuleDraft, CapsulePayload};
use squadron_core::command::{NextHolder, TransitionDetail};
use squadron_core::ids::*;
use squadron_core::lease::{FenceReason, FencingToken, LeaseHolder};
use squadron_core::mailbox::{MessageKind, MessageSender};
use squadron_core::manifest::{NetworkMode, RuntimeKind};
use squadron_core::provider::Provider;
use squadron_core::task::TaskState;
use squadron_core::worker_policy::{RepositorySource, WorkerPolicy};

/// Values put in place of a field: each is wrong for most fields and right for some.
fn probes() -> Vec<Value> {
    vec![
        Value::Null,
        json!(true),
        json!(0),
        json!(7),
        json!(-1),
        json!(1.5),
        json!("x"),
        json!("NOT A NAME"),
        json!([]),
        json!({}),
    ]
}

/// How deep the mutations reach into nested objects.
const MUTATION_DEPTH_MAX: usize = 4;

fn accepts_by_serde<T: DeserializeOwned>(v: &Value) -> bool {
    serde_json::from_value::<T>(v.clone()).is_ok()
}

/// Every body `sample` can be turned into by one mutation at `path` or below.
fn mutations(sample: &Value, depth: usize, out: &mut Vec<(String, Value)>) {
    let Value::Object(map) = sample else { return };
    let mut extra = map.clone();
    extra.insert("surprise".into(), json!(1));
    out.push(("+surprise".into(), Value::Object(extra)));
    for (key, value) in map {
        let mut removed = map.clone();
        removed.remove(key);
        out.push((format!("-{key}"), Value::Object(removed)));
        for probe in probes() {
            // serde also reads a struct from a positional array, a form the schemas leave
            // undescribed on purpose (no client sends it): not a disagreement worth a schema.
            if value.is_object() && probe.is_array() {
                continue;
            }
            let mut changed = map.clone();
            changed.insert(key.clone(), probe.clone());
            out.push((format!("{key}={probe}"), Value::Object(changed)));
        }
        if depth < MUTATION_DEPTH_MAX {
            let mut inner = Vec::new();
            mutations(value, depth + 1, &mut inner);
            for (what, v) in inner {
                let mut changed = map.clone();
                changed.insert(key.clone(), v);
                out.push((format!("{key}.{what}"), Value::Object(changed)));
            }
        }
    }
}

/// Checks that schema and serde agree on `sample` and on every mutation of it; returns how
/// many bodies were checked.
fn agree<T: JsonSchema + Serialize + DeserializeOwned>(sample: &T) -> usize {
    let name = T::schema_name();
    let schema = serde_json::to_value(schema_for!(T)).expect("schema as JSON");
    let validator = jsonschema::validator_for(&schema)
        .unwrap_or_else(|e| panic!("{name}: the schema is not a valid JSON Schema: {e}"));
    let valid = serde_json::to_value(sample).expect("sample as JSON");
    assert!(
        accepts_by_serde::<T>(&valid),
        "{name}: serde refuses its own encoding"
    );
    assert!(
        validator.is_valid(&valid),
        "{name}: the schema refuses a valid body {valid}: {:?}",
        validator
            .iter_errors(&valid)
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
    );
    let mut all = Vec::new();
    mutations(&valid, 0, &mut all);
    let mut disagreements = Vec::new();
    for (what, body) in &all {
        let by_schema = validator.is_valid(body);
        let by_serde = accepts_by_serde::<T>(body);
        if by_schema != by_serde {
            disagreements.push(format!(
                "{what}: schema {} but serde {}",
                verdict(by_schema),
                verdict(by_serde)
            ));
        }
    }
    assert!(
        disagreements.is_empty(),
        "{name}: schema and decoder disagree on {} of {} mutations:\n{}",
        disagreements.len(),
        all.len(),
        disagreements.join("\n")
    );
    all.len() + 1
}

fn verdict(accepts: bool) -> &'static str {
    if accepts {
        "accepts"
    } else {
        "refuses"
    }
}

fn worker() -> WorkerId {
    WorkerId::new("worker-a").expect("worker id")
}

fn profile() -> ProfileId {
    ProfileId::new(3).expect("profile id")
}

fn lease() -> LeaseId {
    LeaseId::new(5).expect("lease id")
}

fn holder() -> LeaseHolder {
    LeaseHolder {
        worker: worker(),
        process: "pid 42".into(),
        cgroup: Some("/squadron/p3-g2".into()),
    }
}

fn next() -> NextHolder {
    NextHolder {
        provider: Provider::Claude,
        holder: holder(),
        ttl_ms: 30_000,
    }
}

fn capsule() -> CapsuleDraft {
    CapsuleDraft {
        sequence: 1,
        previous: None,
        schema_version: 1,
        payload: CapsulePayload {
            task_state: "halfway".into(),
            decisions: vec!["use sqlite".into()],
            pending_work: vec![],
            repository_revision: "abc123".into(),
            mailbox_cursor: 0,
            context_ref: "ctx".into(),
        },
        expected_digest: None,
    }
}

fn evidence() -> TakeoverEvidence {
    TakeoverEvidence {
        cgroup: "/squadron/p3-g1".into(),
        populated: false,
        observed_at_ms: 1_000,
    }
}

#[test]
fn lease_bodies_schemas_agree_with_the_decoder() {
    let generation = Generation::new(2);
    let mut checked = 0;
    checked += agree(&AcquireLease {
        expected_generation: generation,
        provider: Provider::Codex,
        holder: holder(),
        ttl_ms: 30_000,
    });
    checked += agree(&RenewLease {
        profile: profile(),
        generation,
        ttl_ms: 30_000,
    });
    checked += agree(&LeaseFence {
        profile: profile(),
        generation,
    });
    checked += agree(&FenceLease {
        profile: profile(),
        generation,
        reason: FenceReason::Operator,
    });
    checked += agree(&RecordEvidence {
        profile: profile(),
        generation,
        cgroup: "/squadron/p3-g2".into(),
        populated: false,
        observed_at_ms: 9,
    });
    checked += agree(&RenewLeases {
        fences: vec![FencingToken {
            profile: profile(),
            lease: lease(),
            generation,
        }],
        ttl_ms: 30_000,
    });
    checked += agree(&Takeover::Graceful(Box::new(GracefulTakeover {
        lease: lease(),
        generation,
        capsule: capsule(),
        next: next(),
        old_reap_evidence: Some(evidence()),
    })));
    checked += agree(&Takeover::Crash(CrashTakeover {
        lease: lease(),
        generation,
        next: next(),
        reap_evidence: Some(evidence()),
    }));
    checked += agree(&CommitCapsule {
        lease: lease(),
        generation,
        capsule: capsule(),
    });
    checked += agree(&PostMessage {
        sender: MessageSender::Operator("alice".into()),
        kind: MessageKind::Note,
        body: "hello".into(),
    });
    checked += agree(&AckMessages {
        lease: lease(),
        generation,
        through_seq: 4,
    });
    println!("lease bodies: {checked} bodies checked");
    assert!(checked > 500, "only {checked} bodies checked");
}

#[test]
fn project_agent_and_task_bodies_schemas_agree_with_the_decoder() {
    let mut checked = 0;
    checked += agree(&CreateProject {
        tenant: TenantId::new("acme").expect("tenant"),
        project: ProjectId::new("web").expect("project"),
        max_profiles: Some(8),
        max_active: None,
    });
    checked += agree(&AttachSandbox {
        worker: worker(),
        runtime: RuntimeKind::Process,
        sandbox_ref: "sb-1".into(),
    });
    checked += agree(&CreateProfile {
        key: ProfileKey::new("reviewer").expect("key"),
        providers: vec![Provider::Codex, Provider::Claude],
        context_ref: None,
    });
    checked += agree(&SetCapabilities {
        expected_version: 0,
        required_skills: vec![SkillId::new("rust").expect("skill")],
        mcp_servers: vec![McpServerId::new("github").expect("server")],
    });
    checked += agree(&LaunchAgent {
        provider: Some(Provider::Codex),
        worker: Some(worker()),
        repository: Some(SandboxRepository {
            url: "https://example.com/r.git".into(),
            branch: Some("main".into()),
        }),
        prompt: Some("fix it".into()),
    });
    checked += agree(&TakeoverAgent {
        kind: TakeoverKind::Crash,
        provider: None,
        wait_for_expiry_ms: Some(60_000),
        prompt: None,
    });
    checked += agree(&StopAgent {
        grace_ms: Some(5_000),
    });
    checked += agree(&ReportTransition {
        worker: worker(),
        attempt: 1,
        from: TaskState::Running,
        to: TaskState::Completing,
        detail: TransitionDetail {
            exit_code: Some(0),
            error: None,
            artifacts: vec!["patch.diff".into()],
        },
    });
    checked += agree(&ReportProgress {
        worker: worker(),
        attempt: 1,
        stdout_bytes: 10,
        stderr_bytes: 0,
        lines: 1,
        events: 0,
        provider: Some(squadron_core::task::ProviderProgress {
            model: Some("claude-scripted-1".into()),
            tool_calls: 2,
            current_tool: Some("Bash".into()),
            input_tokens: 600,
            output_tokens: 120,
            cost_micro_usd: Some(4_800),
            turns: 1,
        }),
    });
    println!("project, agent and task bodies: {checked} bodies checked");
    assert!(checked > 300, "only {checked} bodies checked");
}

#[test]
fn worker_cluster_and_access_bodies_schemas_agree_with_the_decoder() {
    let mut checked = 0;
    checked += agree(&RegisterWorker {
        worker: worker(),
        address: "https://127.0.0.1:8130".into(),
        runtimes: vec![RuntimeKind::Process, RuntimeKind::Docker],
        capacity: 4,
        labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
        heartbeat_interval_ms: Some(2_000),
        policy: Some(WorkerPolicy {
            repository_sources: BTreeSet::from([RepositorySource::Ssh]),
            ..WorkerPolicy::default()
        }),
    });
    checked += agree(&Decommission {
        operator: "alice".into(),
        reason: "replaced".into(),
    });
    checked += agree(&WorkerPolicy {
        network_modes: BTreeSet::from([NetworkMode::Isolated, NetworkMode::Outbound]),
        full_control: false,
        repository_sources: BTreeSet::from([RepositorySource::Https]),
        cpus_max: Some(4),
        memory_bytes_max: None,
        disk_bytes_max: Some(1 << 30),
    });
    checked += agree(&AddLearner {
        id: 4,
        rest: "127.0.0.1:8124".into(),
        grpc: "127.0.0.1:8224".into(),
        peer: "127.0.0.1:8324".into(),
    });
    checked += agree(&PromoteVoter { id: 4 });
    checked += agree(&CreateToken {
        name: "ci".into(),
        role: Role::Operator,
        scope: vec![ProjectScope {
            tenant: TenantId::new("acme").expect("tenant"),
            project: Some(ProjectId::new("web").expect("project")),
        }],
        ttl: Some("24h".into()),
    });
    checked += agree(&PutCredential {
        id: CredentialId::new("cred-anthropic").expect("credential id"),
        value: "sk-test".into(),
        description: "CI key".into(),
    });
    checked += agree(&RotateCredential {
        value: "sk-next".into(),
    });
    checked += agree(&GrantCredentialLease {
        worker: worker(),
        attempt: 1,
        only_lease: None,
    });
    checked += agree(&GrantCredentialLease {
        worker: worker(),
        attempt: 1,
        only_lease: Some(squadron_core::ids::CredentialLeaseId::new(7).expect("credential lease")),
    });
    checked += agree(&SetProfileCredentials {
        credential_refs: vec![squadron_core::manifest::CredentialRef {
            id: CredentialId::new("cred-anthropic").expect("credential id"),
            mount: "anthropic_api_key".into(),
        }],
    });
    checked += agree(&GrantAgentCredentialLease {
        worker: worker(),
        fence: FencingToken {
            profile: ProfileId::new(3).expect("profile"),
            lease: LeaseId::new(5).expect("lease"),
            generation: Generation::new(2),
        },
        only_lease: None,
    });
    checked += agree(&GrantAgentCredentialLease {
        worker: worker(),
        fence: FencingToken {
            profile: ProfileId::new(3).expect("profile"),
            lease: LeaseId::new(5).expect("lease"),
            generation: Generation::new(2),
        },
        only_lease: Some(squadron_core::ids::CredentialLeaseId::new(7).expect("credential lease")),
    });
    checked += agree(&MintBootstrap {
        worker: Some(worker()),
        ttl: Some("10m".into()),
    });
    checked += agree(&EnrollWorker {
        token: "sqb_abc".into(),
        worker: worker(),
        csr_pem: "-----BEGIN CERTIFICATE REQUEST-----".into(),
        hosts: vec!["127.0.0.1".into()],
    });
    checked += agree(&RenewCertificate {
        csr_pem: "-----BEGIN CERTIFICATE REQUEST-----".into(),
        hosts: vec!["localhost".into()],
    });
    println!("worker, cluster and access bodies: {checked} bodies checked");
    assert!(checked > 400, "only {checked} bodies checked");
}

/// The query strings' types, decoded from the query's fields (`TaskListQuery` is left out: its
/// `state` is decoded as text and refused afterwards with a message listing the states, while
/// its schema names the states).
#[test]
fn query_schemas_agree_with_the_decoder() {
    let mut checked = 0;
    checked += agree(&ConsistencyQuery {
        consistency: Consistency::Stale,
    });
    checked += agree(&ClusterStatusQuery {
        consistency: Consistency::Stale,
        digest: false,
    });
    checked += agree(&AuditQuery {
        after: 3,
        limit: Some(10),
        consistency: Consistency::Linearizable,
    });
    checked += agree(&CancelQuery {
        reason: Some("not needed".into()),
    });
    checked += agree(&LogQuery {
        stream: LogStream::Stderr,
        offset: Some(0),
        tail: Some(100),
        follow: true,
        ..LogQuery::default()
    });
    checked += agree(&LogQuery {
        stream: LogStream::All,
        follow: true,
        stdout_offset: Some(10),
        stderr_offset: Some(0),
        ..LogQuery::default()
    });
    checked += agree(&StreamQuery {
        stdout_offset: Some(4096),
        stderr_offset: None,
        generation: Some(3),
    });
    println!("query types: {checked} bodies checked");
    assert!(checked > 80, "only {checked} bodies checked");
}

/// A schema that lets anything through would agree with a lenient decoder; these bodies
/// must be refused by both, so the agreement above is not the trivial kind.
#[test]
fn the_schemas_refuse_what_the_decoder_refuses() {
    let schema = serde_json::to_value(schema_for!(AcquireLease)).expect("schema");
    let validator = jsonschema::validator_for(&schema).expect("validator");
    for bad in [
        json!({}),
        json!({"expected_generation": 1, "provider": "gpt", "holder": {"worker": "w", "process": "p"}, "ttl_ms": 1}),
        json!({"expected_generation": 1, "provider": "codex", "holder": {"worker": "W!", "process": "p"}, "ttl_ms": 1}),
        json!({"expected_generation": 1, "provider": "codex", "holder": {"worker": "w", "process": "p"}, "ttl_ms": 1, "extra": 0}),
    ] {
        assert!(!validator.is_valid(&bad), "the schema accepts {bad}");
        assert!(
            !accepts_by_serde::<AcquireLease>(&bad),
            "serde accepts {bad}"
        );
    }
}
