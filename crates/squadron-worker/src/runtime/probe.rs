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
                let connected = match config.egress_deny_networks() {
                    Ok(deny) => {
                        dc.network.deny = deny;
                        DockerRuntime::connect(dc).await
                    }
                    Err(e) => Err(e),
                };
                match connected {
                    Ok(r) => {
                        ready.insert(r.kind(), Arc::new(r));
                    }
                    Err(e) => unavailable.push((RuntimeKind::Docker, e.to_string())),
                }
            }
            RuntimeKind::Kvm => unavailable.push((
                RuntimeKind::Kvm,
                "the KVM runtime is not built into this worker yet".into(),
            )),
        }
    }
    (ready, unavailable)
}
