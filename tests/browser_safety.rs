//! A web page in an operator's browser cannot drive a node: a cross-origin write, a JSON body
//! sent as `text/plain` or a form, a DNS-rebound `Host`, and a cross-origin WebSocket are all
//! refused, and none of them changes anything.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;

const PROJECT: &str = r#"{"tenant": "acme", "project": "web"}"#;

fn assert_refused(r: &Reply, status: u16, code: &str, what: &str) {
    assert_eq!(r.status, status, "{what}: {r:?}");
    assert_eq!(r.body["code"], json!(code), "{what}: {r:?}");
}

fn assert_no_project(url: &str) {
    let r = http_send(
        "GET",
        &format!("{url}/api/v1/projects/acme/web"),
        None,
        None,
    )
    .expect("the node answers");
    assert_eq!(
        r.status, 404,
        "a refused request created the project: {r:?}"
    );
}

#[test]
fn browser_style_requests_from_elsewhere_are_refused_and_change_nothing() {
    let cluster = Cluster::start(1);
    cluster.wait_for_leader(Duration::from_secs(20));
    let url = cluster.url(1);
    let projects = format!("{url}/api/v1/projects");
    let json_type = Some(("application/json", PROJECT));

    let evil = [("Origin", "http://evil.example")];
    let r = http_send_raw("POST", &projects, &evil, json_type).unwrap();
    assert_refused(&r, 403, "permission_denied", "cross-origin POST");
    assert!(r.body["message"]
        .as_str()
        .unwrap_or("")
        .contains("evil.example"));
    let r = http_send_raw("POST", &projects, &[("Origin", "null")], json_type).unwrap();
    assert_refused(&r, 403, "permission_denied", "opaque-origin POST");

    for simple in [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=b",
    ] {
        let r = http_send_raw("POST", &projects, &[], Some((simple, PROJECT))).unwrap();
        assert_refused(&r, 415, "unsupported_media_type", simple);
        assert_eq!(r.body["field"], json!("Content-Type"), "{r:?}");
    }
    let submit = format!("{url}/api/v1/tasks");
    let r = http_send_raw("POST", &submit, &[], Some(("text/plain", "{}"))).unwrap();
    assert_refused(
        &r,
        415,
        "unsupported_media_type",
        "a manifest as text/plain",
    );
    let rebound = [("Host", "attacker.example:80")];
    let r = http_send_raw("POST", &projects, &rebound, json_type).unwrap();
    assert_refused(&r, 400, "invalid_argument", "a rebound Host");
    assert_eq!(r.body["field"], json!("Host"), "{r:?}");
    let r = http_send_raw(
        "GET",
        &format!("{url}/api/v1/cluster/status"),
        &rebound,
        None,
    )
    .unwrap();
    assert_refused(&r, 400, "invalid_argument", "a read under a rebound Host");

    let upgrade = [
        ("Origin", "http://evil.example"),
        ("Connection", "Upgrade"),
        ("Upgrade", "websocket"),
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    let ws = format!("{url}/ws/tasks/1/stream");
    let r = http_send_raw("GET", &ws, &upgrade, None).unwrap();
    assert_refused(&r, 403, "permission_denied", "a cross-origin WebSocket");

    assert_no_project(&url);

    // The same request from the node's own page, and from a client without an Origin, works.
    // `url` is the node's own origin: scheme, host and port.
    let r = http_send_raw("POST", &projects, &[("Origin", &url)], json_type).unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    let r: Value = http_get(&format!("{url}/api/v1/projects/acme/web")).unwrap();
    assert_eq!(r["project"], json!("web"), "{r}");

    // The audit record holds the one accepted request and nothing of the refused ones.
    let audit = http_get(&format!("{url}/api/v1/audit")).unwrap();
    let creates: Vec<&Value> = audit["records"]
        .as_array()
        .expect("records")
        .iter()
        .filter(|r| r["command"] == json!("create_project"))
        .collect();
    assert_eq!(creates.len(), 1, "{audit}");
    assert_eq!(creates[0]["target"], json!("project acme/web"), "{audit}");
    let r = http_send("GET", &format!("{url}/api/v1/audit?limit=0"), None, None).unwrap();
    assert_refused(&r, 400, "invalid_argument", "an empty audit page");
    assert_eq!(r.body["field"], json!("limit"), "{r:?}");
    let r = http_send("GET", &format!("{url}/api/v1/tasks?limit=1001"), None, None).unwrap();
    assert_refused(&r, 400, "invalid_argument", "a task page beyond its limit");
    assert_eq!(r.body["field"], json!("limit"), "{r:?}");
    let r = http_send("GET", &format!("{url}/api/v1/tasks?parent=x"), None, None).unwrap();
    assert_refused(&r, 400, "invalid_argument", "a malformed parent");
    assert_eq!(r.body["field"], json!("parent"), "{r:?}");
    let page = http_get(&format!("{url}/api/v1/tasks?parent=1")).unwrap();
    assert_eq!(page["tasks"], json!([]), "{page}");
}
