//! Worker policy (issue 14, DESIGN §5): a manifest no live worker's policy accepts is refused
//! at submission naming the field, and nothing is stored. A real node and a real worker
//! started with `--policy FILE`.

mod support;

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
