//! Egress injection (issue 14 item 8): credentials an admin bound to an upstream API never
//! enter the sandbox. The sandbox gets, per such mount, a base URL on its own loopback
//! (`{MOUNT}_BASE_URL`, and the provider's own variable for the seed's mounts) and a
//! placeholder key (`{MOUNT}`, `sqd_egress_…`). The worker listens on that loopback — a socket
//! it creates inside the sandbox's network namespace — checks the placeholder, puts the value
//! in the binding's header and forwards the request to the bound upstream over TLS
//! (`proxy.rs`). The value lives only in this process's memory, for the attempt: the session
//! closes when the attempt ends. A restarted worker that adopts a running attempt takes the
//! lease again and serves the proxy again, accepting the placeholder the provider already
//! holds (read back from `egress.env`, which the sandbox can read but not write).

mod echo_scrub;
mod proxy;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use squadron_api::agent_channel::EGRESS_PORT;
use squadron_client::CredentialLeaseGrant;
use squadron_core::credential_egress::EgressBinding;
use squadron_core::ids::{CredentialId, CredentialLeaseId, Generation, ProfileId, TaskId};
use squadron_pki::{SecretToken, TokenHash, TokenKind};
use tokio::task::JoinHandle;
use zeroize::Zeroizing;

use crate::control_link::ControlLink;
use crate::error::WorkerError;
use crate::http1_server::Acceptor;
use crate::task::credential_session::file_variable;

/// Largest request body a sandbox may send through the proxy.
pub(crate) const EGRESS_REQUEST_BYTES_MAX: usize = 32 << 20;
/// Longest the upstream may take to accept a connection.
pub(crate) const EGRESS_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Longest an upstream's answer may stay silent (a model streams for minutes, in pieces).
pub(crate) const EGRESS_READ_IDLE_MS_MAX: u64 = 300_000;
/// Longest a connection may take to send a request's head (and idle between requests).
pub(crate) const EGRESS_HEADER_READ_MS_MAX: u64 = 30_000;
/// Connections one sandbox's proxy serves at once; more wait to be accepted (a VM's channel
/// hands it no more than that many: its egress share, `task::agent_relay`).
pub(crate) const EGRESS_CONNECTIONS_MAX: usize = squadron_api::agent_channel::EGRESS_STREAMS_MAX;
/// Where upstreams' trust anchors are read from: Debian's bundle.
pub(crate) const EGRESS_CA_BUNDLE_PATH: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The provider's own base-URL variable for the seed's credential mounts.
const PROVIDER_BASE_URL_VARIABLES: [(&str, &str); 2] = [
    ("anthropic_api_key", "ANTHROPIC_BASE_URL"),
    ("openai_api_key", "OPENAI_BASE_URL"),
];
/// Other variables the provider reads its key from, for the seed's mounts (Codex's
/// `exec` takes `CODEX_API_KEY`).
const PROVIDER_KEY_VARIABLES: [(&str, &str); 1] = [("openai_api_key", "CODEX_API_KEY")];

/// Whose attempt a session serves: which kind of credential lease it checks, and what logs
/// call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EgressOwner {
    Task(TaskId),
    Agent {
        profile: ProfileId,
        generation: Generation,
    },
}

impl std::fmt::Display for EgressOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EgressOwner::Task(task) => write!(f, "task {task}"),
            EgressOwner::Agent {
                profile,
                generation,
            } => write!(f, "profile {profile} generation {generation}"),
        }
    }
}

/// One credential the proxy injects.
struct Route {
    id: CredentialId,
    value: Zeroizing<String>,
    binding: EgressBinding,
    upstream: reqwest::Url,
}

/// One attempt's injected credentials and its proxy.
pub(crate) struct EgressSession {
    owner: EgressOwner,
    /// The credential lease the values came with: every request waits for the control
    /// plane to confirm it is still active.
    lease: CredentialLeaseId,
    control: ControlLink,
    placeholder: SecretToken,
    placeholder_hash: TokenHash,
    routes: BTreeMap<String, Route>,
    http: reqwest::Client,
    /// The accept loop; `Err(())` once closed, for good: a `serve` that comes after a
    /// `close` (a start still running when its launch was abandoned) is refused.
    serving: Mutex<Result<Option<JoinHandle<()>>, ()>>,
}

impl std::fmt::Debug for EgressSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressSession")
            .field("owner", &self.owner)
            .field("mounts", &self.routes.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl EgressSession {
    /// The session for the granted values bound to an upstream, with a new placeholder;
    /// `None` when there are none.
    pub(crate) fn of(
        owner: EgressOwner,
        grant: &CredentialLeaseGrant,
        control: ControlLink,
        extra_ca: Option<&Path>,
    ) -> Result<Option<Arc<EgressSession>>, WorkerError> {
        Self::with_placeholder(owner, grant, control, extra_ca, None)
    }

    /// The session of an adopted attempt: the placeholder is the one `egress_env` (the
    /// attempt's `egress.env`, written by the worker's last life) gave the provider.
    pub(crate) fn resumed(
        owner: EgressOwner,
        grant: &CredentialLeaseGrant,
        control: ControlLink,
        extra_ca: Option<&Path>,
        egress_env: &str,
    ) -> Result<Option<Arc<EgressSession>>, WorkerError> {
        let placeholder = placeholder_in(egress_env)?;
        Self::with_placeholder(owner, grant, control, extra_ca, Some(placeholder))
    }

    fn with_placeholder(
        owner: EgressOwner,
        grant: &CredentialLeaseGrant,
        control: ControlLink,
        extra_ca: Option<&Path>,
        placeholder: Option<SecretToken>,
    ) -> Result<Option<Arc<EgressSession>>, WorkerError> {
        let mut routes = BTreeMap::new();
        for v in &grant.credentials {
            let Some(binding) = &v.egress else { continue };
            let upstream =
                reqwest::Url::parse(&binding.upstream).map_err(|e| WorkerError::Invalid {
                    field: "egress.upstream".to_owned(),
                    message: format!("credential {}: {e}", v.id),
                })?;
            routes.insert(
                v.mount.clone(),
                Route {
                    id: v.id.clone(),
                    value: Zeroizing::new(v.value.clone()),
                    binding: binding.clone(),
                    upstream,
                },
            );
        }
        if routes.is_empty() {
            return Ok(None);
        }
        let placeholder = match placeholder {
            Some(kept) => kept,
            None => SecretToken::generate(TokenKind::Egress),
        };
        Ok(Some(Arc::new(EgressSession {
            owner,
            lease: grant.lease,
            control,
            placeholder_hash: placeholder.hash(),
            placeholder,
            routes,
            http: upstream_client(extra_ca)?,
            serving: Mutex::new(Ok(None)),
        })))
    }

    /// Where the sandbox reaches the proxy.
    pub(crate) fn address() -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, EGRESS_PORT))
    }

    /// The mounts injected here (no `{MOUNT}_FILE` for them).
    pub(crate) fn mounts(&self) -> impl Iterator<Item = &str> + Clone {
        self.routes.keys().map(String::as_str)
    }

    /// `egress.env`, which `launch.sh` sources before the provider starts: base URLs and the
    /// placeholder, nothing secret, exported, and each injected mount's `{MOUNT}_FILE` unset (no file is
    /// made for it). A file rather than the sandbox's environment because a sandbox agent's
    /// container or guest exists before the lease is taken.
    pub(crate) fn env_script(&self) -> Result<String, WorkerError> {
        env_script(self.mounts(), &self.placeholder.expose())
    }

    /// Serves the proxy on `listener` (a socket in the sandbox's namespace) until closed.
    pub(crate) fn serve(
        self: &Arc<Self>,
        listener: std::net::TcpListener,
    ) -> Result<(), WorkerError> {
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| WorkerError::runtime("egress proxy", e.to_string()))?;
        self.serve_on(listener)
    }

    /// Serves the proxy on the connections `listener` yields (a VM's arrive over its channel)
    /// until closed; a proxy served again stops serving the last one.
    pub(crate) fn serve_on<A: Acceptor>(self: &Arc<Self>, listener: A) -> Result<(), WorkerError> {
        let mut slot = self.serving_slot();
        let Ok(serving) = &mut *slot else {
            return Err(WorkerError::runtime(
                "egress proxy",
                format!("the proxy of {} was closed", self.owner),
            ));
        };
        let handle = tokio::spawn(proxy::accept_loop(listener, self.clone()));
        if let Some(old) = serving.replace(handle) {
            old.abort();
        }
        Ok(())
    }

    /// Stops serving, for good: every connection ends and nothing is injected any more.
    pub(crate) fn close(&self) {
        let mut slot = self.serving_slot();
        if let Ok(Some(handle)) = std::mem::replace(&mut *slot, Err(())) {
            handle.abort();
            tracing::info!(owner = %self.owner, "egress proxy closed");
        }
    }

    fn serving_slot(&self) -> std::sync::MutexGuard<'_, Result<Option<JoinHandle<()>>, ()>> {
        self.serving.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for EgressSession {
    fn drop(&mut self) {
        self.close();
    }
}

/// Per mount `m`: `M_BASE_URL` and the provider's own variable (for the seed's mounts) point
/// at the proxy, and `M` holds the placeholder.
fn sandbox_env<'a>(
    mounts: impl Iterator<Item = &'a str>,
    placeholder: &str,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for mount in mounts {
        let url = format!("http://{}/{mount}", EgressSession::address());
        let name = mount.to_ascii_uppercase();
        env.insert(format!("{name}_BASE_URL"), url.clone());
        env.insert(name, placeholder.to_owned());
        if let Some((_, var)) = PROVIDER_BASE_URL_VARIABLES
            .iter()
            .find(|(m, _)| *m == mount)
        {
            env.insert((*var).to_owned(), url);
        }
        if let Some((_, var)) = PROVIDER_KEY_VARIABLES.iter().find(|(m, _)| *m == mount) {
            env.insert((*var).to_owned(), placeholder.to_owned());
        }
    }
    env
}

/// The placeholder an `egress.env` exports (every injected mount's variable holds the same).
fn placeholder_in(egress_env: &str) -> Result<SecretToken, WorkerError> {
    egress_env
        .lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .filter_map(|(_, value)| shlex::split(value)?.into_iter().next())
        .find_map(|value| SecretToken::parse(TokenKind::Egress, &value).ok())
        .ok_or_else(|| WorkerError::Invalid {
            field: "egress.env".to_owned(),
            message: "exports no placeholder".to_owned(),
        })
}

/// `egress.env`'s text for `mounts` (see [`EgressSession::env_script`]).
fn env_script<'a>(
    mounts: impl Iterator<Item = &'a str> + Clone,
    placeholder: &str,
) -> Result<String, WorkerError> {
    let mut text = String::from(
        "# Written by the Squadron worker: credentials injected at egress. The values stay \
         with the worker;\n# these are its proxy's addresses and a placeholder it accepts for \
         this attempt only.\n",
    );
    for mount in mounts.clone() {
        text.push_str(&format!("unset {}\n", file_variable(mount)));
    }
    for (name, value) in sandbox_env(mounts, placeholder) {
        let value = shlex::try_quote(&value).map_err(|e| WorkerError::Invalid {
            field: "credential_refs.mount".to_owned(),
            message: format!("{name}: {e}"),
        })?;
        text.push_str(&format!("export {name}={value}\n"));
    }
    Ok(text)
}

/// The client that reaches upstreams: TLS only, the system's anchors and `extra_ca`, no
/// redirects (a redirect would carry the value elsewhere).
fn upstream_client(extra_ca: Option<&Path>) -> Result<reqwest::Client, WorkerError> {
    let mut http = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .https_only(true)
        .connect_timeout(Duration::from_millis(EGRESS_CONNECT_TIMEOUT_MS))
        .read_timeout(Duration::from_millis(EGRESS_READ_IDLE_MS_MAX))
        .redirect(reqwest::redirect::Policy::none());
    let bundles = [Some(Path::new(EGRESS_CA_BUNDLE_PATH)), extra_ca];
    for path in bundles.into_iter().flatten() {
        let pem =
            std::fs::read(path).map_err(|e| WorkerError::io("read the CA bundle", path, e))?;
        let roots = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
            WorkerError::runtime("egress proxy", format!("{}: {e}", path.display()))
        })?;
        for root in roots {
            http = http.add_root_certificate(root);
        }
    }
    http.build()
        .map_err(|e| WorkerError::runtime("egress proxy", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_is_read_back_from_the_env_file_it_wrote() {
        let placeholder = SecretToken::generate(TokenKind::Egress);
        let text = env_script(
            ["anthropic_api_key", "gh_token"].into_iter(),
            &placeholder.expose(),
        )
        .expect("script");
        let back = placeholder_in(&text).expect("a placeholder");
        assert!(placeholder.hash().matches(&back));
        let none = placeholder_in("# nothing\nexport A=b\n").expect_err("none");
        assert!(none.to_string().contains("egress.env"), "{none}");
    }

    #[test]
    fn the_sandbox_gets_base_urls_and_a_placeholder() {
        let placeholder = SecretToken::generate(TokenKind::Egress).expose();
        let env = sandbox_env(
            ["anthropic_api_key", "gh_token", "openai_api_key"].into_iter(),
            &placeholder,
        );
        let base = "http://127.0.0.1:4180";
        assert_eq!(
            env["ANTHROPIC_API_KEY_BASE_URL"],
            format!("{base}/anthropic_api_key")
        );
        assert_eq!(
            env["ANTHROPIC_BASE_URL"],
            format!("{base}/anthropic_api_key")
        );
        assert_eq!(env["GH_TOKEN_BASE_URL"], format!("{base}/gh_token"));
        assert_eq!(env["ANTHROPIC_API_KEY"], placeholder);
        assert_eq!(env["GH_TOKEN"], placeholder);
        assert_eq!(env["OPENAI_BASE_URL"], format!("{base}/openai_api_key"));
        assert_eq!(env["CODEX_API_KEY"], placeholder);
        assert_eq!(env["OPENAI_API_KEY"], placeholder);
        assert_eq!(env.len(), 9, "{:?}", env.keys());
        assert!(placeholder.starts_with("sqd_egress_"));
    }

    /// `egress.env` as `sh` reads it: the `_FILE` variable gone, every variable exported.
    #[test]
    fn the_egress_env_file_exports_the_variables_and_drops_the_file_variable() {
        let placeholder = SecretToken::generate(TokenKind::Egress).expose();
        let text = env_script(["anthropic_api_key"].into_iter(), &placeholder).unwrap();
        assert!(text.contains("unset ANTHROPIC_API_KEY_FILE\n"), "{text}");
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", &format!("{text}\nenv")])
            .env("ANTHROPIC_API_KEY_FILE", "/nowhere")
            .output()
            .unwrap();
        let env = String::from_utf8(out.stdout).unwrap();
        assert!(!env.contains("ANTHROPIC_API_KEY_FILE"), "{env}");
        assert!(
            env.contains(&format!("ANTHROPIC_API_KEY={placeholder}\n")),
            "{env}"
        );
        assert!(
            env.contains("ANTHROPIC_BASE_URL=http://127.0.0.1:4180/anthropic_api_key\n"),
            "{env}"
        );
    }
}
