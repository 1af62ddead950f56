//! The worker's policy on the wire: the core's [`WorkerPolicy`] to its protobuf message and
//! back; an unknown keyword is refused naming its path (`policy.network_modes[1]`).

use squadron_core::manifest::{Keyword, NetworkMode};
use squadron_core::worker_policy::{RepositorySource, WorkerPolicy};

use crate::conversion_error::{refused, ConversionError};
use crate::task_spec::keyword;
use crate::v1 as pb;

/// The root of every path an error names.
const ROOT: &str = "policy";

impl From<&WorkerPolicy> for pb::WorkerPolicy {
    fn from(p: &WorkerPolicy) -> Self {
        pb::WorkerPolicy {
            network_modes: p
                .network_modes
                .iter()
                .map(|m| m.as_str().to_owned())
                .collect(),
            full_control: p.full_control,
            repository_sources: p
                .repository_sources
                .iter()
                .map(|s| s.name().to_owned())
                .collect(),
            cpus_max: p.cpus_max,
            memory_bytes_max: p.memory_bytes_max,
            disk_bytes_max: p.disk_bytes_max,
        }
    }
}

impl TryFrom<pb::WorkerPolicy> for WorkerPolicy {
    type Error = ConversionError;

    fn try_from(p: pb::WorkerPolicy) -> Result<Self, ConversionError> {
        let network_modes = p
            .network_modes
            .iter()
            .enumerate()
            .map(|(i, m)| keyword::<NetworkMode>(&format!("{ROOT}.network_modes[{i}]"), m))
            .collect::<Result<_, _>>()?;
        let repository_sources = p
            .repository_sources
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let field = format!("{ROOT}.repository_sources[{i}]");
                s.parse::<RepositorySource>().map_err(refused(&field))
            })
            .collect::<Result<_, _>>()?;
        Ok(WorkerPolicy {
            network_modes,
            full_control: p.full_control,
            repository_sources,
            cpus_max: p.cpus_max,
            memory_bytes_max: p.memory_bytes_max,
            disk_bytes_max: p.disk_bytes_max,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn policy() -> impl Strategy<Value = WorkerPolicy> {
        let modes = proptest::sample::subsequence(NetworkMode::ALL.to_vec(), 0..=3);
        let sources = proptest::sample::subsequence(RepositorySource::ALL.to_vec(), 0..=5);
        (
            modes,
            any::<bool>(),
            sources,
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>()),
        )
            .prop_map(
                |(modes, full_control, sources, cpus, memory, disk)| WorkerPolicy {
                    network_modes: BTreeSet::from_iter(modes),
                    full_control,
                    repository_sources: BTreeSet::from_iter(sources),
                    cpus_max: cpus,
                    memory_bytes_max: memory,
                    disk_bytes_max: disk,
                },
            )
    }

    proptest! {
        #[test]
        fn any_policy_round_trips_through_protobuf_unchanged(p in policy()) {
            let wire = prost::Message::encode_to_vec(&pb::WorkerPolicy::from(&p));
            let decoded: pb::WorkerPolicy = prost::Message::decode(wire.as_slice()).unwrap();
            prop_assert_eq!(WorkerPolicy::try_from(decoded), Ok(p));
        }
    }

    #[test]
    fn an_unknown_keyword_is_refused_naming_its_place() {
        let mut p = pb::WorkerPolicy::from(&WorkerPolicy::default());
        p.network_modes.push("host".into());
        let e = WorkerPolicy::try_from(p).unwrap_err();
        assert_eq!(e.field(), "policy.network_modes[2]", "{e}");
        assert!(
            e.to_string().contains(r#"unknown network_mode "host""#),
            "{e}"
        );
        let mut p = pb::WorkerPolicy::from(&WorkerPolicy::default());
        p.repository_sources.insert(0, "ftp".into());
        let e = WorkerPolicy::try_from(p).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"policy.repository_sources[0]: unknown repository source "ftp"; expected one of https, http, ssh, git, local"#
        );
    }
}
