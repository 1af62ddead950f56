//! Which runtimes this host can offer. A runtime asked for but not available is left out with
//! the reason (no bubblewrap, no cgroup v2, no Docker engine or image), so an operator sees at
//! start why a worker offers less than asked.

use std::collections::BTreeMap;
use std::sync::Arc;

use squadron_core::manifest::RuntimeKind;

use crate::config::WorkerConfig;
use crate::docker_runtime::{DockerConfig, DockerRuntime};
use crate::process_runtime::{ProcessRuntime, ProcessRuntimeConfig};
use crate::runtime::Runtime;

pub type RuntimeSet = BTreeMap<RuntimeKind, Arc<dyn Runtime>>;

/// The runtimes of `config.runtimes` this host can run, and why the others cannot.
pub async fn probe_runtimes(config: &WorkerConfig) -> (RuntimeSet, Vec<(RuntimeKind, String)>) {
    let mut ready: RuntimeSet = BTreeMap::new();
    let mut unavailable = Vec::new();
    for kind in &config.runtimes {
        match kind {
            RuntimeKind::Process => {
                let mut pc = ProcessRuntimeConfig::new(config.id.to_string());
                if let Some(root) = &config.cgroup_root {
                    pc.cgroup.v2_base = Some(root.join("squadron"));
                }
                match ProcessRuntime::new(pc) {
                    Ok(r) => {
                        ready.insert(RuntimeKind::Process, Arc::new(r));
                    }
                    Err(e) => unavailable.push((RuntimeKind::Process, e.to_string())),
                }
            }
            RuntimeKind::Docker => {
                let mut dc = DockerConfig::new(config.id.clone());
                dc.image = config.docker_image.clone();
                dc.global_dir = config.global_dir.clone();
                match DockerRuntime::connect(dc).await {
                    Ok(r) => {
                        ready.insert(RuntimeKind::Docker, Arc::new(r));
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
