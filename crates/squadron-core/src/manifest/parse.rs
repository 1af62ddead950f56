//! Parsing a YAML or JSON document into a spec, with errors that name the field by its path.
//!
//! YAML is read by `yaml_serde`, serde_yaml's successor maintained by the YAML organization
//! (serde_yaml 0.9 is archived). It is serde_yaml's code base, so errors read and name paths as
//! before and its limits (nesting, alias repetition) stay; we chose it over `serde_yaml_ng` and
//! `serde_norway` (forks by single maintainers, quiet since 2025 and 2024) and over
//! `serde-saphyr` (a new API and error format, and a newer Rust than this workspace's). Its
//! alias limit still lets a quadratic expansion through, so `yaml_budget` adds a node budget.

use super::raw::RawManifest;
use super::spec::TaskSpec;
use super::yaml_budget::check_yaml_budget;
use crate::limits::MANIFEST_BYTES_MAX;
use crate::validation_error::ValidationError;

/// Parses and validates a YAML manifest.
pub fn parse_manifest_yaml(text: &str) -> Result<TaskSpec, ValidationError> {
    check_manifest_size(text)?;
    check_yaml_budget(text)
        .map_err(|overrun| ValidationError::new(MANIFEST_FIELD, overrun.to_string()))?;
    let de = yaml_serde::Deserializer::from_str(text);
    let raw: RawManifest = serde_path_to_error::deserialize(de)
        .map_err(|e| from_serde(e.path(), &e.inner().to_string()))?;
    raw.into_spec()
}

/// Parses and validates a JSON manifest.
pub fn parse_manifest_json(text: &str) -> Result<TaskSpec, ValidationError> {
    check_manifest_size(text)?;
    let mut de = serde_json::Deserializer::from_str(text);
    let raw: RawManifest = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| from_serde(e.path(), &e.inner().to_string()))?;
    de.end()
        .map_err(|e| ValidationError::new(MANIFEST_FIELD, e.to_string()))?;
    raw.into_spec()
}

/// The field named by errors about the document as a whole.
const MANIFEST_FIELD: &str = "manifest";

fn check_manifest_size(text: &str) -> Result<(), ValidationError> {
    if text.len() > MANIFEST_BYTES_MAX {
        return Err(ValidationError::new(
            MANIFEST_FIELD,
            format!(
                "must be at most {MANIFEST_BYTES_MAX} bytes, got {}",
                text.len()
            ),
        ));
    }
    Ok(())
}

/// Turns a decoding error into a `ValidationError` naming the offending path.
fn from_serde(path: &serde_path_to_error::Path, message: &str) -> ValidationError {
    let path = path.to_string();
    let path = if path == "." { String::new() } else { path };
    // yaml_serde prefixes its own copy of the path (sometimes the parent's); the field
    // already carries it.
    let message = match message.split_once(": ") {
        Some((head, rest))
            if path == head
                || path.starts_with(&format!("{head}."))
                || path.starts_with(&format!("{head}[")) =>
        {
            rest
        }
        _ => message,
    };
    // Missing and duplicate fields are reported against their parent; name the field instead.
    for (prefix, reason) in [
        ("missing field `", "is required"),
        ("duplicate field `", "is given more than once"),
    ] {
        if let Some((name, tail)) = message
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_once('`'))
        {
            let field = if path.is_empty() {
                name.to_string()
            } else {
                format!("{path}.{name}")
            };
            return ValidationError::new(field, format!("{reason}{tail}"));
        }
    }
    let field = if path.is_empty() {
        MANIFEST_FIELD.to_string()
    } else {
        path
    };
    ValidationError::new(field, message)
}
