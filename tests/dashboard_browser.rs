//! The dashboard in a real browser: headless Chromium, driven over WebDriver, against a real
//! node and a real worker running a task. Without a token the page asks for one and reads
//! nothing; a wrong token brings the node's 401 message back to the form; a viewer's token
//! shows the cluster and the task, and the task's live output over the WebSocket, with a
//! clean console; the WebSocket takes the token as a subprotocol, never from the URL; the
//! token is kept in the tab only, and never reaches a log.
//!
//! Chromium trusts the test CA through an NSS database of its own (`support::browser`), so the
//! node's certificate is checked as an operator's browser checks it.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::browser::Browser;
use support::*;

const TASK_NAME: &str = "browser-probe";
/// An agent's provider: says which generation it is, writes a capsule when asked to stop.
const PROVIDER: &str = r#"#!/bin/sh
trap 'printf "{\"task_state\":\"handed over by g%s\",\"decisions\":[],\"pending_work\":[]}" "$SQUADRON_GENERATION" > /state/capsule.json; exit 0' TERM
echo "provider $SQUADRON_PROVIDER generation $SQUADRON_GENERATION"
i=1
while :; do echo "tick-$i"; i=$((i+1)); sleep 0.2; done
"#;
/// The `tick-N` lines in the page's terminal buffer (scrollback included), by N.
const TERMINAL_TICKS: &str = "(() => { const buf = term.buffer.active, ticks = []; \
     for (let i = 0; i < buf.length; i++) { \
       const m = /^tick-(\\d+)$/.exec(buf.getLine(i).translateToString(true)); \
       if (m) ticks.push(Number(m[1])) } \
     return ticks })()";
/// What the page calls its token in `sessionStorage`.
const TOKEN_KEY: &str = "squadron.token";

/// A task that prints a line every 200 ms for two minutes: running while the browser looks.
fn ticking_manifest(repo: &std::path::Path) -> String {
    format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: {TASK_NAME}\nrepository:\n  url: {repo}\n  \
         branch: main\nagent:\n  prompt: tick\n  provider: script\n  script: |\n    \
         for i in $(seq 1 600); do echo tick-$i; sleep 0.2; done\nvm:\n  runtime: process\n\
         lifecycle:\n  timeout: 5m\n",
        repo = repo.display()
    )
}

/// A task that ends at once with a patch (`+changed from the dashboard's test`).
fn patch_manifest(repo: &std::path::Path) -> String {
    format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: browser-patch\nrepository:\n  url: {repo}\n  \
         branch: main\nagent:\n  prompt: patch\n  provider: script\n  script: |\n    \
         echo 'changed from the dashboard test' >> README.md\nvm:\n  runtime: process\n",
        repo = repo.display()
    )
}

/// What a browser made of one WebSocket: whether it opened, the protocol the node chose,
/// how many frames came, the close code.
const OPEN_SOCKET: &str = r#"
const [path, protocols, done] = arguments;
const seen = {opened: false, protocol: null, frames: 0, first: null, code: null};
let over = false;
const finish = () => { if (!over) { over = true; done(seen); } };
const ws = new WebSocket('wss://' + location.host + path, protocols);
ws.onopen = () => { seen.opened = true; seen.protocol = ws.protocol; };
ws.onmessage = e => { seen.frames += 1; seen.first = seen.first ?? e.data; ws.close(); };
ws.onclose = e => { seen.code = e.code; finish(); };
setTimeout(() => { try { ws.close(); } catch (_) {} finish(); }, 15000);
"#;

#[test]
fn the_dashboard_signs_in_and_streams_in_a_real_browser() {
    // Fail at once, with the way out, when the browser is missing.
    for program in ["chromium", "chromedriver", "certutil"] {
        support::browser::program(program);
    }
    let options = ClusterOptions {
        // Everything the request path logs, to show the token is in none of it.
        log_filter: "info,squadron_server=trace,squadron_pki=trace,axum=trace,tower=trace",
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start_with(1, options);
    let url = cluster.url(1);
    let provider = cluster.dir.path().join("provider.sh");
    std::fs::write(&provider, PROVIDER).expect("provider script");
    let worker = WorkerProc::start_with(
        cluster.dir.path(),
        &unique_worker_id("w-browser"),
        cluster.urls(),
        "process",
        ["codex", "claude"]
            .iter()
            .flat_map(|p| {
                [
                    "--provider-script".into(),
                    format!("{p}={}", provider.display()),
                ]
            })
            .chain(["--agent-stop-grace-ms".into(), "3000".into()])
            .collect(),
    );
    let repo = git_repo(cluster.dir.path());
    let r = submit_yaml(&url, &ticking_manifest(&repo));
    assert!(r.ok(), "submission refused: {r:?}");
    let task = r.body["task_submitted"]["task"].as_u64().expect("task id");
    wait_task_state(&url, task, &["RUNNING"], Duration::from_secs(120));
    let viewer = operator_token(&url, "dashboard", "viewer", json!([]));
    // One to read a diff of, one to cancel from the page.
    let patched = submitted(&url, &patch_manifest(&repo));
    let done = wait_task_state(
        &url,
        patched,
        &["COMPLETED", "FAILED"],
        Duration::from_secs(120),
    );
    assert_eq!(done["state"], "COMPLETED", "{done:#}");
    let doomed = submitted(&url, &ticking_manifest(&repo));
    wait_task_state(&url, doomed, &["RUNNING"], Duration::from_secs(120));
    let admin = pki().token_for(&url).expect("the cluster's admin token");
    // A project of two profiles, one holding a lease: one of its four slots taken.
    let profiles = setup_project(&url, "dash", 2, 4);
    let r = http_send(
        "POST",
        &format!("{url}/api/v1/profiles/{}/leases", profiles[0]),
        Some(acquire_body(0)),
        None,
    )
    .expect("acquire");
    assert!(r.ok(), "{r:?}");
    let lease = r.body["lease_granted"]["lease"].as_u64().expect("lease id");
    let pilot = launched_agent(&url, &worker.id, &repo);

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let browser = Browser::start(&pki().ca_cert, &[port_of(&url)]).await;
        let page = Page {
            browser: &browser,
            url: &url,
            task,
            viewer: &viewer,
        };
        page.signed_out_reads_nothing().await;
        page.a_wrong_token_is_refused().await;
        page.a_viewer_sees_the_cluster_and_the_task().await;
        page.a_403_stays_in_place().await;
        page.the_websocket_takes_the_token_as_a_subprotocol_only()
            .await;
        page.sign_out_forgets_the_token().await;
        page.a_task_shows_its_timeline_and_diff_and_an_operator_cancels_it(patched, doomed, &admin)
            .await;
        page.a_project_shows_its_slots_and_its_profiles_leases(profiles[0], lease)
            .await;
        page.an_agent_is_taken_over_stopped_and_launched_from_the_page(pilot, &admin)
            .await;
        page.the_task_list_pages_newest_first_and_filters_by_state()
            .await;
        browser.close().await;
    });

    websocket_answers_outside_the_browser(&url, task, &viewer);
    for (what, log) in [("node", &cluster.nodes[&1].log), ("worker", &worker.log)] {
        let text = std::fs::read_to_string(log).expect("log");
        let secret = viewer.rsplit('_').next().expect("secret part");
        assert!(
            !text.contains(secret),
            "the {what}'s log holds the viewer's token"
        );
    }
}

/// A Docker task's details show what its sandbox uses — CPU time, memory, disk — as the agent
/// inside the container reports them, the figures the API holds.
#[test]
fn a_docker_tasks_details_show_what_its_sandbox_uses() {
    for program in ["chromium", "chromedriver", "certutil"] {
        support::browser::program(program);
    }
    let cluster = Cluster::start(1);
    let url = cluster.url(1);
    let _worker = WorkerProc::start_with(
        cluster.dir.path(),
        &unique_worker_id("w-usage"),
        cluster.urls(),
        "docker",
        vec!["--agent-heartbeat-interval-ms".into(), "300".into()],
    );
    let repo = git_repo(cluster.dir.path());
    let manifest = format!(
        "version: \"1\"\nkind: Task\nmetadata:\n  name: usage-probe\nrepository:\n  url: {}\n  \
         branch: main\nagent:\n  prompt: use\n  provider: script\n  script: |\n    \
         echo busy\n    sleep 120\nvm:\n  runtime: docker\nlifecycle:\n  timeout: 5m\n",
        repo.display()
    );
    let task = submitted(&url, &manifest);
    wait_task_state(&url, task, &["RUNNING"], Duration::from_secs(180));
    let viewer = operator_token(&url, "usage", "viewer", json!([]));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let shown = runtime.block_on(async {
        let browser = Browser::start(&pki().ca_cert, &[port_of(&url)]).await;
        let page = Page {
            browser: &browser,
            url: &url,
            task,
            viewer: &viewer,
        };
        browser
            .client
            .goto(&format!("{url}/"))
            .await
            .expect("open the page");
        page.sign_in(&viewer).await;
        page.click(&format!("button[data-detail='{task}']")).await;
        let shown = browser
            .wait_for(
                "the sandbox's usage",
                "(t => t.startsWith('sandbox: CPU') ? t : null)\
                 (document.getElementById('usage').textContent)",
            )
            .await;
        browser.screenshot("docker-task-usage").await;
        browser.close().await;
        shown
    });
    let shown = shown.as_str().unwrap_or_default().to_string();
    let memory_mib: f64 = shown
        .split("memory ")
        .nth(1)
        .and_then(|r| r.split(" MiB").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no memory figure in {shown:?}"));
    assert!(memory_mib > 0.0, "{shown}");
    let session = http_get(&format!("{url}/api/v1/tasks/{task}/agent")).expect("agent session");
    assert!(
        session["usage"]["memory_bytes"].as_u64() > Some(0),
        "{session:#}"
    );
    let r = http_send("DELETE", &format!("{url}/api/v1/tasks/{task}"), None, None).expect("cancel");
    assert!(r.ok(), "{r:?}");
}

struct Page<'a> {
    browser: &'a Browser,
    url: &'a str,
    task: u64,
    viewer: &'a str,
}

impl Page<'_> {
    async fn sign_in(&self, token: &str) {
        let b = self.browser;
        b.wait_for(
            "the sign-in form",
            "!document.getElementById('signin').hidden",
        )
        .await;
        let field = b
            .client
            .find(fantoccini::Locator::Css("#token"))
            .await
            .expect("token field");
        field.send_keys(token).await.expect("type the token");
        b.client
            .find(fantoccini::Locator::Css("#signin-form button"))
            .await
            .expect("sign-in button")
            .click()
            .await
            .expect("click sign in");
    }

    async fn stored_token(&self) -> Value {
        let script = format!("return sessionStorage.getItem('{TOKEN_KEY}')");
        self.browser.eval(&script, vec![]).await
    }

    /// Without a token: the form, no data, and no API request at all.
    async fn signed_out_reads_nothing(&self) {
        let b = self.browser;
        b.client
            .goto(&format!("{}/", self.url))
            .await
            .expect("open the page");
        b.wait_for(
            "the sign-in form",
            "!document.getElementById('signin').hidden",
        )
        .await;
        let board = b
            .eval("return document.getElementById('board').hidden", vec![])
            .await;
        assert_eq!(board, json!(true), "the board shows without a token");
        // Give a page that would read anyway the time of a refresh.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let api = b
            .eval(
                "return performance.getEntriesByType('resource')\
                 .filter(e => new URL(e.name).pathname.startsWith('/api/'))\
                 .map(e => [e.name, e.responseStatus])",
                vec![],
            )
            .await;
        assert_eq!(api, json!([]), "API requests without a token");
        let tables = b
            .eval("return document.querySelectorAll('table').length", vec![])
            .await;
        assert_eq!(tables, json!(0), "data shown without a token");
    }

    /// A well-formed token the node never made: the form again, with the node's 401 text.
    async fn a_wrong_token_is_refused(&self) {
        let b = self.browser;
        let wrong = squadron_pki::SecretToken::generate(squadron_pki::TokenKind::Operator);
        self.sign_in(&wrong.expose()).await;
        let message = b
            .wait_for(
                "the 401 message",
                "!document.getElementById('signin').hidden && \
                 document.getElementById('signin-error').textContent",
            )
            .await;
        assert_eq!(message, json!("unknown or revoked token"));
        assert_eq!(
            self.stored_token().await,
            Value::Null,
            "a refused token kept"
        );
        // All three reads of the refresh (cluster, tasks, projects) answered before the
        // console is read: a late refusal would land in the next step's console.
        let resources = b
            .wait_for(
                "the refresh's three refusals",
                "(s => s.length >= 3 ? s : null)(performance.getEntriesByType('resource')\
                 .filter(e => new URL(e.name).pathname.startsWith('/api/'))\
                 .map(e => e.responseStatus))",
            )
            .await;
        let statuses = resources.as_array().expect("statuses");
        assert!(!statuses.is_empty(), "the wrong token was never sent");
        assert!(
            statuses.iter().all(|s| s == &json!(401)),
            "a read succeeded without a valid token: {resources}"
        );
        // The refusals are in the console as failed loads: the log is read for real, and
        // what comes after sign-in must not be there.
        let console = b.console().await;
        assert!(
            console.iter().any(|e| e["level"] == json!("SEVERE")
                && e["message"].as_str().is_some_and(|m| m.contains("401"))),
            "the console shows no refused read: {console:#?}"
        );
    }

    /// A viewer's token: the cluster table with the node, the task table with the task, its
    /// live output through the page's WebSocket, and nothing in the console.
    async fn a_viewer_sees_the_cluster_and_the_task(&self) {
        let b = self.browser;
        self.sign_in(self.viewer).await;
        let ids = b
            .wait_for(
                "the cluster table",
                "[...document.querySelectorAll('#cluster table tr')].slice(1)\
                 .map(r => r.cells[0].textContent).join(',')",
            )
            .await;
        assert_eq!(ids, json!("1"), "the members' ids");
        let part = b
            .eval(
                "return document.querySelector('#cluster table tr:nth-child(2)').cells[1].textContent",
                vec![],
            )
            .await;
        assert_eq!(part, json!("leader"), "the member's part");
        // The digest shown (shortened; whole in its title) is one the node reports.
        let digest = b
            .eval(
                "return document.querySelector('#cluster code.digest')?.title ?? null",
                vec![],
            )
            .await;
        let digest = digest.as_str().expect("the digest on the page");
        assert!(
            digest.len() == 64 && digest.bytes().all(|c| c.is_ascii_hexdigit()),
            "{digest}"
        );
        let summary = b
            .wait_for(
                "the node line",
                "document.querySelector('#cluster p')?.textContent",
            )
            .await;
        assert!(
            summary
                .as_str()
                .is_some_and(|s| s.starts_with("node 1 is leader")),
            "{summary}"
        );
        let row = b
            .wait_for(
                "the task's row",
                &format!(
                    "[...document.querySelectorAll('#tasks table tr')]\
                     .map(r => [...r.cells].map(c => c.textContent))\
                     .find(c => c[0] === '{}')",
                    self.task
                ),
            )
            .await;
        assert_eq!(row[1], json!(TASK_NAME), "{row}");
        assert_eq!(row[2], json!("RUNNING"), "{row}");
        assert_eq!(self.stored_token().await, json!(self.viewer));

        b.client
            .find(fantoccini::Locator::Css(&format!(
                "button[data-watch='{}']",
                self.task
            )))
            .await
            .expect("the task's output button")
            .click()
            .await
            .expect("click output");
        // What the terminal draws (xterm's rows), then its whole buffer: the scrollback the logs
        // API gave and the stream that went on from where it ended, every tick once, in order.
        b.wait_for(
            "the live output in the terminal",
            "document.querySelector('#terminal .xterm-rows')?.textContent.includes('tick-') || null",
        )
        .await;
        self.terminal_shows_every_tick_once(&format!("task {}", self.task))
            .await;
        b.screenshot("task-terminal").await;
        let reads = b
            .eval(
                "return performance.getEntriesByType('resource')\
                 .map(e => new URL(e.name)).filter(u => u.pathname.endsWith('/logs'))\
                 .map(u => u.search)",
                vec![],
            )
            .await;
        assert_eq!(
            reads,
            json!(["?stream=stdout&tail=2000", "?stream=stderr&tail=2000"]),
            "the scrollback's reads"
        );
        let head = b
            .eval(
                "return document.getElementById('output-head').textContent",
                vec![],
            )
            .await;
        assert_eq!(head, json!(format!("task {}: live", self.task)));

        // A few refreshes later the console is still clean.
        tokio::time::sleep(Duration::from_millis(4500)).await;
        let console = b.console().await;
        let errors: Vec<&Value> = console
            .iter()
            .filter(|e| e["level"] == json!("SEVERE") || e["level"] == json!("WARNING"))
            .collect();
        assert!(
            errors.is_empty(),
            "the console after sign-in: {errors:#?}\nchromedriver:\n{}",
            b.driver_log()
        );
    }

    /// A refusal other than 401 is shown where the data would be; the session stays. No
    /// read of the page answers 403 to a viewer (it reads everything), so the browser's
    /// fetch answers one for the projects listing here.
    async fn a_403_stays_in_place(&self) {
        let b = self.browser;
        b.eval(
            "const real = window.fetch;\
             window.fetch = (u, o) => String(u).startsWith('/api/v1/projects')\
               ? Promise.resolve(new Response(JSON.stringify({code: 'permission_denied',\
                   message: 'this needs <b>more</b>'}), {status: 403}))\
               : real(u, o);",
            vec![],
        )
        .await;
        let shown = b
            .wait_for(
                "the 403 in place",
                "document.querySelector('#projects .err')?.textContent",
            )
            .await;
        assert_eq!(shown, json!("this needs <b>more</b>"), "escaped, in place");
        let state = b
            .eval(
                "return [document.getElementById('board').hidden, \
                 document.getElementById('signin').hidden, \
                 document.querySelectorAll('#projects b').length]",
                vec![],
            )
            .await;
        assert_eq!(
            state,
            json!([false, true, 0]),
            "board, form, injected markup"
        );
        assert_eq!(self.stored_token().await, json!(self.viewer));
        b.client.refresh().await.expect("reload");
        // A reload in the same tab keeps the session (sessionStorage) and the real fetch.
        b.wait_for(
            "the board after a reload",
            "document.querySelector('#cluster table')",
        )
        .await;
    }

    /// From the page's origin: the bearer subprotocol opens the stream and the node answers
    /// with `squadron.v1`; no token, a token in the query string, or a bearer subprotocol
    /// without `squadron.v1` are refused.
    async fn the_websocket_takes_the_token_as_a_subprotocol_only(&self) {
        let b = self.browser;
        let path = format!("/ws/tasks/{}/stream", self.task);
        let bearer = format!("bearer.{}", self.viewer);
        let open = |path: String, protocols: Value| {
            b.eval_async(OPEN_SOCKET, vec![json!(path), protocols])
        };
        let seen = open(path.clone(), json!(["squadron.v1", bearer])).await;
        assert_eq!(seen["opened"], json!(true), "{seen}");
        assert_eq!(seen["protocol"], json!("squadron.v1"), "{seen}");
        assert!(seen["frames"].as_u64() >= Some(1), "{seen}");
        let first: Value =
            serde_json::from_str(seen["first"].as_str().unwrap_or("")).expect("frame");
        assert_eq!(first["type"], json!("output"), "{first}");

        let refused = [
            (path.clone(), json!(["squadron.v1"]), "no token"),
            (path.clone(), json!([]), "no token, no protocol"),
            (
                format!("{path}?token={}", self.viewer),
                json!(["squadron.v1"]),
                "the token in the query string",
            ),
            (
                format!("{path}?access_token={}", self.viewer),
                json!([]),
                "the token as access_token",
            ),
            (
                path.clone(),
                json!([bearer]),
                "a bearer without squadron.v1",
            ),
        ];
        for (path, protocols, what) in refused {
            let seen = open(path, protocols).await;
            assert_eq!(seen["opened"], json!(false), "{what}: {seen}");
            assert_eq!(seen["frames"], json!(0), "{what}: {seen}");
        }
    }

    /// Sign out: the form, and nothing of the token anywhere in the browser.
    /// Clicks the element once it exists, in the page itself: the tables are redrawn every
    /// two seconds, so a WebDriver element could go stale between finding and clicking. After
    /// the script returns, so a confirmation it opens does not block it.
    async fn click(&self, css: &str) {
        let css_json = serde_json::to_string(css).expect("css");
        self.browser
            .wait_for(
                css,
                &format!(
                    "(e => e ? (setTimeout(() => e.click(), 0), true) : null)\
                     (document.querySelector({css_json}))"
                ),
            )
            .await;
    }

    /// The console since it was last read holds no error or warning but refusals (403) the
    /// page showed in place.
    async fn console_clean_but_403s(&self) {
        let console = self.browser.console().await;
        let errors: Vec<&Value> = console
            .iter()
            .filter(|e| e["level"] == json!("SEVERE") || e["level"] == json!("WARNING"))
            .filter(|e| !e["message"].as_str().unwrap_or("").contains("403"))
            .collect();
        assert!(errors.is_empty(), "the console: {errors:#?}");
    }

    /// The terminal of `label` (`task 7`, `profile pilot`) is live, and its buffer — the
    /// scrollback the logs API gave, then what the stream added after it opened — holds every
    /// `tick-N` once, in order, 1…n.
    async fn terminal_shows_every_tick_once(&self, label: &str) {
        let b = self.browser;
        let live = serde_json::to_string(&format!("{label}: live")).expect("label");
        b.wait_for(
            &format!("{label}'s stream"),
            &format!("document.getElementById('output-head').textContent === {live} || null"),
        )
        .await;
        // xterm parses what it is given a moment later: the scrollback's ticks, once drawn.
        let at_live = b
            .wait_for(
                &format!("{label}'s scrollback in the buffer"),
                &format!("(t => t.length ? t.length : null)({TERMINAL_TICKS})"),
            )
            .await;
        let ticks = b
            .wait_for(
                &format!("{label}'s ticks streamed after the scrollback"),
                &format!(
                    "(t => t.length > {} ? t : null)({TERMINAL_TICKS})",
                    at_live.as_u64().unwrap_or(0) + 5
                ),
            )
            .await;
        let ticks: Vec<u64> = serde_json::from_value(ticks).expect("tick numbers");
        let expected: Vec<u64> = (1..=ticks.len() as u64).collect();
        assert_eq!(
            ticks, expected,
            "{label}: the terminal lost or repeated output between scrollback and stream"
        );
    }

    /// Answers the confirmation the last click opened.
    async fn confirm(&self, accept: bool) {
        let client = &self.browser.client;
        let start = std::time::Instant::now();
        while client.get_alert_text().await.is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no confirmation was asked"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let answered = if accept {
            client.accept_alert().await
        } else {
            client.dismiss_alert().await
        };
        answered.expect("answer the confirmation");
    }

    /// A task's details: the timeline of the states it entered, its artifacts and the patch
    /// as a diff; the cancel button asks first, refuses a viewer in place (the task runs on),
    /// and an operator's cancel ends the task.
    async fn a_task_shows_its_timeline_and_diff_and_an_operator_cancels_it(
        &self,
        patched: u64,
        doomed: u64,
        admin: &str,
    ) {
        let b = self.browser;
        // The earlier steps' refused sockets are theirs: this step's console starts here.
        b.console().await;
        self.sign_in(self.viewer).await;
        b.wait_for(
            "the patched task's row",
            &format!("document.querySelector(\"button[data-detail='{patched}']\")"),
        )
        .await;
        self.click(&format!("button[data-detail='{patched}']"))
            .await;
        let timeline = b
            .wait_for(
                "the timeline",
                "(() => { const rows = [...document.querySelectorAll('#detail .timeline tr')]\
                 .slice(1).map(r => r.cells[0].textContent); \
                 return rows.includes('COMPLETED') ? rows : null })()",
            )
            .await;
        assert_eq!(
            timeline,
            json!([
                "SUBMITTED",
                "PENDING",
                "STAGING",
                "PROVISIONING",
                "READY",
                "RUNNING",
                "COMPLETING",
                "COMPLETED"
            ]),
            "every state entered, in order"
        );
        assert_eq!(
            b.eval(
                "return document.querySelector('button[data-cancel]')",
                vec![]
            )
            .await,
            Value::Null,
            "no cancel for an ended task"
        );
        self.click(&format!("#detail button[data-diff='{patched}.patch']"))
            .await;
        let added = b
            .wait_for(
                "the diff",
                "[...document.querySelectorAll('#diff .add')].map(s => s.textContent).join('') || null",
            )
            .await;
        assert!(
            added
                .as_str()
                .is_some_and(|s| s.contains("+changed from the dashboard test")),
            "{added}"
        );
        b.screenshot("task-details-and-diff").await;

        // A viewer's cancel is refused where the task is shown; it runs on.
        self.click(&format!("button[data-detail='{doomed}']")).await;
        b.wait_for(
            "the running task's cancel button",
            &format!("document.querySelector(\"button[data-cancel='{doomed}']\")"),
        )
        .await;
        self.click(&format!("button[data-cancel='{doomed}']")).await;
        self.confirm(true).await;
        let refused = b
            .wait_for(
                "the refusal",
                "document.getElementById('detail-error').textContent || null",
            )
            .await;
        assert!(refused.as_str().is_some_and(|s| !s.is_empty()), "{refused}");
        let t = http_get(&format!("{}/api/v1/tasks/{doomed}", self.url)).expect("task");
        assert_eq!(
            t["state"], "RUNNING",
            "a viewer's cancel changed nothing: {t:#}"
        );

        // Declining the confirmation sends nothing; an operator's accepted cancel ends it.
        self.click("#signout").await;
        self.sign_in(admin).await;
        self.click(&format!("button[data-detail='{doomed}']")).await;
        b.wait_for(
            "the cancel button",
            &format!("document.querySelector(\"button[data-cancel='{doomed}']\")"),
        )
        .await;
        // A process task's usage, measured by its worker from the attempt's cgroup leaf.
        let usage = b
            .wait_for(
                "the process task's usage",
                "(t => t.startsWith('sandbox: CPU') ? t : null)\
                 (document.getElementById('usage').textContent)",
            )
            .await;
        assert!(
            usage
                .as_str()
                .is_some_and(|t| t.ends_with("(attempt 1, measured by its worker)")),
            "{usage}"
        );
        self.click(&format!("button[data-cancel='{doomed}']")).await;
        self.confirm(false).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t = http_get(&format!("{}/api/v1/tasks/{doomed}", self.url)).expect("task");
        assert_eq!(
            t["state"], "RUNNING",
            "a declined cancel sent nothing: {t:#}"
        );
        self.click(&format!("button[data-cancel='{doomed}']")).await;
        self.confirm(true).await;
        let state = b
            .wait_for(
                "the cancelled state",
                "(s => s === 'CANCELLED' ? s : null)(document.querySelector('#detail .state')?.textContent)",
            )
            .await;
        assert_eq!(state, json!("CANCELLED"));
        let usage = b
            .eval(
                "return document.getElementById('usage').textContent",
                vec![],
            )
            .await;
        assert_eq!(
            usage,
            json!("sandbox usage: measured while an attempt runs"),
            "what an ended task says of its usage"
        );
        // The viewer's refused cancel, which the page showed in place.
        self.console_clean_but_403s().await;
    }

    /// A project's panel: the four-slot gauge with one slot held, and the profile holding it
    /// with its generation and its lease's state and holder.
    async fn a_project_shows_its_slots_and_its_profiles_leases(&self, profile: u64, lease: u64) {
        let b = self.browser;
        self.click("button[data-tenant='acme'][data-project='dash']")
            .await;
        let slots = b
            .wait_for(
                "the slots gauge",
                "document.querySelector('#project .slots')?.textContent",
            )
            .await;
        assert_eq!(slots, json!("slots ■□□□ 1/4"));
        let row = b
            .wait_for(
                "the profile's row",
                &format!(
                    "[...document.querySelectorAll('#project table tr')]\
                     .map(r => [...r.cells].map(c => c.textContent))\
                     .find(c => c[0] === '{profile}')"
                ),
            )
            .await;
        assert_eq!(row[2], json!("1"), "generation 1: {row}");
        let held = row[3].as_str().unwrap_or_default();
        assert!(
            held.starts_with(&format!("#{lease} active by w1 (test)")) && held.ends_with("s left"),
            "{row}"
        );
    }

    /// The agent controls of a profile, each confirmed first: a viewer's takeover is refused
    /// under the project with nothing changed; an operator's graceful takeover starts
    /// generation 2, a stop ends its lease, a declined launch sends nothing, and a launch
    /// starts generation 3.
    async fn an_agent_is_taken_over_stopped_and_launched_from_the_page(
        &self,
        profile: u64,
        admin: &str,
    ) {
        let b = self.browser;
        b.console().await;
        let row = |pattern: &str| {
            format!(
                "(r => r && {pattern} ? r : null)([...document.querySelectorAll('#project table tr')]\
                 .map(r => [...r.cells].map(c => c.textContent)).find(c => c[0] === '{profile}'))"
            )
        };
        let button =
            |action: &str| format!("button[data-agent='{action}'][data-profile='{profile}']");
        let generation = || {
            let v = http_get(&format!("{}/api/v1/profiles/{profile}", self.url)).expect("profile");
            v["generation"].as_u64().expect("generation")
        };

        self.click("#signout").await;
        self.sign_in(self.viewer).await;
        self.click("button[data-tenant='acme'][data-project='crew']")
            .await;
        b.wait_for(
            "generation 1 running",
            &row("r[2] === '1' && r[3].includes('active')"),
        )
        .await;
        self.click(&button("graceful")).await;
        self.confirm(true).await;
        let refused = b
            .wait_for(
                "the viewer's refusal",
                "document.getElementById('project-error').textContent || null",
            )
            .await;
        assert!(
            refused.as_str().is_some_and(|s| s.starts_with("pilot: ")),
            "{refused}"
        );
        assert_eq!(generation(), 1, "a viewer's takeover changed the profile");

        self.click("#signout").await;
        self.sign_in(admin).await;
        self.click("button[data-tenant='acme'][data-project='crew']")
            .await;
        self.click(&button("graceful")).await;
        self.confirm(true).await;
        let taken = b
            .wait_for(
                "generation 2 running",
                &row("r[2] === '2' && r[3].includes('active')"),
            )
            .await;
        assert!(
            taken[4].as_str().is_some_and(|c| c.starts_with('#')),
            "no handed-over capsule in the chain: {taken}"
        );
        // A read pinned to the generation taken over is refused: its offsets are not the new
        // one's.
        let stale = http_text(&format!(
            "{}/api/v1/profiles/{profile}/agent/logs?generation=1",
            self.url
        ))
        .expect("a read pinned to generation 1");
        assert_eq!(stale.0, 409, "{stale:?}");
        self.click(&button("stop")).await;
        self.confirm(true).await;
        b.wait_for("the lease ended", &row("r[3] === '-'")).await;
        b.wait_for(
            "the launch button",
            &format!("document.querySelector(\"{}\")", button("launch")),
        )
        .await;
        self.click(&button("launch")).await;
        self.confirm(false).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(generation(), 2, "a declined launch sent something");
        self.click(&button("launch")).await;
        self.confirm(true).await;
        b.wait_for(
            "generation 3 running",
            &row("r[2] === '3' && r[3].includes('active')"),
        )
        .await;
        b.screenshot("project-agent-controls").await;
        let error = b
            .eval(
                "return document.getElementById('project-error').textContent",
                vec![],
            )
            .await;
        assert_eq!(error, json!(""), "an operator's actions were refused");

        // Its output in the terminal: the scrollback, then the live stream, every line once.
        self.click(&format!("button[data-agent-output='{profile}']"))
            .await;
        self.terminal_shows_every_tick_once("profile pilot").await;
        let first = b
            .eval(
                "return term.buffer.active.getLine(0).translateToString(true)",
                vec![],
            )
            .await;
        assert!(
            first
                .as_str()
                .is_some_and(|l| l.starts_with("provider ") && l.ends_with(" generation 3")),
            "the terminal's first line: {first}"
        );
        // What the generation's cgroup leaf uses, measured by its worker.
        let usage = b
            .wait_for(
                "the generation's usage",
                "(t => t.startsWith('generation 3 uses CPU') ? t : null)\
                 (document.getElementById('output-usage').textContent)",
            )
            .await;
        assert!(
            usage.as_str().is_some_and(|t| t.contains(" MiB, disk ")),
            "{usage}"
        );
        self.click(&button("stop")).await;
        self.confirm(true).await;
        b.wait_for(
            "the stream's end",
            "document.getElementById('output-head').textContent === 'profile pilot: ended' || null",
        )
        .await;
        b.wait_for("the last lease ended", &row("r[3] === '-'"))
            .await;
        // The viewer's refused takeover, which the page showed in place.
        self.console_clean_but_403s().await;
    }

    /// The task list is newest first, a page of 50 at a time, and filters by state: a busy
    /// cluster's newest tasks are on its first page and the older ones a click away (the list
    /// once read oldest first and showed nothing past the 50th task).
    async fn the_task_list_pages_newest_first_and_filters_by_state(&self) {
        let b = self.browser;
        // Fifty tasks no worker here runs (it offers no kvm): a whole page newer than the rest.
        let inert: Vec<u64> = (0..50)
            .map(|i| submitted(self.url, &inert_manifest(&format!("inert-{i}"), "kvm")))
            .collect();
        let ids = "[...document.querySelectorAll('#tasks table tr')].slice(1)\
                   .map(r => Number(r.cells[0].textContent))";
        let newest = b
            .wait_for(
                "the newest page",
                &format!("(ids => ids[0] === {} ? ids : null)({ids})", inert[49]),
            )
            .await;
        let expected: Vec<u64> = inert.iter().rev().copied().collect();
        assert_eq!(newest, json!(expected), "the first page");
        let disabled = |id: &str| format!("document.getElementById('{id}').disabled");
        assert_eq!(
            b.eval(&format!("return {}", disabled("tasks-newest")), vec![])
                .await,
            json!(true)
        );

        self.click("#tasks-older:not([disabled])").await;
        let older = b
            .wait_for(
                "the older page",
                &format!(
                    "(ids => ids.length && ids[0] < {} ? ids : null)({ids})",
                    inert[0]
                ),
            )
            .await;
        let all = http_get(&format!("{}/api/v1/tasks?limit=1000", self.url)).expect("tasks");
        let mut before: Vec<u64> = all["tasks"]
            .as_array()
            .expect("tasks")
            .iter()
            .filter_map(|t| t["id"].as_u64())
            .filter(|id| *id < inert[0])
            .collect();
        before.reverse();
        assert_eq!(older, json!(before), "the page below the newest");
        assert!(before.contains(&self.task), "{before:?}");

        // A filter starts from the newest page again: only CANCELLED tasks (terminal, so the
        // list cannot change while the page reads it), newest first.
        b.eval(
            "const s = document.getElementById('task-state'); s.value = 'CANCELLED';\
             s.dispatchEvent(new Event('change')); return null",
            vec![],
        )
        .await;
        let states = b
            .wait_for(
                "the CANCELLED tasks",
                "(rows => rows.length && rows.every(r => r[1] === 'CANCELLED') ? rows : null)\
                 ([...document.querySelectorAll('#tasks table tr')].slice(1)\
                 .map(r => [Number(r.cells[0].textContent), r.cells[2].textContent]))",
            )
            .await;
        let cancelled: Vec<Value> = all["tasks"]
            .as_array()
            .expect("tasks")
            .iter()
            .rev()
            .filter(|t| t["state"] == json!("CANCELLED"))
            .map(|t| json!([t["id"], "CANCELLED"]))
            .collect();
        assert!(!cancelled.is_empty(), "the task cancelled from the page");
        assert_eq!(states, json!(cancelled), "the filtered list");
        assert_eq!(
            b.eval(&format!("return {}", disabled("tasks-older")), vec![])
                .await,
            json!(true)
        );
        self.console_clean_but_403s().await;
        b.screenshot("task-list-cancelled").await;
    }

    async fn sign_out_forgets_the_token(&self) {
        let b = self.browser;
        b.client
            .find(fantoccini::Locator::Css("#signout"))
            .await
            .expect("sign-out button")
            .click()
            .await
            .expect("click sign out");
        b.wait_for(
            "the form after signing out",
            "!document.getElementById('signin').hidden",
        )
        .await;
        let kept = b
            .eval(
                "return [sessionStorage.length, localStorage.length, document.cookie, \
                 document.querySelectorAll('table').length]",
                vec![],
            )
            .await;
        assert_eq!(
            kept,
            json!([0, 0, "", 0]),
            "storage, cookies, data after sign-out"
        );
        b.client.refresh().await.expect("reload");
        b.wait_for(
            "the form after a reload",
            "!document.getElementById('signin').hidden",
        )
        .await;
    }
}

/// A project `crew` whose one profile, `pilot`, runs a provider (generation 1) in a sandbox on
/// the worker; the profile's id.
fn launched_agent(url: &str, worker: &str, repo: &std::path::Path) -> u64 {
    let r = post(
        &format!("{url}/api/v1/projects"),
        json!({"tenant": "acme", "project": "crew", "max_profiles": 2, "max_active": 4}),
    )
    .expect("project");
    assert!(r.ok(), "{r:?}");
    let r = post(
        &format!("{url}/api/v1/projects/acme/crew/profiles"),
        json!({"key": "pilot", "providers": ["codex", "claude"]}),
    )
    .expect("profile");
    assert!(r.ok(), "{r:?}");
    let profile = r.body["profile_created"]["profile"]
        .as_u64()
        .expect("profile id");
    let r = post(
        &format!("{url}/api/v1/profiles/{profile}/agent/launch"),
        json!({"worker": worker, "repository": {"url": repo.display().to_string(), "branch": "main"}}),
    )
    .expect("launch");
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(r.body["generation"], 1, "{r:?}");
    // Its output through the API, as a task's: the current generation's stdout; a stream a
    // provider does not have is refused by name.
    let logs = format!("{url}/api/v1/profiles/{profile}/agent/logs");
    wait_until(Duration::from_secs(20), || {
        http_text(&format!("{logs}?stream=stdout"))
            .is_ok_and(|(status, text)| status == 200 && text.contains("generation 1\ntick-1\n"))
    })
    .unwrap_or_else(|_| panic!("no provider output: {:?}", http_text(&logs)));
    let read = request("GET", &format!("{logs}?stream=stdout&tail=1"))
        .call()
        .expect("a tail of the provider's output");
    assert_eq!(
        read.header("x-squadron-generation"),
        Some("1"),
        "the read names its generation"
    );
    assert!(read.header("x-squadron-next-offset").is_some());
    let (status, body) = http_text(&format!("{logs}?stream=events")).expect("events");
    assert_eq!(status, 400, "{body}");
    let body: Value = serde_json::from_str(&body).expect("error body");
    assert_eq!(body["field"], "stream", "{body}");
    profile
}

/// The port of a node's `https://127.0.0.1:PORT` URL, for the browser's relay.
fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"))
}

fn submitted(url: &str, manifest: &str) -> u64 {
    let r = submit_yaml(url, manifest);
    assert!(r.ok(), "submission refused: {r:?}");
    r.body["task_submitted"]["task"].as_u64().expect("task id")
}

/// The same rules for a non-browser client: 101 with the subprotocol (the answer names only
/// `squadron.v1`) or with `Authorization` (the CLI's way), 401 with the token in the URL only.
fn websocket_answers_outside_the_browser(url: &str, task: u64, viewer: &str) {
    let ws = format!(
        "{}/ws/tasks/{task}/stream",
        url.replacen("https://", "wss://", 1)
    );
    let protocols = (
        "sec-websocket-protocol",
        format!("squadron.v1, bearer.{viewer}"),
    );
    let answer = handshake(&ws, &[protocols]).expect("the subprotocol opens the stream");
    let chosen = answer.headers().get("sec-websocket-protocol");
    assert_eq!(chosen.and_then(|v| v.to_str().ok()), Some("squadron.v1"));
    let header = ("authorization", format!("Bearer {viewer}"));
    handshake(&ws, std::slice::from_ref(&header)).expect("Authorization opens the stream");
    match handshake(&format!("{ws}?generation=1"), &[header]) {
        Err(tungstenite::Error::Http(r)) => assert_eq!(r.status(), 400, "{r:?}"),
        other => panic!("a task's stream took a generation: {other:?}"),
    }
    for target in [
        format!("{ws}?token={viewer}"),
        format!("{ws}?access_token={viewer}"),
        ws.clone(),
    ] {
        match handshake(&target, &[]) {
            Err(tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401, "{target}: {r:?}"),
            Err(e) => panic!("{target}: {e}"),
            Ok(_) => panic!("{target} opened without a token in a header"),
        }
    }
}

/// A WebSocket handshake over TLS with the test CA and exactly `headers`; the node's answer.
fn handshake(
    target: &str,
    headers: &[(&'static str, String)],
) -> Result<tungstenite::handshake::client::Response, tungstenite::Error> {
    use tungstenite::client::IntoClientRequest;
    let mut request = target.into_client_request().expect("ws request");
    for (name, value) in headers {
        let value = value.parse().expect("header");
        request.headers_mut().insert(*name, value);
    }
    let uri = request.uri().clone();
    let address = (uri.host().expect("host"), uri.port_u16().expect("port"));
    let tcp = std::net::TcpStream::connect(address).expect("connect");
    let connector = tungstenite::Connector::Rustls(pki().operator.clone());
    match tungstenite::client_tls_with_config(request, tcp, None, Some(connector)) {
        Ok((_socket, answer)) => Ok(answer),
        Err(tungstenite::HandshakeError::Failure(e)) => Err(e),
        Err(tungstenite::HandshakeError::Interrupted(_)) => panic!("a blocking handshake paused"),
    }
}
