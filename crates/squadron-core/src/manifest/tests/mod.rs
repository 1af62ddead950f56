//! Manifest tests: the fixtures and document-editing helpers here, one file per concern.

mod field_paths;
mod limits;
mod parsing;
mod spec_rules;

use std::collections::BTreeMap;

use yaml_serde::{Mapping, Value};

use super::raw::RawSandbox;
use super::*;
use crate::ids::{ProfileKey, ProjectId, TenantId};
use crate::limits::*;
use crate::provider::Provider;
use crate::validation_error::ValidationError;

/// The seed's "Task Manifest Reference", verbatim.
const SEED: &str = r#"version: "1"
kind: Task

metadata:
  name: "Refactor authentication module"
  labels:
    team: platform
    priority: high

repository:
  url: https://github.com/org/repo
  branch: main
  # commit: abc123  # Optional: pin to commit
  # subpath: packages/auth  # Optional: subdirectory

claude:
  prompt: |
    Refactor the authentication module to use OAuth 2.0.
    Update all tests and documentation.
  model: claude-sonnet-4-5-20250929
  max_turns: 100
  # allowed_tools: [Read, Write, Edit, Bash, Glob, Grep]  # Optional whitelist

vm:
  profile: agentic-dev
  cpus: 4
  memory: 8G
  disk: 40G
  # network_mode: outbound  # isolated | outbound | full

startup_profile:
  id: startup-claude-refactor
  trigger: on_instance_ready
  session:
    launcher: agentic-claude-automation
    workdir: /workspace
    cols: 120
    rows: 30
  credential_refs:
    - id: cred_anthropic_platform_ci
      mount: anthropic_api_key
    - id: cred_github_repo_push
      mount: github_token
  readiness:
    probes:
      - provider: claude
        kind: auth
      - provider: github
        kind: repo_access
  observation:
    retention_class: credentialed-short
    redaction_profile: provider-secrets-v1

lifecycle:
  timeout: 24h
  failure_action: preserve  # destroy | preserve
  artifact_patterns:
    - "*.patch"
    - "coverage/**/*"
    - "reports/*.json"
"#;

const MINIMAL: &str = r#"
version: "1"
kind: Task
metadata:
  name: minimal
repository:
  url: https://github.com/org/repo
agent:
  prompt: Fix the flaky test.
"#;

const STARTUP: &str = r#"
id: startup-a
trigger: on_instance_ready
session: { launcher: agentic-claude-automation, workdir: /workspace, cols: 120, rows: 30 }
credential_refs:
  - { id: cred_a, mount: key_a }
  - { id: cred_b, mount: key_b }
readiness: { probes: [ { provider: claude, kind: auth } ] }
observation: { retention_class: short, redaction_profile: credentials }
"#;

const GIB: u64 = 1 << 30;

fn yaml(text: &str) -> Value {
    yaml_serde::from_str(text).unwrap()
}

fn set(doc: &mut Value, path: &str, value: Value) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap();
    let mut node = doc;
    for part in parts {
        let map = node.as_mapping_mut().unwrap();
        if !map.contains_key(part) {
            map.insert(part.into(), Value::Mapping(Mapping::new()));
        }
        node = map.get_mut(part).unwrap();
    }
    node.as_mapping_mut().unwrap().insert(last.into(), value);
}

fn remove(doc: &mut Value, path: &str) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap();
    let mut node = doc;
    for part in parts {
        node = node.get_mut(part).unwrap();
    }
    node.as_mapping_mut().unwrap().remove(last);
}

/// The minimal manifest with `(path, yaml value)` edits applied; value `-` removes the field.
fn mutated(edits: &[(&str, &str)]) -> Value {
    let mut doc = yaml(MINIMAL);
    for (path, value) in edits {
        if *value == "-" {
            remove(&mut doc, path);
        } else {
            set(&mut doc, path, yaml(value));
        }
    }
    doc
}

fn parse_both(
    doc: &Value,
) -> (
    Result<TaskSpec, ValidationError>,
    Result<TaskSpec, ValidationError>,
) {
    let from_yaml = parse_manifest_yaml(&yaml_serde::to_string(doc).unwrap());
    let from_json = parse_manifest_json(&serde_json::to_string(doc).unwrap());
    (from_yaml, from_json)
}

fn repeat_list(item: &str, n: usize) -> String {
    format!("[{}]", vec![item; n].join(", "))
}

fn numbered_list(prefix: &str, n: usize) -> String {
    let items: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    format!("[{}]", items.join(", "))
}
