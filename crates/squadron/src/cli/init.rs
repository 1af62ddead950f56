//! `squadron init`: the trust material of a new cluster. From the node config files (or one
//! `--data-dir`), it makes the cluster CA (or takes the operator's), writes each node's `pki/`
//! (CA certificate and key, the node's certificate and key) and the first admin token, and
//! prints the two lines a user needs. `--rotate-node-certs` re-issues the node certificates
//! from the existing CA instead (rotation; send each node SIGHUP afterwards).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use squadron_pki::{
    issue_node_cert, load_ca, pki_dir::write_file, AdminTokenRecord, ClusterCa, PkiDir,
    SecretToken, TokenKind, NODE_CERT_NAME,
};
use squadron_server::NodeConfig;

/// File name of the admin token written next to the first config file.
pub const ADMIN_TOKEN_FILE_NAME: &str = "admin.token";

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The node config files of the cluster (every node this host keeps data for).
    #[arg(value_name = "CONFIG")]
    pub configs: Vec<PathBuf>,
    /// Instead of config files: one node's data directory (node 1, loopback addresses).
    #[arg(long, value_name = "DIR", conflicts_with = "configs")]
    pub data_dir: Option<PathBuf>,
    /// An existing CA certificate to issue from (with --ca-key).
    #[arg(long, value_name = "FILE", requires = "ca_key")]
    pub ca_cert: Option<PathBuf>,
    #[arg(long, value_name = "FILE", requires = "ca_cert")]
    pub ca_key: Option<PathBuf>,
    /// The cluster's data key (64 hex digits, a 0600 file) for nodes joining a cluster;
    /// a new cluster gets a new one. Credential values are sealed under it (INV-13).
    #[arg(long, value_name = "FILE")]
    pub data_key: Option<PathBuf>,
    /// Where the first admin token is written (0600); default: `admin.token` next to the
    /// first config (or in --data-dir).
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Re-issue the node certificates from the CA already in the nodes' `pki/` (rotation).
    #[arg(long)]
    pub rotate_node_certs: bool,
    /// Only issue worker certificates, `ID=DIR` (repeatable), from the CA in the first node's
    /// `pki/`: what `squadron worker --cert-dir DIR` reads, until workers enroll by token.
    #[arg(long = "worker-cert", value_name = "ID=DIR")]
    pub worker_certs: Vec<String>,
}

/// One node whose `pki/` is written.
#[derive(Debug, Clone)]
pub struct NodeTarget {
    pub id: u64,
    pub pki: PkiDir,
    /// Advertised `host:port`s; their hosts go into the certificate.
    pub advertised: Vec<String>,
    /// The node that initialises the cluster (the lowest initial member).
    pub initialiser: bool,
}

impl NodeTarget {
    pub fn of_config(config: &NodeConfig) -> Self {
        let initialiser = config.initial_members.iter().map(|m| m.id).min() == Some(config.node_id);
        NodeTarget {
            id: config.node_id,
            pki: config.pki_dir(),
            advertised: vec![config.rest_addr(), config.grpc_addr(), config.peer_addr()],
            initialiser,
        }
    }
}

pub fn run(args: InitArgs) -> anyhow::Result<()> {
    let (targets, token_default) = targets(&args)?;
    let token_file = args.admin_token_file.clone().unwrap_or(token_default);
    let supplied = match (&args.ca_cert, &args.ca_key) {
        (Some(c), Some(k)) => Some(read_ca(c, k)?),
        _ => None,
    };
    if !args.worker_certs.is_empty() {
        return issue_worker_certs(&targets, &args.worker_certs);
    }
    if args.rotate_node_certs {
        rotate(&targets, supplied)?;
        println!("node certificates re-issued; send each node SIGHUP to load them");
        return Ok(());
    }
    let data_key = match &args.data_key {
        Some(path) => Some(squadron_pki::pki_dir::read_secret_file(path)?),
        None => None,
    };
    let first_ca = initialise(&targets, supplied, data_key.as_deref(), &token_file)?;
    if !targets.iter().any(|t| t.initialiser) {
        println!("export SQUADRON_CACERT={}", first_ca.display());
        return Ok(());
    }
    print_exports(&first_ca, &token_file)
}

fn targets(args: &InitArgs) -> anyhow::Result<(Vec<NodeTarget>, PathBuf)> {
    if let Some(dir) = &args.data_dir {
        let dir = std::path::absolute(dir).context("--data-dir")?;
        let target = NodeTarget {
            id: 1,
            pki: PkiDir::of_data_dir(&dir),
            advertised: Vec::new(),
            initialiser: true,
        };
        return Ok((vec![target], dir.join(ADMIN_TOKEN_FILE_NAME)));
    }
    let Some(first) = args.configs.first() else {
        anyhow::bail!("give the node config files (or --data-dir)");
    };
    let mut out = Vec::new();
    for path in &args.configs {
        let path = std::path::absolute(path).context("config path")?;
        let config =
            NodeConfig::load(&path).with_context(|| format!("loading {}", path.display()))?;
        out.push(NodeTarget::of_config(&config));
    }
    let first = std::path::absolute(first).context("config path")?;
    let dir = first.parent().map(Path::to_path_buf).unwrap_or_default();
    Ok((out, dir.join(ADMIN_TOKEN_FILE_NAME)))
}

fn read_ca(cert: &Path, key: &Path) -> anyhow::Result<ClusterCa> {
    let cert_pem =
        std::fs::read_to_string(cert).with_context(|| format!("reading {}", cert.display()))?;
    let key_pem = squadron_pki::pki_dir::read_secret_file(key)?;
    ClusterCa::from_pem(&cert_pem, &key_pem).context("the supplied CA")
}

/// A new cluster (or nodes joining one): refuses any node that already has PKI. The admin
/// token and, unless `data_key` brings the cluster's, the data key are made only when one of
/// the targets initialises the cluster. Returns the first node's CA path.
pub fn initialise(
    targets: &[NodeTarget],
    supplied: Option<ClusterCa>,
    data_key: Option<&str>,
    token_file: &Path,
) -> anyhow::Result<PathBuf> {
    for t in targets {
        if t.pki.ca_cert().exists() || t.pki.cert(NODE_CERT_NAME).exists() {
            anyhow::bail!(
                "{} already holds PKI; refusing to overwrite it (--rotate-node-certs re-issues \
                 node certificates from its CA)",
                t.pki.path().display()
            );
        }
    }
    let (ca, key_pem) = match supplied {
        Some(ca) => {
            let key = ca.key_pem();
            (ca, key)
        }
        None => ClusterCa::generate("squadron").context("generating the cluster CA")?,
    };
    for t in targets {
        t.pki.write_ca(ca.cert_pem(), &key_pem)?;
        let cert = issue_node_cert(&ca, t.id, &t.advertised)?;
        t.pki.write_identity(NODE_CERT_NAME, &cert)?;
    }
    write_data_key(targets, data_key)?;
    // Nodes that join an existing cluster get certificates only: its admin token exists.
    if !targets.iter().any(|t| t.initialiser) {
        return Ok(targets.first().map(|t| t.pki.ca_cert()).unwrap_or_default());
    }
    let token = SecretToken::generate(TokenKind::Operator);
    if let Some(parent) = token_file.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let mut text = token.expose();
    text.push('\n');
    write_file(
        token_file,
        text.as_bytes(),
        squadron_pki::pki_dir::SECRET_FILE_MODE,
    )?;
    for t in targets.iter().filter(|t| t.initialiser) {
        AdminTokenRecord::of(&token).write(&t.pki)?;
    }
    Ok(targets.first().map(|t| t.pki.ca_cert()).unwrap_or_default())
}

/// The same data key into every target: the one given, or a new one for a new cluster.
/// Nodes joining without the cluster's key get none and say so, since a second key would
/// seal values the other nodes cannot open.
fn write_data_key(targets: &[NodeTarget], given: Option<&str>) -> anyhow::Result<()> {
    let text = match given {
        Some(text) => {
            squadron_pki::DataKey::from_hex(text).context("--data-key")?;
            zeroize::Zeroizing::new(text.trim().to_string())
        }
        None if targets.iter().any(|t| t.initialiser) => squadron_pki::DataKey::generate()?.1,
        None => {
            eprintln!(
                "warning: no --data-key given; these nodes cannot open credentials until \
                 pki/{} holds the cluster's key",
                squadron_pki::DATA_KEY_FILE_NAME
            );
            return Ok(());
        }
    };
    for t in targets {
        squadron_pki::DataKey::write(&t.pki, &text)?;
    }
    Ok(())
}

/// Rotation: new node certificates from the CA the nodes already hold.
fn rotate(targets: &[NodeTarget], supplied: Option<ClusterCa>) -> anyhow::Result<()> {
    for t in targets {
        let ca = match &supplied {
            Some(ca) => ClusterCa::from_pem(ca.cert_pem(), &ca.key_pem())?,
            None => {
                load_ca(&t.pki).with_context(|| format!("the CA in {}", t.pki.path().display()))?
            }
        };
        let cert = issue_node_cert(&ca, t.id, &t.advertised)?;
        t.pki.write_identity(NODE_CERT_NAME, &cert)?;
    }
    Ok(())
}

/// Worker certificates from the first node's CA, each into its `DIR` (`worker.pem`,
/// `worker.key`, `ca.pem`).
fn issue_worker_certs(targets: &[NodeTarget], specs: &[String]) -> anyhow::Result<()> {
    let first = targets.first().context("no node to take the CA from")?;
    let ca =
        load_ca(&first.pki).with_context(|| format!("the CA in {}", first.pki.path().display()))?;
    for spec in specs {
        let (id, dir) = spec
            .split_once('=')
            .with_context(|| format!("--worker-cert {spec:?}: expected ID=DIR"))?;
        let id = squadron_core::ids::WorkerId::new(id).context("--worker-cert: the worker id")?;
        let cert = squadron_pki::issue_worker_cert(&ca, &id)?;
        PkiDir::new(dir).write_identity(squadron_pki::WORKER_CERT_NAME, &cert)?;
        println!("worker {id}: certificate in {dir} (squadron worker --cert-dir {dir})");
    }
    Ok(())
}

pub fn print_exports(ca: &Path, token_file: &Path) -> anyhow::Result<()> {
    let token_file = std::path::absolute(token_file).context("token file")?;
    println!("export SQUADRON_CACERT={}", ca.display());
    println!("export SQUADRON_TOKEN_FILE={}", token_file.display());
    Ok(())
}
