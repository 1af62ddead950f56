//! Documents that parse, what they parse to, and documents refused as a whole.

use super::*;

#[test]
fn seed_example_parses() {
    let spec = parse_manifest_yaml(SEED).unwrap();
    assert_eq!(spec.name, "Refactor authentication module");
    assert_eq!(spec.priority, TaskPriority::High);
    assert_eq!(
        spec.labels.get("team").map(String::as_str),
        Some("platform")
    );
    assert_eq!(spec.repository.url, "https://github.com/org/repo");
    assert_eq!(spec.repository.branch.as_deref(), Some("main"));
    assert_eq!(spec.repository.commit, None);
    assert!(spec
        .agent
        .prompt
        .starts_with("Refactor the authentication module"));
    assert_eq!(
        spec.agent.model.as_deref(),
        Some("claude-sonnet-4-5-20250929")
    );
    assert_eq!(spec.agent.max_turns, Some(100));
    assert_eq!(spec.agent.provider, Provider::Claude);
    assert_eq!(spec.agent.allowed_tools, None);
    assert_eq!(spec.agent.script, None);
    assert_eq!(
        spec.sandbox,
        SandboxSpec {
            profile: Some("agentic-dev".into()),
            cpus: Some(4),
            memory_bytes: Some(8 * GIB),
            disk_bytes: Some(40 * GIB),
            network_mode: NetworkMode::Outbound,
            runtime: RuntimeKind::Process,
            full_control: false,
        }
    );
    assert_eq!(spec.requires_runtime(), RuntimeKind::Process);
    assert_eq!(spec.placement, Placement::Dedicated);
    let startup = spec.startup_profile.as_ref().unwrap();
    assert_eq!(startup.id, "startup-claude-refactor");
    assert_eq!(startup.trigger, StartupTrigger::OnInstanceReady);
    assert_eq!(startup.session.workdir, "/workspace");
    assert_eq!((startup.session.cols, startup.session.rows), (120, 30));
    assert_eq!(startup.credential_refs.len(), 2);
    assert_eq!(
        startup.credential_refs[1].id.as_str(),
        "cred_github_repo_push"
    );
    assert_eq!(startup.credential_refs[1].mount, "github_token");
    assert_eq!(startup.readiness.probes[1].kind, "repo_access");
    assert_eq!(startup.observation.redaction_profile, "provider-secrets-v1");
    let lifecycle = &spec.lifecycle;
    assert_eq!(lifecycle.failure_action, FailureAction::Preserve);
    assert_eq!(lifecycle.timeout_ms, 86_400_000);
    assert_eq!(lifecycle.stage_timeout_ms, 15 * 60_000);
    assert_eq!(lifecycle.provision_timeout_ms, 10 * 60_000);
    assert_eq!(lifecycle.hang_timeout_ms, 30 * 60_000);
    assert_eq!(lifecycle.cancel_grace_ms, 30_000);
    assert_eq!(
        lifecycle.artifact_patterns,
        ["*.patch", "coverage/**/*", "reports/*.json"]
    );
    assert_eq!(lifecycle.success_exit_codes, [0]);
    assert!(lifecycle.is_success_exit_code(0));
    assert!(!lifecycle.is_success_exit_code(1));
    assert_eq!(lifecycle.retries, RetryPolicy::default());
    assert_eq!(lifecycle.retries.clone.backoff_ms, [5_000, 10_000, 20_000]);
    assert_eq!(spec.validate(), Ok(()));
}

#[test]
fn seed_example_round_trips_through_bincode() {
    let spec = parse_manifest_yaml(SEED).unwrap();
    let config = bincode::config::standard();
    let bytes = bincode::serde::encode_to_vec(&spec, config).unwrap();
    let (decoded, used): (TaskSpec, usize) =
        bincode::serde::decode_from_slice(&bytes, config).unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(decoded, spec);
    assert_eq!(decoded.validate(), Ok(()));
}

#[test]
fn project_placement_round_trips_through_bincode() {
    let doc = mutated(&[(
        "placement",
        "{ kind: project, tenant: acme, project: web, profile: reviewer }",
    )]);
    let spec = parse_both(&doc).0.unwrap();
    assert_eq!(
        spec.placement,
        Placement::Project {
            tenant: TenantId::new("acme").unwrap(),
            project: ProjectId::new("web").unwrap(),
            profile: ProfileKey::new("reviewer").unwrap(),
        }
    );
    let config = bincode::config::standard();
    let bytes = bincode::serde::encode_to_vec(&spec, config).unwrap();
    let (decoded, _): (TaskSpec, usize) =
        bincode::serde::decode_from_slice(&bytes, config).unwrap();
    assert_eq!(decoded, spec);
}

#[test]
fn minimal_manifest_takes_defaults() {
    let spec = parse_manifest_yaml(MINIMAL).unwrap();
    let expected = TaskSpec {
        name: "minimal".into(),
        labels: BTreeMap::new(),
        priority: TaskPriority::Normal,
        repository: RepositorySpec {
            url: "https://github.com/org/repo".into(),
            branch: None,
            commit: None,
            subpath: None,
        },
        agent: AgentSpec {
            prompt: "Fix the flaky test.".into(),
            model: None,
            max_turns: None,
            allowed_tools: None,
            provider: Provider::Claude,
            script: None,
        },
        sandbox: RawSandbox::default_spec(),
        placement: Placement::Dedicated,
        startup_profile: None,
        lifecycle: LifecycleSpec::default(),
    };
    assert_eq!(spec, expected);
    assert_eq!(spec.sandbox.network_mode, NetworkMode::Outbound);
    assert_eq!(spec.sandbox.runtime, RuntimeKind::Process);
    assert_eq!(spec.lifecycle.failure_action, FailureAction::Destroy);
    assert_eq!(spec.validate(), Ok(()));

    let json = r#"{"version": "1", "kind": "Task", "metadata": {"name": "minimal"},
            "repository": {"url": "https://github.com/org/repo"},
            "agent": {"prompt": "Fix the flaky test."}}"#;
    assert_eq!(parse_manifest_json(json).unwrap(), expected);
}

#[test]
fn full_manifest_with_every_extension_parses() {
    let doc = mutated(&[
        ("version", "1"),
        ("metadata.labels", "{ priority: critical, app.kubernetes.io/name: web, build: 42 }"),
        ("repository.url", "git@github.com:org/repo.git"),
        ("repository.branch", "feature/oauth-2"),
        ("repository.commit", "0a1b2c3d4e5f"),
        ("repository.subpath", "packages/auth"),
        ("agent.provider", "script"),
        ("agent.script", "'echo hi'"),
        ("agent.allowed_tools", "[Read, 'Bash(git:*)']"),
        ("sandbox", "{ memory: 512M, disk: 1G, network_mode: isolated, runtime: kvm, full_control: true, cpus: 256 }"),
        ("placement", "{ kind: project, tenant: acme, project: web, profile: reviewer }"),
        ("startup_profile", STARTUP),
        ("lifecycle.timeout", "7d"),
        ("lifecycle.stage_timeout", "1h30m"),
        ("lifecycle.provision_timeout", "1s"),
        ("lifecycle.hang_timeout", "45m"),
        ("lifecycle.cancel_grace", "0s"),
        ("lifecycle.success_exit_codes", "[0, 3, 255]"),
        ("lifecycle.retries", "{ clone: { max: 5 }, provision: { backoff: [1s, 1h] }, agent_connect: { max: 0, backoff: [500ms] } }"),
    ]);
    let (from_yaml, from_json) = parse_both(&doc);
    let spec = from_yaml.unwrap();
    assert_eq!(from_json.unwrap(), spec);
    assert_eq!(spec.priority, TaskPriority::Critical);
    assert_eq!(spec.labels["build"], "42");
    assert_eq!(spec.agent.provider, Provider::Script);
    assert_eq!(spec.sandbox.memory_bytes, Some(512 << 20));
    assert_eq!(spec.requires_runtime(), RuntimeKind::Kvm);
    assert!(spec.sandbox.full_control);
    assert_eq!(spec.lifecycle.stage_timeout_ms, 5_400_000);
    assert_eq!(spec.lifecycle.success_exit_codes, [0, 3, 255]);
    let retries = &spec.lifecycle.retries;
    assert_eq!(retries.clone, RetrySpec::new(5, &[5_000, 10_000, 20_000]));
    assert_eq!(retries.provision, RetrySpec::new(2, &[1_000, 3_600_000]));
    assert_eq!(retries.agent_connect, RetrySpec::new(0, &[500]));
    assert_eq!(spec.validate(), Ok(()));
}

#[test]
fn aliases_are_reported_as_written() {
    let doc = mutated(&[("agent", "-"), ("claude", "{ prompt: '' }")]);
    let (y, j) = parse_both(&doc);
    assert_eq!(y.unwrap_err().field, "claude.prompt");
    assert_eq!(j.unwrap_err().field, "claude.prompt");

    let doc = mutated(&[("agent", "-"), ("claude", "{ prompt: x, max_turns: many }")]);
    assert_eq!(parse_both(&doc).0.unwrap_err().field, "claude.max_turns");

    let doc = mutated(&[("sandbox.memory", "1K")]);
    assert_eq!(parse_both(&doc).0.unwrap_err().field, "sandbox.memory");
    let doc = mutated(&[("vm.memory", "1K")]);
    assert_eq!(parse_both(&doc).0.unwrap_err().field, "vm.memory");

    let doc = mutated(&[("claude", "{ prompt: x }")]);
    let err = parse_both(&doc).0.unwrap_err();
    assert_eq!(err.field, "claude");
    assert!(err.reason.contains("alias"), "{err}");

    let doc = mutated(&[("vm", "{}"), ("sandbox", "{}")]);
    assert_eq!(parse_both(&doc).0.unwrap_err().field, "sandbox");

    let doc = mutated(&[("agent", "-")]);
    assert_eq!(parse_both(&doc).0.unwrap_err().field, "agent");
}

#[test]
fn oversized_manifest_is_refused_before_parsing() {
    let text = format!("{MINIMAL}# {}\n", "x".repeat(MANIFEST_BYTES_MAX));
    for err in [
        parse_manifest_yaml(&text).unwrap_err(),
        parse_manifest_json(&text).unwrap_err(),
    ] {
        assert_eq!(err.field, "manifest");
        assert!(err.reason.contains("at most"), "{err}");
    }
}

#[test]
fn malformed_documents_are_refused() {
    for text in [
        "",
        "version: [",
        "- a\n- b\n",
        "version: \"1\"\n---\nkind: Task\n",
    ] {
        let err = parse_manifest_yaml(text).unwrap_err();
        assert!(!err.field.is_empty(), "{text:?}: {err}");
    }
    let err = parse_manifest_json(r#"{"version": "1"} trailing"#).unwrap_err();
    assert!(!err.field.is_empty(), "{err}");
    let json = serde_json::to_string(&yaml(MINIMAL)).unwrap();
    let err = parse_manifest_json(&format!("{json} {{}}")).unwrap_err();
    assert_eq!(err.field, "manifest");
    // A second document must not be silently dropped.
    let err = parse_manifest_yaml(&format!("{MINIMAL}---\nkind: Other\n")).unwrap_err();
    assert_eq!(err.field, "manifest");
}

#[test]
fn repeated_keys_are_refused() {
    let err = parse_manifest_yaml(&format!("{MINIMAL}kind: Task\n")).unwrap_err();
    assert_eq!(err.field, "kind");
    let text = MINIMAL.replace(
        "  name: minimal\n",
        "  name: minimal\n  labels: {team: a, team: b}\n",
    );
    let err = parse_manifest_yaml(&text).unwrap_err();
    assert_eq!(err.field, "metadata.labels");
    assert!(err.reason.contains("\"team\""), "{err}");
    let json = r#"{"version": "1", "kind": "Task",
            "metadata": {"name": "m", "labels": {"team": "a", "team": "b"}},
            "repository": {"url": "https://github.com/org/repo"}, "agent": {"prompt": "p"}}"#;
    assert_eq!(
        parse_manifest_json(json).unwrap_err().field,
        "metadata.labels"
    );
}

#[test]
fn accepted_repository_locations() {
    for url in [
        "https://github.com/org/repo",
        "http://git.local:8080/repo.git",
        "ssh://git@github.com/org/repo.git",
        "git://example.org/repo",
        "file:///srv/git/repo",
        "/srv/git/repo",
        "git@github.com:org/repo.git",
    ] {
        let spec = parse_manifest_yaml(
            &yaml_serde::to_string(&mutated(&[("repository.url", &format!("'{url}'"))])).unwrap(),
        );
        assert!(spec.is_ok(), "{url}: {spec:?}");
    }
}

/// A new submission names a known redaction profile; a spec decoded from the log with any
/// other name (written before the profiles were named) still validates, so replay applies it.
#[test]
fn an_unknown_redaction_profile_is_refused_at_submission_only() {
    let refused = parse_manifest_yaml(&SEED.replace(
        "redaction_profile: provider-secrets-v1",
        "redaction_profile: secrets-v1",
    ))
    .unwrap_err();
    assert_eq!(
        refused.field, "startup_profile.observation.redaction_profile",
        "{refused}"
    );
    assert!(
        refused.reason.contains("credentials, provider-secrets-v1"),
        "{refused}"
    );
    let mut decoded = parse_manifest_yaml(SEED).unwrap();
    decoded
        .startup_profile
        .as_mut()
        .expect("the seed has a startup profile")
        .observation
        .redaction_profile = "secrets-v1".into();
    decoded.validate().expect("the log's old names still apply");
}

/// The same for the retention class: a new submission names one a worker knows the age of; the
/// log's older names still apply.
#[test]
fn an_unknown_retention_class_is_refused_at_submission_only() {
    for known in crate::manifest::RETENTION_CLASSES {
        let spec = parse_manifest_yaml(&SEED.replace(
            "retention_class: credentialed-short",
            &format!("retention_class: {known}"),
        ))
        .unwrap_or_else(|e| panic!("{known}: {e}"));
        let profile = spec
            .startup_profile
            .expect("the seed has a startup profile");
        assert_eq!(profile.observation.retention_class, known);
    }
    let refused = parse_manifest_yaml(&SEED.replace(
        "retention_class: credentialed-short",
        "retention_class: forever",
    ))
    .unwrap_err();
    assert_eq!(
        refused.field, "startup_profile.observation.retention_class",
        "{refused}"
    );
    assert!(
        refused
            .reason
            .contains("\"forever\"; expected one of standard, short, credentialed-short"),
        "{refused}"
    );
    let mut decoded = parse_manifest_yaml(SEED).unwrap();
    decoded
        .startup_profile
        .as_mut()
        .expect("the seed has a startup profile")
        .observation
        .retention_class = "forever".into();
    decoded.validate().expect("the log's old names still apply");
}
