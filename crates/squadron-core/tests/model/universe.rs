//! The tiny universe sequences run in: one tenant, its projects, workers, ids and specs.

use crate::*;
use squadron_core::access::Subject;

pub(crate) const TENANT: &str = "t";
pub(crate) const WORKERS: [&str; 2] = ["w0", "w1"];
/// Time of the setup prefix; every lease is granted at or after it.
pub(crate) const SETUP_AT_MS: u64 = 1_000;
/// Tasks one worker runs at once; small so that "worker full" is reached.
pub(crate) const WORKER_CAPACITY: u32 = 3;
/// Long enough that no worker goes silent within a generated sequence (3 × this > horizon).
pub(crate) const HEARTBEAT_INTERVAL_MS: u64 = 600_000;
/// A lease id the core never reaches in a sequence.
pub(crate) const MISSING_LEASE: u64 = 9_999;
pub(crate) const PROVIDERS: [Provider; 2] = [Provider::Codex, Provider::Claude];
pub(crate) const PRIORITIES: [&str; 4] = ["low", "normal", "high", "critical"];

#[derive(Debug, Clone)]
pub(crate) struct Universe {
    /// `max_active` of each project (one or two projects).
    pub(crate) max_active: Vec<u32>,
    /// The project of each profile (one to six profiles).
    pub(crate) profile_projects: Vec<usize>,
}

pub(crate) fn universe() -> impl Strategy<Value = Universe> {
    prop::collection::vec(2u32..=4, 1..=2)
        .prop_flat_map(|max_active| {
            let n = max_active.len();
            (Just(max_active), prop::collection::vec(0..n, 1..=6))
        })
        .prop_map(|(max_active, profile_projects)| Universe {
            max_active,
            profile_projects,
        })
}

pub(crate) fn tenant() -> TenantId {
    TenantId::new(TENANT).expect("tenant name")
}

pub(crate) fn project_id(i: usize) -> ProjectId {
    ProjectId::new(format!("p{i}")).expect("project name")
}

pub(crate) fn worker_id(i: usize) -> WorkerId {
    WorkerId::new(WORKERS[i]).expect("worker name")
}

pub(crate) fn profile_id(i: usize) -> ProfileId {
    ProfileId::new(i as u64 + 1).expect("profile id")
}

pub(crate) fn lease_id(id: u64) -> LeaseId {
    LeaseId::new(id).expect("lease id")
}

pub(crate) fn task_id(i: usize) -> TaskId {
    TaskId::new(i as u64 + 1).expect("task id")
}

/// The eight specs the test submits: every priority, with failure_action destroy or preserve.
pub(crate) fn specs() -> &'static Vec<TaskSpec> {
    static SPECS: OnceLock<Vec<TaskSpec>> = OnceLock::new();
    SPECS.get_or_init(|| {
        let mut out = Vec::new();
        for priority in PRIORITIES {
            for action in ["destroy", "preserve"] {
                let text = format!(
                    "version: \"1\"\n\
                     kind: Task\n\
                     metadata: {{ name: t, labels: {{ priority: {priority} }} }}\n\
                     repository: {{ url: \"file:///srv/repo\" }}\n\
                     agent: {{ prompt: \"do it\" }}\n\
                     lifecycle: {{ failure_action: {action} }}\n"
                );
                let spec = parse_manifest_yaml(&text)
                    .unwrap_or_else(|e| panic!("manifest should parse: {e}\n{text}"));
                assert_eq!(spec.priority.as_str(), priority, "manifest priority label");
                assert_eq!(spec.lifecycle.failure_action.as_str(), action);
                assert_eq!(spec.sandbox.runtime, RuntimeKind::Process);
                out.push(spec);
            }
        }
        out
    })
}

/// A command that is refused without touching anything: used to move a copy's clock exactly
/// as the command under test moved the real one.
pub(crate) fn noop(at_ms: u64) -> CommandEnvelope {
    CommandEnvelope {
        subject: Subject::Legacy,
        at_ms,
        idempotency_key: None,
        command: Command::WorkerHeartbeat(WorkerHeartbeat {
            worker: WorkerId::new("ghost").expect("worker name"),
        }),
    }
}

/// The name of a rejection's variant, as the model predicts it.
pub(crate) fn kind(r: &Rejection) -> String {
    format!("{r:?}")
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect()
}
