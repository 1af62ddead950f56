//! Which runtimes this host can offer. A runtime asked for but not available is left out with
//! the reason (no bubblewrap, no cgroup v2, no Docker engine or image), so an operator sees at
//! start why a worker offers less than asked.

use std::collections::BTreeMap;
use std::sync::Arc;

use squadron_core::manifest::RuntimeKind;

use crate::config::WorkerConfig;
use crate::runtime::docker::{DockerConfig, DockerRuntime};
use crate::runtime::process::{ProcessRuntime, ProcessRuntimeConfig};
use crate::runtime::Runtime;

/// The Docker runtime's warm pool slots, under the data directory.
const DOCKER_POOL_DIR_NAME: &str = "docker-pool";

/// The runtimes a worker starts with, by kind: what [`probe_runtimes`] found on this host.
#[derive(Debug, Clone, Default)]
pub struct RuntimeSet(BTreeMap<RuntimeKind, Arc<dyn Runtime>>);

impl RuntimeSet {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The kinds offered, in order.
    pub fn kinds(&self) -> impl Iterator<Item = RuntimeKind> + '_ {
        self.0.keys().copied()
    }

    pub(crate) fn get(&self, kind: RuntimeKind) -> Option<&Arc<dyn Runtime>> {
        self.0.get(&kind)
    }

    pub(crate) fn insert(&mut self, kind: RuntimeKind, runtime: Arc<dyn Runtime>) {
        self.0.insert(kind, runtime);
    }
}

/// The runtimes of `config.runtimes` this host can run, and why the others cannot.
pub async fn probe_runtimes(config: &WorkerConfig) -> (RuntimeSet, Vec<(RuntimeKind, String)>) {
    let mut ready = RuntimeSet::default();
    let mut unavailable = Vec::new();
    for kind in &config.runtimes {
        match kind {
            RuntimeKind::Process => {
                match ProcessRuntimeConfig::for_worker(config).and_then(ProcessRuntime::new) {
                    Ok(r) => {
                        ready.insert(r.kind(), Arc::new(r));
                    }
                    Err(e) => unavailable.push((RuntimeKind::Process, e.to_string())),
                }
            }
            RuntimeKind::Docker => {
                let mut dc = DockerConfig::new(config.id.clone());
                dc.image = config.docker_image.clone();
                dc.global_dir = config.global_dir.clone();
                dc.allow_full_network = config.allow_full_network;
                dc.agent_binary = config.agent_binary.clone();
                dc.warm_pool = Some(crate::runtime::docker::WarmPoolConfig {
                    size: config.docker_warm_pool,
                    dir: config.data_dir.join(DOCKER_POOL_DIR_NAME),
                });
                let libraries = match &config.agent_binary {
                    Some(binary) => {
                        let dir = config.data_dir.join("agent-lib");
                        crate::runtime::agent_libraries::prepare(binary, &dir).map(|()| Some(dir))
                    }
                    None => Ok(None),
                };
                let networks = config
                    .egress_deny_networks()
                    .and_then(|deny| Ok((deny, config.egress_allow_networks()?)));
                let connected = match (networks, libraries) {
                    (_, Err(e)) => Err(e),
                    (Ok((deny, allow)), Ok(libraries)) => {
                        dc.agent_libraries = libraries;
                        dc.network.deny = deny;
                        dc.network.allow = allow;
                        match config.gateway_destinations(&dc.network) {
                            Ok(gateway) => {
                                dc.gateway = gateway;
                                DockerRuntime::connect(dc).await
                            }
                            Err(e) => Err(e),
                        }
                    }
                    (Err(e), _) => Err(e),
                };
                match connected {
                    Ok(r) => {
                        ready.insert(r.kind(), Arc::new(r));
                    }
                    Err(e) => unavailable.push((RuntimeKind::Docker, e.to_string())),
                }
            }
            RuntimeKind::Kvm => match kvm(config).await {
                Ok(r) => {
                    ready.insert(RuntimeKind::Kvm, r);
                }
                Err(e) => unavailable.push((RuntimeKind::Kvm, e)),
            },
        }
    }
    (ready, unavailable)
}

#[cfg(feature = "libvirt")]
async fn kvm(config: &WorkerConfig) -> Result<Arc<dyn Runtime>, String> {
    use crate::runtime::kvm::{KvmConfig, KvmRuntime};
    let image_dir = match &config.vm.image_dir {
        Some(d) => d.clone(),
        None => std::env::var_os("HOME")
            .map(|h| std::path::Path::new(&h).join(".cache/squadron-vm"))
            .ok_or("no --vm-image-dir and no HOME to find ~/.cache/squadron-vm in")?,
    };
    // A tag of the runtime's own: the process runtime's and the agent profiles' sweeps
    // (same worker) would take a running guest's tap for a leftover of theirs.
    let mut network = squadron_isolation::NetworkConfig::new(&format!("{}/kvm", config.id));
    network.deny = config.egress_deny_networks().map_err(|e| e.to_string())?;
    network.allow = config.egress_allow_networks().map_err(|e| e.to_string())?;
    let gateway = config
        .gateway_destinations(&network)
        .map_err(|e| e.to_string())?;
    let kvm = KvmConfig {
        uri: config.vm.uri.clone(),
        image_dir,
        state_dir: config.vm.state_dir.clone(),
        virtiofsd: config.vm.virtiofsd.clone(),
        worker: config.id.clone(),
        data_dir: config.data_dir.clone(),
        agent_binary: config.agent_binary.clone(),
        global_dir: config.global_dir.clone(),
        sandbox_user: crate::runtime::sandbox_user::SandboxUser::default(),
        test_boot_delay_ms: config.vm.test_boot_delay_ms,
        domain_type: config
            .vm
            .domain_type
            .parse()
            .map_err(|e| format!("vm_domain_type: {e}"))?,
        network,
        gateway,
    };
    let runtime = KvmRuntime::connect(kvm).await.map_err(|e| e.to_string())?;
    tracing::info!(
        domain_type = runtime.domain_type().as_str(),
        "KVM runtime ready"
    );
    Ok(Arc::new(runtime))
}

#[cfg(not(feature = "libvirt"))]
async fn kvm(_config: &WorkerConfig) -> Result<Arc<dyn Runtime>, String> {
    Err(
        "this worker was built without the `libvirt` feature (cargo build --features \
         squadron/libvirt, after installing libvirt-dev)"
            .into(),
    )
}
