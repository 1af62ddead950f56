//! Documents refused for their shape before they are deserialized: alias bombs and deep
//! nesting, quickly and without expanding them.

use std::time::Instant;

use super::*;

/// Parses `text` as a YAML manifest and returns the refusal, printing how long it took.
fn refusal(what: &str, text: &str) -> ValidationError {
    let started = Instant::now();
    let result = parse_manifest_yaml(text);
    let elapsed = started.elapsed();
    let err = result.expect_err(&format!("{what} must be refused"));
    println!(
        "{what}: refused in {elapsed:?} ({} bytes): {err}",
        text.len()
    );
    err
}

/// "Billion laughs": 9 levels of 9 aliases each, 9^9 (387 million) strings once expanded.
fn alias_bomb() -> String {
    let mut text = String::from(
        "a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for level in 1..9 {
        let aliases = vec![format!("*a{}", level - 1); 9].join(",");
        text.push_str(&format!("a{level}: &a{level} [{aliases}]\n"));
    }
    text + MINIMAL
}

#[test]
fn an_alias_bomb_is_refused_before_it_expands() {
    let text = alias_bomb();
    let err = refusal("billion laughs", &text);
    assert_eq!(err.field, "manifest");
    assert!(err.reason.contains("alias"), "{err}");
    assert!(
        err.reason.contains(&MANIFEST_YAML_NODES_MIN.to_string()),
        "the reason names the budget: {err}"
    );
}

#[test]
fn a_long_list_aliased_many_times_is_refused() {
    // Within yaml_serde's own limit (100 alias jumps per event) but quadratic: 2,000 items
    // repeated 2,000 times are 4 million nodes.
    let items = vec!["x"; 2_000].join(",");
    let aliases = vec!["*big"; 2_000].join(",");
    let text = format!("big: &big [{items}]\nmany: [{aliases}]\n{MINIMAL}");
    let err = refusal("quadratic aliases", &text);
    assert_eq!(err.field, "manifest");
    assert!(err.reason.contains("alias"), "{err}");
}

#[test]
fn deep_nesting_is_refused() {
    let depth = 100_000;
    let flow = format!(
        "deep: {}{}\n{MINIMAL}",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let err = refusal("100,000 nested sequences", &flow);
    assert_eq!(err.field, "manifest");
    assert!(
        err.reason
            .contains(&format!("deeper than {MANIFEST_YAML_DEPTH_MAX} levels")),
        "{err}"
    );
    let block: String = (0..200)
        .map(|level| format!("{}k:\n", " ".repeat(level)))
        .collect();
    let err = refusal("200 nested mappings", &format!("{MINIMAL}deep:\n{block}"));
    assert_eq!(err.field, "manifest");
    assert!(err.reason.contains("deeper than"), "{err}");
}

#[test]
fn unreadable_nesting_is_refused_without_loading_it() {
    // '@' is reserved: neither parser reads past it. Without the streaming parser's measure,
    // the brackets after it bound the nesting, and there are too many.
    let depth = 100_000;
    let text = format!("{MINIMAL}@x: {}{}\n", "[".repeat(depth), "]".repeat(depth));
    let err = refusal("unreadable, then 100,000 nested sequences", &text);
    assert_eq!(err.field, "manifest");
    assert!(err.reason.contains("cannot be measured"), "{err}");
    // With few brackets the document goes on to the typed pass, which names the problem.
    let err = refusal("unreadable", &format!("{MINIMAL}@x: [a]\n"));
    assert!(err.reason.contains("cannot start any token"), "{err}");
}

#[test]
fn aliases_within_the_budget_still_parse() {
    let text = r#"
version: "1"
kind: Task
metadata:
  name: shared backoff
repository:
  url: https://github.com/org/repo
agent:
  prompt: Fix the flaky test.
lifecycle:
  retries:
    clone: &retry { max: 2, backoff: [1s, 5s] }
    provision: *retry
    agent_connect: *retry
"#;
    let spec = parse_manifest_yaml(text).unwrap();
    let retries = &spec.lifecycle.retries;
    assert_eq!(retries.clone, RetrySpec::new(2, &[1_000, 5_000]));
    assert_eq!(retries.provision, retries.clone);
    assert_eq!(retries.agent_connect, retries.clone);
}
