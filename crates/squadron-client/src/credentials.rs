//! What a client presents and whom it trusts: the cluster CA (every control node's
//! certificate chains to it), optionally its own certificate (workers, agents), and the
//! bearer token operators send on every request.

use std::sync::Arc;

use squadron_pki::{
    client_config, ClusterTrust, ExpectedPeer, PkiError, TlsConnector, TlsIdentity,
};

/// A client's credentials. The default has none: plain `http://` endpoints only (a client's
/// own tests against a stub server).
#[derive(Clone, Default)]
pub struct Credentials {
    trust: Option<ClusterTrust>,
    /// Present when the caller is a worker or agent: its certificate, and only a control
    /// node's certificate is accepted at the other end.
    identity: Option<TlsIdentity>,
    token: Option<Arc<str>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("tls", &self.trust.is_some())
            .field("identity", &self.identity.as_ref().map(|i| &i.identity))
            .field("token", &self.token.as_ref().map(|_| "…"))
            .finish()
    }
}

impl Credentials {
    /// An operator: trusts the CA in `ca_pem`, checks the server's host name, sends `token`.
    pub fn operator(ca_pem: &str, token: Option<String>) -> Result<Self, PkiError> {
        Ok(Credentials {
            trust: Some(ClusterTrust::from_ca_pem(ca_pem)?),
            identity: None,
            token: token.map(|t| Arc::from(t.trim())),
        })
    }

    /// A worker (or agent): presents its certificate, accepts only a control node's.
    pub fn identity(identity: TlsIdentity) -> Self {
        Credentials {
            trust: Some(identity.trust.clone()),
            identity: Some(identity),
            token: None,
        }
    }

    /// A worker's (or agent's) certificate files in `dir` (`{name}.pem`, `{name}.key` and the
    /// CA's `ca.pem`), as `squadron init --worker-cert` writes them.
    pub fn from_cert_dir(dir: &std::path::Path, name: &str) -> Result<Self, PkiError> {
        let identity = TlsIdentity::load(&squadron_pki::PkiDir::new(dir), name)?;
        Ok(Credentials::identity(identity))
    }

    /// The bearer token sent on every request, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The rustls configuration of HTTPS requests; `None` without a CA.
    pub fn tls_config(&self) -> Result<Option<rustls::ClientConfig>, PkiError> {
        let Some(trust) = &self.trust else {
            return Ok(None);
        };
        let config = match &self.identity {
            Some(id) => client_config(trust, ExpectedPeer::AnyNode, Some(&id.cert))?,
            None => client_config(trust, ExpectedPeer::ServerName, None)?,
        };
        Ok(Some(config))
    }

    /// The connector of gRPC channels; `None` without a CA.
    pub fn grpc_connector(&self) -> Result<Option<TlsConnector>, PkiError> {
        Ok(self.tls_config()?.map(TlsConnector::new))
    }
}
