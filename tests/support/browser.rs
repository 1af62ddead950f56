//! Headless Chromium driven over WebDriver (chromedriver, through `fantoccini`), for the
//! dashboard's tests. Debian's `chromium`, `chromium-driver` and `libnss3-tools` provide the
//! programs; `scripts/test` installs them, and a test that cannot find one fails saying so.
//!
//! Each browser runs with a HOME of its own whose NSS database trusts the test CA and nothing
//! else added: the node's certificate is verified the way an operator's browser verifies it
//! (chain, host name, validity), instead of switching certificate checks off.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::browser_net::BrowserNet;
use super::{free_port, wait_until};

/// How long a page may take to show what a test waits for.
pub const PAGE_WAIT: Duration = Duration::from_secs(20);

/// A program on `PATH`; its absence fails the test with the way to get it.
pub fn program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not installed: run scripts/test, which installs Debian's chromium, \
                 chromium-driver and libnss3-tools (the dashboard's browser test needs them)"
            )
        })
}

/// One chromedriver process with one Chromium session.
pub struct Browser {
    pub client: fantoccini::Client,
    driver: Child,
    driver_url: String,
    session: String,
    home: tempfile::TempDir,
    /// Dropped after the driver is killed (fields drop after `Drop::drop`).
    _net: BrowserNet,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser")
            .field("driver_url", &self.driver_url)
            .finish()
    }
}

/// A HOME whose NSS database (`~/.pki/nssdb`, where Chromium on Linux looks) trusts `ca_pem`
/// as a certificate authority for web sites.
fn home_trusting(ca_pem: &Path) -> tempfile::TempDir {
    let home = tempfile::tempdir().expect("browser home");
    let db = home.path().join(".pki/nssdb");
    std::fs::create_dir_all(&db).expect("nssdb dir");
    let db_arg = format!("sql:{}", db.display());
    let certutil = program("certutil");
    let runs: [Vec<&str>; 2] = [
        vec!["-N", "-d", &db_arg, "--empty-password"],
        vec![
            "-A",
            "-d",
            &db_arg,
            "-n",
            "squadron-tests",
            "-t",
            "C,,",
            "-i",
        ],
    ];
    for (i, args) in runs.iter().enumerate() {
        let mut command = Command::new(&certutil);
        command.args(args);
        if i == 1 {
            command.arg(ca_pem);
        }
        let out = command.output().expect("certutil");
        assert!(
            out.status.success(),
            "certutil {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    home
}

/// Chromium's switches: headless, root-friendly, and quiet on the network — nothing but the
/// node under test is reached (no updates, sync, safe browsing or DNS lookups of any name).
fn chromium_args(profile: &Path) -> Vec<String> {
    [
        "--headless=new",
        // Tall enough that a screenshot shows the whole board.
        "--window-size=1280,2400",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-domain-reliability",
        "--disable-client-side-phishing-detection",
        "--disable-sync",
        "--disable-extensions",
        "--no-pings",
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("--user-data-dir={}", profile.display())])
    .collect()
}

impl Browser {
    /// Starts chromedriver and a Chromium session trusting `ca_pem`, in a network namespace
    /// of their own (see `browser_net`) from which 127.0.0.1:`port` reaches the host's for
    /// each of `ports`.
    pub async fn start(ca_pem: &Path, ports: &[u16]) -> Browser {
        let chromium = program("chromium");
        let chromedriver = program("chromedriver");
        let home = home_trusting(ca_pem);
        let net = BrowserNet::new();
        for port in ports {
            net.reach_host(*port);
        }
        let port = free_port();
        let log = std::fs::File::create(home.path().join("chromedriver.log")).expect("log");
        let driver = net
            .command(&chromedriver)
            .arg(format!("--port={port}"))
            .env("HOME", home.path())
            // Its own process group, so the browsers it starts go when the test ends.
            .process_group(0)
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn chromedriver");
        let driver_url = format!("http://127.0.0.1:{}", net.reach_inside(port));
        let status = format!("{driver_url}/status");
        wait_until(PAGE_WAIT, || ureq::get(&status).call().is_ok())
            .unwrap_or_else(|_| panic!("chromedriver did not answer on {status}"));
        let mut caps = fantoccini::wd::Capabilities::new();
        let profile = home.path().join("profile");
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"binary": chromium, "args": chromium_args(&profile)}),
        );
        caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
        let client = fantoccini::ClientBuilder::new(
            hyper_util::client::legacy::connect::HttpConnector::new(),
        )
        .capabilities(caps)
        .connect(&driver_url)
        .await
        .unwrap_or_else(|e| panic!("a Chromium session: {e}"));
        let session = client
            .session_id()
            .await
            .expect("session id")
            .expect("a session");
        Browser {
            client,
            driver,
            driver_url,
            session,
            home,
            _net: net,
        }
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    pub async fn eval(&self, script: &str, args: Vec<Value>) -> Value {
        self.client
            .execute(script, args)
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Runs an asynchronous script: it calls its last argument with the result.
    pub async fn eval_async(&self, script: &str, args: Vec<Value>) -> Value {
        self.client
            .execute_async(script, args)
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Polls `expression` until it is truthy; returns its value, or fails naming `what`
    /// with the page's text.
    pub async fn wait_for(&self, what: &str, expression: &str) -> Value {
        // While the page is still loading, its elements may not exist yet: an expression that
        // throws reads as "not yet", not as a failure.
        let script = format!("try {{ return ({expression}); }} catch (e) {{ return null; }}");
        let start = Instant::now();
        loop {
            let value = self.eval(&script, vec![]).await;
            let truthy = !matches!(&value, Value::Null | Value::Bool(false))
                && value != json!("")
                && value != json!(0);
            if truthy {
                return value;
            }
            if start.elapsed() > PAGE_WAIT {
                let text = self.eval("return document.body.innerText", vec![]).await;
                panic!("the page never showed {what}; it shows:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The browser console's entries since the last call (`{level, message, …}`), read
    /// through chromedriver's log endpoint: what the page logged, its uncaught errors, and
    /// the browser's own reports (failed loads, refused WebSockets, CSP violations).
    pub async fn console(&self) -> Vec<Value> {
        let url = format!("{}/session/{}/se/log", self.driver_url, self.session);
        let answer = tokio::task::spawn_blocking(move || {
            ureq::post(&url)
                .send_json(json!({"type": "browser"}))
                .map_err(|e| e.to_string())
                .and_then(|r| r.into_json::<Value>().map_err(|e| e.to_string()))
        })
        .await
        .expect("log reader");
        let body = answer.unwrap_or_else(|e| panic!("the browser's log: {e}"));
        body["value"].as_array().cloned().unwrap_or_default()
    }

    /// Saves what the page shows as `{name}.png` under the build's test-output directory
    /// (`$CARGO_TARGET_TMPDIR/dashboard-screenshots`), and prints where.
    pub async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("a screenshot");
        assert!(png.starts_with(b"\x89PNG"), "the screenshot is no PNG");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
        std::fs::create_dir_all(&dir).expect("screenshot directory");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write the screenshot");
        println!("screenshot: {}", path.display());
    }

    /// chromedriver's own log, for failure messages.
    pub fn driver_log(&self) -> String {
        super::tail(&self.home.path().join("chromedriver.log"))
    }

    /// Ends the session (Chromium quits); dropping ends chromedriver.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: after a failure the session never ended, and a Chromium left
        // behind would outlive the test.
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.driver.wait();
    }
}
