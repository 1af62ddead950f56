use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use squadron_core::manifest::{
    FailureAction, NetworkMode, RuntimeKind, StartupTrigger, TaskPriority,
};

use super::*;

fn text() -> impl Strategy<Value = String> {
    // Any text, including what JSON would escape: the wire must not care.
    ".{0,24}"
}

/// A name the id grammar accepts.
fn name() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9_-]{0,20}"
}

fn one_of<K: Keyword + std::fmt::Debug>() -> impl Strategy<Value = K> {
    proptest::sample::select(K::ALL)
}

fn repository() -> impl Strategy<Value = RepositorySpec> {
    (
        text(),
        option::of(text()),
        option::of(text()),
        option::of(text()),
    )
        .prop_map(|(url, branch, commit, subpath)| RepositorySpec {
            url,
            branch,
            commit,
            subpath,
        })
}

fn agent() -> impl Strategy<Value = AgentSpec> {
    (
        text(),
        option::of(text()),
        option::of(any::<u32>()),
        option::of(vec(text(), 0..4)),
        proptest::sample::select(Provider::ALL.to_vec()),
        option::of(text()),
    )
        .prop_map(
            |(prompt, model, max_turns, allowed_tools, provider, script)| AgentSpec {
                prompt,
                model,
                max_turns,
                allowed_tools,
                provider,
                script,
            },
        )
}

fn sandbox() -> impl Strategy<Value = SandboxSpec> {
    (
        option::of(text()),
        option::of(any::<u32>()),
        option::of(any::<u64>()),
        option::of(any::<u64>()),
        one_of::<NetworkMode>(),
        one_of::<RuntimeKind>(),
        any::<bool>(),
    )
        .prop_map(
            |(profile, cpus, memory_bytes, disk_bytes, network_mode, runtime, full_control)| {
                SandboxSpec {
                    profile,
                    cpus,
                    memory_bytes,
                    disk_bytes,
                    network_mode,
                    runtime,
                    full_control,
                }
            },
        )
}

fn placement() -> impl Strategy<Value = Placement> {
    prop_oneof![
        Just(Placement::Dedicated),
        (name(), name(), name()).prop_map(|(t, p, k)| Placement::Project {
            tenant: TenantId::new(t).unwrap(),
            project: ProjectId::new(p).unwrap(),
            profile: ProfileKey::new(k).unwrap(),
        }),
    ]
}

fn startup_profile() -> impl Strategy<Value = StartupProfileSpec> {
    let session =
        (text(), text(), any::<u16>(), any::<u16>()).prop_map(|(launcher, workdir, cols, rows)| {
            SessionSpec {
                launcher,
                workdir,
                cols,
                rows,
            }
        });
    let credential = (name(), text()).prop_map(|(id, mount)| CredentialRef {
        id: CredentialId::new(id).unwrap(),
        mount,
    });
    let probe = (text(), text()).prop_map(|(provider, kind)| ProbeSpec { provider, kind });
    (
        text(),
        one_of::<StartupTrigger>(),
        session,
        vec(credential, 0..3),
        vec(probe, 0..3),
        (text(), text()),
    )
        .prop_map(
            |(id, trigger, session, credential_refs, probes, (retention, redaction))| {
                StartupProfileSpec {
                    id,
                    trigger,
                    session,
                    credential_refs,
                    readiness: ReadinessSpec { probes },
                    observation: ObservationSpec {
                        retention_class: retention,
                        redaction_profile: redaction,
                    },
                }
            },
        )
}

fn retry() -> impl Strategy<Value = RetrySpec> {
    (any::<u32>(), vec(any::<u64>(), 0..4))
        .prop_map(|(max, backoff_ms)| RetrySpec { max, backoff_ms })
}

fn lifecycle() -> impl Strategy<Value = LifecycleSpec> {
    (
        any::<[u64; 5]>(),
        one_of::<FailureAction>(),
        vec(text(), 0..3),
        vec(any::<i32>(), 0..3),
        (retry(), retry(), retry()),
    )
        .prop_map(
            |([timeout, stage, provision, hang, grace], failure_action, patterns, codes, r)| {
                LifecycleSpec {
                    timeout_ms: timeout,
                    stage_timeout_ms: stage,
                    provision_timeout_ms: provision,
                    hang_timeout_ms: hang,
                    cancel_grace_ms: grace,
                    failure_action,
                    artifact_patterns: patterns,
                    success_exit_codes: codes,
                    retries: RetryPolicy {
                        clone: r.0,
                        provision: r.1,
                        agent_connect: r.2,
                    },
                }
            },
        )
}

fn task_spec() -> impl Strategy<Value = TaskSpec> {
    (
        text(),
        btree_map(text(), text(), 0..3),
        one_of::<TaskPriority>(),
        repository(),
        agent(),
        sandbox(),
        placement(),
        option::of(startup_profile()),
        lifecycle(),
    )
        .prop_map(
            |(
                name,
                labels,
                priority,
                repository,
                agent,
                sandbox,
                placement,
                startup,
                lifecycle,
            )| {
                TaskSpec {
                    name,
                    labels,
                    priority,
                    repository,
                    agent,
                    sandbox,
                    placement,
                    startup_profile: startup,
                    lifecycle,
                }
            },
        )
}

proptest! {
    #[test]
    fn any_spec_round_trips_through_protobuf_unchanged(spec in task_spec()) {
        let wire = prost::Message::encode_to_vec(&pb::TaskSpec::from(&spec));
        let decoded: pb::TaskSpec = prost::Message::decode(wire.as_slice()).unwrap();
        prop_assert_eq!(TaskSpec::try_from(decoded), Ok(spec));
    }
}

/// A spec with every optional part present, as the proto a leader sends.
fn full() -> pb::TaskSpec {
    let mut spec = squadron_core::manifest::parse_manifest_yaml(MANIFEST).unwrap();
    spec.placement = Placement::Project {
        tenant: TenantId::new("acme").unwrap(),
        project: ProjectId::new("web").unwrap(),
        profile: ProfileKey::new("reviewer").unwrap(),
    };
    pb::TaskSpec::from(&spec)
}

const MANIFEST: &str = r#"
version: "1"
kind: Task
metadata:
  name: hello
repository:
  url: https://example.invalid/repo.git
agent:
  provider: script
  prompt: say hello
  script: echo hello
"#;

/// A change to the fixture that makes it a spec the core refuses.
type Edit = fn(&mut pb::TaskSpec);

fn refusal(edit: impl FnOnce(&mut pb::TaskSpec)) -> String {
    let mut spec = full();
    edit(&mut spec);
    match TaskSpec::try_from(spec) {
        Ok(s) => panic!("accepted: {s:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_fixture_converts() {
    assert!(TaskSpec::try_from(full()).is_ok());
}

#[test]
fn an_unknown_keyword_is_refused_naming_its_field() {
    let cases: [(&str, Edit); 6] = [
        ("spec.priority", |s| s.priority = "urgent".into()),
        ("spec.agent.provider", |s| {
            s.agent.as_mut().unwrap().provider = "gpt".into()
        }),
        ("spec.sandbox.network_mode", |s| {
            s.sandbox.as_mut().unwrap().network_mode = "x".into()
        }),
        ("spec.sandbox.runtime", |s| {
            s.sandbox.as_mut().unwrap().runtime = "lxc".into()
        }),
        ("spec.lifecycle.failure_action", |s| {
            s.lifecycle.as_mut().unwrap().failure_action = String::new()
        }),
        ("spec.startup_profile.trigger", |s| {
            s.startup_profile = Some(pb::StartupProfileSpec {
                trigger: "later".into(),
                ..startup()
            })
        }),
    ];
    for (field, edit) in cases {
        let message = refusal(edit);
        assert!(
            message.starts_with(&format!("{field}: unknown ")),
            "{field}: {message}"
        );
    }
    assert_eq!(
        refusal(|s| s.sandbox.as_mut().unwrap().network_mode = "x".into()),
        r#"spec.sandbox.network_mode: unknown network_mode "x"; expected one of isolated, outbound, full, gateway"#
    );
}

fn startup() -> pb::StartupProfileSpec {
    pb::StartupProfileSpec {
        id: "p".into(),
        trigger: "on_instance_ready".into(),
        session: Some(pb::SessionSpec {
            launcher: "bash".into(),
            workdir: "/w".into(),
            cols: 80,
            rows: 24,
        }),
        credential_refs: vec![pb::CredentialRef {
            id: "cred_ci".into(),
            mount: "/run/c".into(),
        }],
        readiness: Some(pb::ReadinessSpec { probes: vec![] }),
        observation: Some(pb::ObservationSpec::default()),
    }
}

#[test]
fn a_missing_sub_message_is_refused_naming_it() {
    let cases: [(&str, Edit); 12] = [
        ("spec.repository", |s| s.repository = None),
        ("spec.agent", |s| s.agent = None),
        ("spec.sandbox", |s| s.sandbox = None),
        ("spec.placement", |s| s.placement = None),
        ("spec.placement.kind", |s| {
            s.placement = Some(pb::Placement { kind: None })
        }),
        ("spec.lifecycle", |s| s.lifecycle = None),
        ("spec.lifecycle.retries", |s| {
            s.lifecycle.as_mut().unwrap().retries = None
        }),
        ("spec.lifecycle.retries.provision", |s| {
            s.lifecycle
                .as_mut()
                .unwrap()
                .retries
                .as_mut()
                .unwrap()
                .provision = None
        }),
        ("spec.lifecycle.retries.agent_connect", |s| {
            s.lifecycle
                .as_mut()
                .unwrap()
                .retries
                .as_mut()
                .unwrap()
                .agent_connect = None
        }),
        ("spec.startup_profile.session", |s| {
            s.startup_profile = Some(pb::StartupProfileSpec {
                session: None,
                ..startup()
            })
        }),
        ("spec.startup_profile.readiness", |s| {
            s.startup_profile = Some(pb::StartupProfileSpec {
                readiness: None,
                ..startup()
            })
        }),
        ("spec.startup_profile.observation", |s| {
            s.startup_profile = Some(pb::StartupProfileSpec {
                observation: None,
                ..startup()
            })
        }),
    ];
    for (field, edit) in cases {
        assert_eq!(refusal(edit), format!("{field}: missing"));
    }
    assert!(TaskSpec::try_from(pb::TaskSpec {
        startup_profile: Some(startup()),
        ..full()
    })
    .is_ok());
}

#[test]
fn a_malformed_id_or_an_oversized_session_is_refused_naming_the_field() {
    let project = |tenant: &str| {
        Some(pb::Placement {
            kind: Some(pb::placement::Kind::Project(pb::ProjectPlacement {
                tenant: tenant.into(),
                project: "web".into(),
                profile: "reviewer".into(),
            })),
        })
    };
    let message = refusal(|s| s.placement = project("Acme"));
    assert!(
        message.starts_with("spec.placement.project.tenant: must start with"),
        "{message}"
    );
    let message = refusal(|s| {
        let mut p = startup();
        p.credential_refs.push(pb::CredentialRef {
            id: String::new(),
            mount: "/m".into(),
        });
        s.startup_profile = Some(p);
    });
    assert_eq!(
        message,
        "spec.startup_profile.credential_refs[1].id: must not be empty"
    );
    let message = refusal(|s| {
        let mut p = startup();
        p.session.as_mut().unwrap().rows = 70_000;
        s.startup_profile = Some(p);
    });
    assert_eq!(
        message,
        "spec.startup_profile.session.rows: must be at most 65535, got 70000"
    );
}

#[test]
fn the_error_names_its_field() {
    let e = TaskSpec::try_from(pb::TaskSpec {
        sandbox: None,
        ..full()
    })
    .unwrap_err();
    assert_eq!(e.field(), "spec.sandbox");
}
