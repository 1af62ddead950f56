//! Task manifests: parsing and validation (being written).
