//! Worker policy (issue 14, DESIGN §5): a manifest no live worker's policy accepts is refused
//! at submission naming the field, and nothing is stored; an agent launch that would make a
//! project's sandbox from a repository the policy refuses is refused naming the field, and
//! nothing is cloned or attached. A real node and a real worker started with `--policy FILE`.

mod support;

use serde_json::json;
use squadron_client::{LaunchAgent, SandboxRepository};
use squadron_core::ids::{ProfileId, WorkerId};
use support::*;

const POLICY: &str = "network_modes = [\"isolated\", \"outbound\"]\nfull_control = false\n\
                      repository_sources = [\"https\", \"ssh\"]\ncpus_max = 2\n";

fn manifest(url: &str, vm: &str) -> String {
    format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: p\nrepository:\n  url: {url}\n\
         agent:\n  prompt: p\n  provider: script\n  script: \"true\"\nvm:\n  runtime: process\n{vm}"
    )
}

#[test]
fn a_manifest_beyond_every_worker_s_policy_is_refused_naming_the_field() {
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, POLICY).expect("policy");
    let id = unique_worker_id("policy");
    let args = vec!["--policy".to_string(), policy.display().to_string()];
    let _worker = WorkerProc::start_with(dir.path(), &id, vec![url.clone()], "process", args);

    let stated = http_get(&format!("{url}/api/v1/workers/{id}/policy")).expect("policy");
    assert_eq!(
        stated["repository_sources"],
        serde_json::json!(["https", "ssh"])
    );
    assert_eq!(stated["cpus_max"], 2);

    let before = http_get(&format!("{url}/api/v1/tasks")).expect("tasks");
    let repo = git_repo(dir.path());
    for (yaml, field) in [
        (manifest(&repo.display().to_string(), ""), "repository.url"),
        (
            manifest(&format!("file://{}", repo.display()), ""),
            "repository.url",
        ),
        (manifest("http://example.com/r.git", ""), "repository.url"),
        (
            manifest("https://example.com/r.git", "  cpus: 4\n"),
            "vm.cpus",
        ),
        (
            manifest("https://example.com/r.git", "  network_mode: full\n"),
            "vm.network_mode",
        ),
    ] {
        let r = submit_yaml(&url, &yaml);
        assert_eq!(r.status, 400, "{field}: {r:?}");
        assert_eq!(r.body["field"], field, "{r:?}");
        let message = r.body["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&id),
            "the refusing worker is named: {message}"
        );
    }
    assert_eq!(
        http_get(&format!("{url}/api/v1/tasks")).expect("tasks"),
        before,
        "nothing was stored"
    );

    // Within the policy, the same manifest is taken.
    let ok = submit_yaml(
        &url,
        &manifest("https://example.invalid/r.git", "  cpus: 2\n"),
    );
    assert!(ok.ok(), "{ok:?}");
}

#[test]
fn an_agent_launch_from_a_repository_the_policy_refuses_clones_nothing() {
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, POLICY).expect("policy");
    let id = unique_worker_id("policy-agent");
    let args = vec!["--policy".to_string(), policy.display().to_string()];
    let worker = WorkerProc::start_with(dir.path(), &id, vec![url.clone()], "process", args);

    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "held"}),
    )
    .expect("project");
    assert!(r.ok(), "{r:?}");
    let r = post(
        &format!("{url}/api/v1/projects/acme/held/profiles"),
        json!({"key": "agent-0", "providers": ["codex"]}),
    )
    .expect("profile");
    assert!(r.ok(), "{r:?}");
    let profile =
        ProfileId::new(r.body["profile_created"]["profile"].as_u64().expect("id")).expect("id");

    // Another tenant's checkout on this host, as a path, a file URL and a relative path.
    let repo = git_repo(dir.path());
    let rt = rt();
    let client = client_with_timeouts(
        cluster.urls(),
        std::time::Duration::from_secs(60),
        std::time::Duration::from_secs(2),
    );
    for source in [
        repo.display().to_string(),
        format!("file://{}", repo.display()),
        "../../other-tenant/repo".to_string(),
    ] {
        let launch = LaunchAgent {
            worker: Some(WorkerId::new(id.clone()).expect("worker id")),
            repository: Some(SandboxRepository {
                url: source.clone(),
                branch: Some("main".into()),
            }),
            ..LaunchAgent::default()
        };
        let err = rt
            .block_on(client.agent_launch(profile, &launch))
            .expect_err(&source);
        let body = err.body().unwrap_or_else(|| panic!("{source}: {err}"));
        assert_eq!(
            body.field.as_deref(),
            Some("repository.url"),
            "{source}: {err}"
        );
    }
    let projects = http_get(&format!("{url}/api/v1/projects")).expect("projects");
    let held = projects
        .as_array()
        .and_then(|rows| rows.iter().find(|p| p["project"] == "held"))
        .unwrap_or_else(|| panic!("{projects}"));
    assert!(held["sandbox"].is_null(), "nothing attached: {held}");
    assert!(
        !worker.data_dir.join("projects/acme/held").exists(),
        "nothing cloned"
    );
}
