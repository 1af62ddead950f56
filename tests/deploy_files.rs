//! `deploy/` holds what it says: the systemd units pass `systemd-analyze verify` with no
//! warning (the binary path pointed at the one under test), and every flag a unit passes is one
//! the binary's own `--help` lists, so a renamed flag breaks this test, not a user's host.

mod support;

use std::path::Path;
use std::process::Command;

use support::BIN;

const UNITS: [(&str, &str); 2] = [
    ("squadron-node.service", "server"),
    ("squadron-worker.service", "worker"),
];

fn deploy(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The unit's `ExecStart=` line.
fn exec_start(unit: &str) -> String {
    unit.lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart line")
        .to_string()
}

#[test]
fn the_systemd_units_verify_without_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, _) in UNITS {
        let unit = deploy(&format!("systemd/{name}")).replace("/usr/local/bin/squadron", BIN);
        let path = dir.path().join(name);
        std::fs::write(&path, unit).expect("write the unit");
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .expect("systemd-analyze (systemd)");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.trim().is_empty(),
            "{name}: exit {}, {stderr}",
            out.status
        );
    }
}

#[test]
fn every_flag_a_unit_passes_is_one_the_binary_takes() {
    for (name, command) in UNITS {
        let line = exec_start(&deploy(&format!("systemd/{name}")));
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.get(1), Some(&command), "{name}: {line}");
        let help = Command::new(BIN)
            .args([command, "--help"])
            .output()
            .expect("squadron --help");
        let help = String::from_utf8_lossy(&help.stdout);
        for flag in words.iter().filter(|w| w.starts_with("--")) {
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "{name} passes {flag}, which `squadron {command} --help` does not list"
            );
        }
    }
}

#[test]
fn the_worker_env_example_sets_every_variable_the_worker_unit_reads() {
    let unit = deploy("systemd/squadron-worker.service");
    let env = deploy("systemd/worker.env.example");
    let set: Vec<&str> = env
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    for var in exec_start(&unit)
        .split("${")
        .skip(1)
        .filter_map(|s| s.split_once('}').map(|(v, _)| v))
    {
        assert!(set.contains(&var), "worker.env.example does not set {var}");
    }
}

/// The configurations of `deploy/kubernetes/config.yaml` (the ConfigMap's `squadron-N.toml`
/// keys, by indentation), each as the node would read it.
fn kubernetes_node_configs() -> Vec<(String, String)> {
    let text = deploy("kubernetes/config.yaml");
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(key) = line
            .strip_prefix("  ")
            .and_then(|l| l.strip_suffix(": |"))
            .filter(|k| k.ends_with(".toml"))
        {
            out.push((key.to_string(), String::new()));
        } else if let (Some(body), Some((_, toml))) = (line.strip_prefix("    "), out.last_mut()) {
            toml.push_str(body);
            toml.push('\n');
        }
    }
    out
}

#[test]
fn every_node_configuration_of_the_kubernetes_config_map_loads() {
    let configs = kubernetes_node_configs();
    assert_eq!(configs.len(), 3, "{configs:?}");
    let dir = tempfile::tempdir().expect("tempdir");
    for (ordinal, (key, toml)) in configs.iter().enumerate() {
        assert_eq!(key, &format!("squadron-{ordinal}.toml"));
        let path = dir.path().join(key);
        std::fs::write(&path, toml).expect("write");
        let config = squadron_server::config::NodeConfig::load(&path)
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        config.validate().unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(config.node_id, ordinal as u64 + 1, "{key}");
        assert_eq!(config.initial_members.len(), 3, "{key}");
        let me = format!("squadron-{ordinal}.squadron-peers.squadron.svc.cluster.local:8122");
        assert_eq!(config.peer_addr(), me, "{key}");
    }
}

/// `kubernetes-validate` (from PyPI, with the Kubernetes JSON schemas offline), which
/// `scripts/test` installs into its tools venv.
fn kubernetes_validate() -> std::path::PathBuf {
    let venv = std::env::var_os("HOME")
        .map(|h| Path::new(&h).join(".cache/squadron-tools/k8s-venv/bin/kubernetes-validate"));
    venv.filter(|p| p.is_file())
        .unwrap_or_else(|| "kubernetes-validate".into())
}

#[test]
fn the_kubernetes_manifests_meet_the_kubernetes_schemas_strictly() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/kubernetes")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml")
                && p.file_name().is_some_and(|n| n != "kustomization.yaml")
        })
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    let out = Command::new(kubernetes_validate())
        .args(["--strict", "--kubernetes-version", "1.30.0"])
        .args(&files)
        .output()
        .expect("kubernetes-validate (scripts/test installs it: pip kubernetes-validate)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("ERROR") && !text.contains("WARN"), "{text}");
    // Every file the kustomization names is one of them, and every one is named.
    let kustomization = deploy("kubernetes/kustomization.yaml");
    for f in &files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !name.ends_with(".example.yaml") {
            assert!(kustomization.contains(&format!("- {name}")), "{name}");
        }
    }
}

/// Every metric the Grafana dashboard queries is one a node exposes, and every label it
/// groups by is one those metrics carry.
#[test]
fn the_grafana_dashboard_queries_metrics_a_node_exposes() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&deploy("grafana/squadron.json")).expect("dashboard JSON");
    let cluster = support::Cluster::start(1);
    cluster.wait_for_leader(std::time::Duration::from_secs(20));
    // A worker, a project and a task, so the families grouped by label have samples.
    let url = cluster.url(1);
    support::setup_project(&url, "dashboard", 1, 1);
    let task = support::submit_yaml(&url, &support::inert_manifest("dashboard", "process"));
    assert!(task.ok(), "{task:?}");
    let (status, metrics) =
        support::http_text(&format!("{}/metrics", cluster.url(1))).expect("metrics");
    assert_eq!(status, 200);
    let families: Vec<&str> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    for expr in &exprs {
        for name in metric_names(expr) {
            let family = ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name);
            assert!(
                families.contains(&family),
                "{expr}: {name} is not exposed (families: {families:?})"
            );
        }
        for label in grouped_labels(expr) {
            let carried = metric_names(expr).iter().any(|name| {
                metrics
                    .lines()
                    .filter(|l| l.starts_with(name.as_str()) && l.contains('{'))
                    .any(|l| l.contains(&format!("{label}=\"")))
            });
            let sampled = metric_names(expr)
                .iter()
                .any(|name| metrics.lines().any(|l| l.starts_with(&format!("{name}{{"))));
            assert!(!sampled || carried, "{expr}: no sample carries {label}");
        }
    }
}

/// The `squadron_…` names an expression names.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("squadron_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        out.push(name);
    }
    out
}

/// The labels of every `by (…)` of an expression.
fn grouped_labels(expr: &str) -> Vec<String> {
    expr.split("by (")
        .skip(1)
        .filter_map(|s| s.split_once(')').map(|(l, _)| l))
        .flat_map(|l| l.split(',').map(|x| x.trim().to_string()))
        .filter(|l| !l.is_empty() && l != "le")
        .collect()
}
