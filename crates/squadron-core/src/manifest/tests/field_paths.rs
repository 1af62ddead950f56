//! Every refused value is reported at the path of the field that holds it, from YAML and from
//! JSON alike.

use super::*;

/// Each `(edits, field)`: the minimal manifest with `edits` is refused, in YAML and in JSON,
/// with an error naming `field`.
fn assert_refused_at(cases: &[(Vec<(&str, &str)>, &str)]) {
    for (edits, field) in cases {
        let doc = mutated(edits);
        let (from_yaml, from_json) = parse_both(&doc);
        let err = from_yaml.expect_err(&format!("YAML {edits:?} should be refused"));
        assert_eq!(err.field, *field, "YAML {edits:?}: {err}");
        assert!(!err.reason.is_empty(), "{edits:?}");
        let err = from_json.expect_err(&format!("JSON {edits:?} should be refused"));
        assert_eq!(err.field, *field, "JSON {edits:?}: {err}");
    }
}

#[test]
fn document_shape_errors_name_their_field() {
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![("tiemout", "1")], "tiemout"),
        (vec![("lifecycle.tiemout", "1h")], "lifecycle.tiemout"),
        (vec![("repository.token", "x")], "repository.token"),
        (vec![("metadata", "-")], "metadata"),
        (vec![("repository.url", "-")], "repository.url"),
        (vec![("agent.prompt", "-")], "agent.prompt"),
        (vec![("version", "-")], "version"),
        (vec![("version", "'2'")], "version"),
        (vec![("version", "1.0")], "version"),
        (vec![("kind", "Job")], "kind"),
        (vec![("kind", "-")], "kind"),
    ];
    assert_refused_at(&cases);
}

#[test]
fn metadata_errors_name_their_field() {
    let long_name = format!("'{}'", "n".repeat(TASK_NAME_BYTES_MAX + 1));
    let long_value = "v".repeat(LABEL_VALUE_BYTES_MAX + 1);
    let many_labels = format!(
        "{{ {} }}",
        (0..=LABELS_MAX)
            .map(|i| format!("k{i}: v"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![("metadata.name", "''")], "metadata.name"),
        (vec![("metadata.name", "\"a\\tb\"")], "metadata.name"),
        (vec![("metadata.name", &long_name)], "metadata.name"),
        (vec![("metadata.labels", &many_labels)], "metadata.labels"),
        (
            vec![("metadata.labels", "{ 'bad key': v }")],
            "metadata.labels",
        ),
        (vec![("metadata.labels", "{ '': v }")], "metadata.labels"),
        (vec![("metadata.labels", "[a]")], "metadata.labels"),
        (
            vec![("metadata.labels.team", &long_value)],
            "metadata.labels.team",
        ),
        (
            vec![("metadata.labels.team", "[a]")],
            "metadata.labels.team",
        ),
        (
            vec![("metadata.labels.priority", "urgent")],
            "metadata.labels.priority",
        ),
        (
            vec![("metadata.labels.priority", "High")],
            "metadata.labels.priority",
        ),
    ];
    assert_refused_at(&cases);
}

#[test]
fn repository_errors_name_their_field() {
    let long_url = format!("https://h/{}", "a".repeat(REPO_URL_BYTES_MAX));
    let long_branch = "b".repeat(GIT_BRANCH_BYTES_MAX + 1);
    let long_commit = "a".repeat(GIT_COMMIT_DIGITS_MAX + 1);
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![("repository.url", "https://user:secret@github.com/org/repo")],
            "repository.url",
        ),
        (
            vec![("repository.url", "https://ghp_token@github.com/org/repo")],
            "repository.url",
        ),
        (
            vec![("repository.url", "ssh://git:pw@github.com/org/repo")],
            "repository.url",
        ),
        (
            vec![("repository.url", "user:pw@github.com:org/repo")],
            "repository.url",
        ),
        (
            vec![("repository.url", "ftp://github.com/org/repo")],
            "repository.url",
        ),
        (
            vec![("repository.url", "https:///org/repo")],
            "repository.url",
        ),
        (
            vec![("repository.url", "'https://github.com/org repo'")],
            "repository.url",
        ),
        (vec![("repository.url", "relative/path")], "repository.url"),
        (vec![("repository.url", "git@github.com")], "repository.url"),
        (
            vec![("repository.url", "'-oProxyCommand=x@h:p'")],
            "repository.url",
        ),
        (
            vec![("repository.url", "'ssh://-oProxyCommand=x/p'")],
            "repository.url",
        ),
        (vec![("repository.url", "'file://'")], "repository.url"),
        (vec![("repository.url", "''")], "repository.url"),
        (vec![("repository.url", &long_url)], "repository.url"),
        (
            vec![("repository.branch", "'bad branch'")],
            "repository.branch",
        ),
        (vec![("repository.branch", "a..b")], "repository.branch"),
        (vec![("repository.branch", "-x")], "repository.branch"),
        (vec![("repository.branch", "a~1")], "repository.branch"),
        (vec![("repository.branch", "'a:b'")], "repository.branch"),
        (vec![("repository.branch", "feature/")], "repository.branch"),
        (vec![("repository.branch", "x.lock")], "repository.branch"),
        (
            vec![("repository.branch", "a/.hidden")],
            "repository.branch",
        ),
        (vec![("repository.branch", "'@'")], "repository.branch"),
        (
            vec![("repository.branch", &long_branch)],
            "repository.branch",
        ),
        (vec![("repository.commit", "abc")], "repository.commit"),
        (vec![("repository.commit", "zzzzzzz")], "repository.commit"),
        (
            vec![("repository.commit", &long_commit)],
            "repository.commit",
        ),
        (vec![("repository.subpath", "/abs")], "repository.subpath"),
        (vec![("repository.subpath", "a/../b")], "repository.subpath"),
        (vec![("repository.subpath", "..")], "repository.subpath"),
        (vec![("repository.subpath", "''")], "repository.subpath"),
    ];
    assert_refused_at(&cases);
}

#[test]
fn agent_errors_name_their_field() {
    let long_prompt = "p".repeat(PROMPT_BYTES_MAX + 1);
    let long_script = "s".repeat(SCRIPT_BYTES_MAX + 1);
    let many_tools = numbered_list("tool", ALLOWED_TOOLS_MAX + 1);
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![("agent.prompt", "''")], "agent.prompt"),
        (vec![("agent.prompt", "'   '")], "agent.prompt"),
        (vec![("agent.prompt", &long_prompt)], "agent.prompt"),
        (vec![("agent.model", "'has space'")], "agent.model"),
        (vec![("agent.model", "''")], "agent.model"),
        (vec![("agent.max_turns", "0")], "agent.max_turns"),
        (vec![("agent.max_turns", "10001")], "agent.max_turns"),
        (vec![("agent.max_turns", "-1")], "agent.max_turns"),
        (
            vec![("agent.allowed_tools", &many_tools)],
            "agent.allowed_tools",
        ),
        (
            vec![("agent.allowed_tools", "[Read, 'has space']")],
            "agent.allowed_tools[1]",
        ),
        (
            vec![("agent.allowed_tools", "[Read, '']")],
            "agent.allowed_tools[1]",
        ),
        (vec![("agent.provider", "gpt")], "agent.provider"),
        (vec![("agent.provider", "script")], "agent.script"),
        (
            vec![("agent.provider", "script"), ("agent.script", "' '")],
            "agent.script",
        ),
        (
            vec![("agent.provider", "script"), ("agent.script", &long_script)],
            "agent.script",
        ),
        (vec![("agent.script", "'echo hi'")], "agent.script"),
        (
            vec![("agent.provider", "codex"), ("agent.script", "'echo hi'")],
            "agent.script",
        ),
        (vec![("agent.temperature", "1")], "agent.temperature"),
    ];
    assert_refused_at(&cases);
}

#[test]
fn sandbox_errors_name_their_field() {
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![("vm.profile", "Bad_Profile")], "vm.profile"),
        (vec![("vm.cpus", "0")], "vm.cpus"),
        (vec![("vm.cpus", "257")], "vm.cpus"),
        (vec![("vm.cpus", "99999999999")], "vm.cpus"),
        (vec![("vm.memory", "8X")], "vm.memory"),
        (vec![("vm.memory", "-8G")], "vm.memory"),
        (vec![("vm.memory", "15M")], "vm.memory"),
        (vec![("vm.memory", "2T")], "vm.memory"),
        (vec![("vm.disk", "8M")], "vm.disk"),
        (vec![("vm.disk", "17T")], "vm.disk"),
        (vec![("vm.disk", "[1]")], "vm.disk"),
        (vec![("vm.network_mode", "host")], "vm.network_mode"),
        (vec![("vm.runtime", "podman")], "vm.runtime"),
        (vec![("vm.full_control", "maybe")], "vm.full_control"),
        (vec![("vm.gpus", "1")], "vm.gpus"),
    ];
    assert_refused_at(&cases);
}

#[test]
fn placement_errors_name_their_field() {
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![("placement.kind", "shared")], "placement.kind"),
        (
            vec![("placement", "{ kind: project, tenant: acme, project: web }")],
            "placement.profile",
        ),
        (
            vec![("placement", "{ kind: project, profile: r, project: web }")],
            "placement.tenant",
        ),
        (vec![("placement", "{ tenant: acme }")], "placement.tenant"),
        (
            vec![("placement", "{ kind: dedicated, profile: r }")],
            "placement.profile",
        ),
        (
            vec![(
                "placement",
                "{ kind: project, tenant: Acme, project: web, profile: r }",
            )],
            "placement.tenant",
        ),
        (
            vec![(
                "placement",
                "{ kind: project, tenant: a, project: w, profile: 'r r' }",
            )],
            "placement.profile",
        ),
    ];
    assert_refused_at(&cases);
}

#[test]
fn startup_profile_errors_name_their_field() {
    let many_refs = format!(
        "[{}]",
        (0..=CREDENTIAL_REFS_MAX)
            .map(|i| format!("{{ id: c{i}, mount: m{i} }}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let many_probes = repeat_list("{ provider: claude, kind: auth }", READINESS_PROBES_MAX + 1);
    let sp = ("startup_profile", STARTUP);
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![sp, ("startup_profile.id", "'Bad Id'")],
            "startup_profile.id",
        ),
        (vec![sp, ("startup_profile.id", "-")], "startup_profile.id"),
        (
            vec![sp, ("startup_profile.trigger", "on_boot")],
            "startup_profile.trigger",
        ),
        (
            vec![sp, ("startup_profile.session.launcher", "''")],
            "startup_profile.session.launcher",
        ),
        (
            vec![sp, ("startup_profile.session.workdir", "relative")],
            "startup_profile.session.workdir",
        ),
        (
            vec![sp, ("startup_profile.session.workdir", "/a/../b")],
            "startup_profile.session.workdir",
        ),
        (
            vec![sp, ("startup_profile.session.cols", "19")],
            "startup_profile.session.cols",
        ),
        (
            vec![sp, ("startup_profile.session.cols", "1001")],
            "startup_profile.session.cols",
        ),
        (
            vec![sp, ("startup_profile.session.rows", "4")],
            "startup_profile.session.rows",
        ),
        (
            vec![sp, ("startup_profile.session.rows", "-")],
            "startup_profile.session.rows",
        ),
        (
            vec![
                sp,
                (
                    "startup_profile.credential_refs",
                    "[{ id: ok, mount: a }, { id: 'Bad Id', mount: b }]",
                ),
            ],
            "startup_profile.credential_refs[1].id",
        ),
        (
            vec![
                sp,
                (
                    "startup_profile.credential_refs",
                    "[{ id: a, mount: key }, { id: b, mount: key }]",
                ),
            ],
            "startup_profile.credential_refs[1].mount",
        ),
        (
            vec![
                sp,
                (
                    "startup_profile.credential_refs",
                    "[{ id: a, mount: key }, { id: b, mount: 'K' }]",
                ),
            ],
            "startup_profile.credential_refs[1].mount",
        ),
        (
            vec![
                sp,
                (
                    "startup_profile.credential_refs",
                    "[{ id: a, mount: key }, { id: b, mount: [1] }]",
                ),
            ],
            "startup_profile.credential_refs[1].mount",
        ),
        (
            vec![
                sp,
                (
                    "startup_profile.credential_refs",
                    "[{ id: a, mount: key }, { id: b, mnt: x }]",
                ),
            ],
            "startup_profile.credential_refs[1].mnt",
        ),
        (
            vec![
                sp,
                (
                    "startup_profile.credential_refs",
                    "[{ id: a, mount: key }, { id: b }]",
                ),
            ],
            "startup_profile.credential_refs[1].mount",
        ),
        (
            vec![sp, ("startup_profile.credential_refs", &many_refs)],
            "startup_profile.credential_refs",
        ),
        (
            vec![
                sp,
                (
                    "startup_profile.readiness.probes",
                    "[{ provider: 'Bad', kind: auth }]",
                ),
            ],
            "startup_profile.readiness.probes[0].provider",
        ),
        (
            vec![
                sp,
                (
                    "startup_profile.readiness.probes",
                    "[{ provider: claude, kind: auth }, { provider: codex, kind: smoke }]",
                ),
            ],
            "startup_profile.readiness.probes[1].kind",
        ),
        (
            vec![sp, ("startup_profile.readiness.probes", &many_probes)],
            "startup_profile.readiness.probes",
        ),
        (
            vec![sp, ("startup_profile.observation.retention_class", "''")],
            "startup_profile.observation.retention_class",
        ),
        (
            vec![sp, ("startup_profile.observation.redaction_profile", "-")],
            "startup_profile.observation.redaction_profile",
        ),
    ];
    assert_refused_at(&cases);
}

#[test]
fn lifecycle_errors_name_their_field() {
    let many_patterns = numbered_list("p", ARTIFACT_PATTERNS_MAX + 1);
    let many_codes = format!(
        "[{}]",
        (0..=SUCCESS_EXIT_CODES_MAX)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let many_backoffs = repeat_list("1s", RETRY_BACKOFF_ENTRIES_MAX + 1);
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![("lifecycle.timeout", "soon")], "lifecycle.timeout"),
        (vec![("lifecycle.timeout", "30")], "lifecycle.timeout"),
        (vec![("lifecycle.timeout", "-1h")], "lifecycle.timeout"),
        (vec![("lifecycle.timeout", "8d")], "lifecycle.timeout"),
        (vec![("lifecycle.timeout", "0s")], "lifecycle.timeout"),
        (vec![("lifecycle.timeout", "999ms")], "lifecycle.timeout"),
        (
            vec![("lifecycle.stage_timeout", "25h")],
            "lifecycle.stage_timeout",
        ),
        (
            vec![("lifecycle.provision_timeout", "0s")],
            "lifecycle.provision_timeout",
        ),
        (
            vec![("lifecycle.provision_timeout", "1d1ms")],
            "lifecycle.provision_timeout",
        ),
        (
            vec![("lifecycle.hang_timeout", "8d")],
            "lifecycle.hang_timeout",
        ),
        (
            vec![("lifecycle.cancel_grace", "2h")],
            "lifecycle.cancel_grace",
        ),
        (
            vec![("lifecycle.failure_action", "explode")],
            "lifecycle.failure_action",
        ),
        (
            vec![("lifecycle.artifact_patterns", "['/etc/passwd']")],
            "lifecycle.artifact_patterns[0]",
        ),
        (
            vec![("lifecycle.artifact_patterns", "['ok/*', '../x']")],
            "lifecycle.artifact_patterns[1]",
        ),
        (
            vec![("lifecycle.artifact_patterns", "['a/**/../b']")],
            "lifecycle.artifact_patterns[0]",
        ),
        (
            vec![("lifecycle.artifact_patterns", "['']")],
            "lifecycle.artifact_patterns[0]",
        ),
        (
            vec![("lifecycle.artifact_patterns", &many_patterns)],
            "lifecycle.artifact_patterns",
        ),
        (
            vec![("lifecycle.success_exit_codes", "[0, 0]")],
            "lifecycle.success_exit_codes[1]",
        ),
        (
            vec![("lifecycle.success_exit_codes", "[]")],
            "lifecycle.success_exit_codes",
        ),
        (
            vec![("lifecycle.success_exit_codes", "[0, 256]")],
            "lifecycle.success_exit_codes[1]",
        ),
        (
            vec![("lifecycle.success_exit_codes", "[-1]")],
            "lifecycle.success_exit_codes[0]",
        ),
        (
            vec![("lifecycle.success_exit_codes", &many_codes)],
            "lifecycle.success_exit_codes",
        ),
        (
            vec![("lifecycle.retries.clone.max", "101")],
            "lifecycle.retries.clone.max",
        ),
        (
            vec![("lifecycle.retries.provision.backoff", "[]")],
            "lifecycle.retries.provision.backoff",
        ),
        (
            vec![("lifecycle.retries.agent_connect.backoff", "[2s, 2h]")],
            "lifecycle.retries.agent_connect.backoff[1]",
        ),
        (
            vec![("lifecycle.retries.agent_connect.backoff", "[2s, later]")],
            "lifecycle.retries.agent_connect.backoff[1]",
        ),
        (
            vec![("lifecycle.retries.clone.backoff", &many_backoffs)],
            "lifecycle.retries.clone.backoff",
        ),
        (
            vec![("lifecycle.retries.restore", "{ max: 1 }")],
            "lifecycle.retries.restore",
        ),
        (
            vec![("lifecycle.retries.clone.tries", "1")],
            "lifecycle.retries.clone.tries",
        ),
    ];
    assert_refused_at(&cases);
}

#[test]
fn reasons_explain_themselves() {
    let reason = |edits: &[(&str, &str)]| parse_both(&mutated(edits)).0.unwrap_err().reason;

    let r = reason(&[("lifecycle.tiemout", "1h")]);
    assert!(
        r.starts_with("unknown field `tiemout`") && r.contains("`timeout`"),
        "{r}"
    );
    let r = reason(&[("agent.max_turns", "many")]);
    assert!(r.starts_with("invalid type"), "{r}");
    let r = reason(&[("repository.url", "https://user:secret@github.com/org/repo")]);
    assert!(r.contains("credential_refs"), "{r}");
    assert!(
        !r.contains("secret@"),
        "the reason must not echo the secret: {r}"
    );
    let r = reason(&[("lifecycle.timeout", "soon")]);
    assert!(r.contains("24h"), "{r}");
    let r = reason(&[("lifecycle.timeout", "8d")]);
    assert!(r.contains("between 1s and 168h"), "{r}");
    let r = reason(&[("vm.memory", "2T")]);
    assert!(r.contains("between 16M and 1T"), "{r}");
    let r = reason(&[("metadata.labels.priority", "urgent")]);
    assert!(r.contains("low, normal, high, critical"), "{r}");
    let r = reason(&[("agent.prompt", "-")]);
    assert!(r.starts_with("is required"), "{r}");
    let r = reason(&[("lifecycle.failure_action", "explode")]);
    assert!(r.contains("destroy") && r.contains("preserve"), "{r}");
}
