//! Durations and byte sizes as written in manifests (being written).
