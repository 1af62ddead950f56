//! Field checks. Each takes the field path relative to its section; callers add the parent with
//! `ValidationError::within`.

use std::collections::BTreeMap;
use std::fmt;

use crate::limits::{
    GIT_BRANCH_BYTES_MAX, GIT_COMMIT_DIGITS_MAX, GIT_COMMIT_DIGITS_MIN, LABELS_MAX,
    LABEL_KEY_BYTES_MAX, LABEL_VALUE_BYTES_MAX, REPO_URL_BYTES_MAX, WORKDIR_BYTES_MAX,
};
use crate::quantity::{format_byte_size, format_duration_ms};
use crate::validation_error::ValidationError;

pub(super) fn check_len(field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
    if value.len() > max {
        return Err(ValidationError::new(
            field,
            format!("must be at most {max} bytes, got {}", value.len()),
        ));
    }
    Ok(())
}

pub(super) fn check_count(field: &str, count: usize, max: usize) -> Result<(), ValidationError> {
    if count > max {
        return Err(ValidationError::new(
            field,
            format!("must have at most {max} entries, got {count}"),
        ));
    }
    Ok(())
}

pub(super) fn check_range<T: PartialOrd + fmt::Display>(
    field: &str,
    value: T,
    min: T,
    max: T,
) -> Result<(), ValidationError> {
    if value < min || value > max {
        return Err(ValidationError::new(
            field,
            format!("must be between {min} and {max}, got {value}"),
        ));
    }
    Ok(())
}

pub(super) fn check_duration_range(
    field: &str,
    ms: u64,
    min: u64,
    max: u64,
) -> Result<(), ValidationError> {
    if ms < min || ms > max {
        return Err(ValidationError::new(
            field,
            format!(
                "must be between {} and {}, got {}",
                format_duration_ms(min),
                format_duration_ms(max),
                format_duration_ms(ms)
            ),
        ));
    }
    Ok(())
}

pub(super) fn check_size_range(
    field: &str,
    bytes: u64,
    min: u64,
    max: u64,
) -> Result<(), ValidationError> {
    if bytes < min || bytes > max {
        return Err(ValidationError::new(
            field,
            format!(
                "must be between {} and {} (1024-based), got {}",
                format_byte_size(min),
                format_byte_size(max),
                format_byte_size(bytes)
            ),
        ));
    }
    Ok(())
}

/// Free text shown to humans: non-blank, bounded, no control characters.
pub(super) fn check_text(field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
    if value.trim().is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    check_len(field, value, max)?;
    if let Some(bad) = value.chars().find(|c| c.is_control()) {
        return Err(ValidationError::new(
            field,
            format!("must not contain control characters, found {bad:?}"),
        ));
    }
    Ok(())
}

/// A single printable ASCII word: model names, tool names.
pub(super) fn check_token(field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    check_len(field, value, max)?;
    if let Some(bad) = value.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(ValidationError::new(
            field,
            format!("may contain only printable ASCII without spaces, found {bad:?}"),
        ));
    }
    Ok(())
}

pub(super) fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), ValidationError> {
    check_count("labels", labels.len(), LABELS_MAX)?;
    for (key, value) in labels {
        if key.is_empty() || key.len() > LABEL_KEY_BYTES_MAX {
            return Err(ValidationError::new(
                "labels",
                format!("key {key:?} must be 1 to {LABEL_KEY_BYTES_MAX} bytes"),
            ));
        }
        if let Some(bad) = key
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-')))
        {
            return Err(ValidationError::new(
                "labels",
                format!("key {key:?} may contain only A-Z, a-z, 0-9, '.', '_', '/' and '-', found {bad:?}"),
            ));
        }
        let field = format!("labels.{key}");
        check_len(&field, value, LABEL_VALUE_BYTES_MAX)?;
        if let Some(bad) = value.chars().find(|c| c.is_control()) {
            return Err(ValidationError::new(
                field,
                format!("must not contain control characters, found {bad:?}"),
            ));
        }
    }
    Ok(())
}

const URL_FORMS: &str = "expected an https://, http://, ssh://, git:// or file:// URL, \
     an absolute local path, or user@host:path";

pub fn check_repo_url(field: &str, url: &str) -> Result<(), ValidationError> {
    if url.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    check_len(field, url, REPO_URL_BYTES_MAX)?;
    if let Some(bad) = url.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(ValidationError::new(
            field,
            format!("must not contain whitespace or control characters, found {bad:?}"),
        ));
    }
    if url.starts_with('/') {
        return Ok(());
    }
    match url.split_once("://") {
        Some((scheme, rest)) => check_scheme_url(field, &scheme.to_ascii_lowercase(), rest),
        None => check_scp_like_url(field, url),
    }
}

fn credentials_in_url(field: &str) -> ValidationError {
    ValidationError::new(
        field,
        "must not carry credentials; reference them in startup_profile.credential_refs \
         so secrets never enter task records",
    )
}

/// git hands hosts and users to ssh as arguments; a leading '-' would become an option.
fn option_like_url(field: &str) -> ValidationError {
    ValidationError::new(field, "host and user must not start with '-'")
}

/// `scheme://[user@]host/path`, `rest` being what follows `://`.
fn check_scheme_url(field: &str, scheme: &str, rest: &str) -> Result<(), ValidationError> {
    if !matches!(scheme, "https" | "http" | "ssh" | "git" | "file") {
        return Err(ValidationError::new(
            field,
            format!("unsupported scheme {scheme:?}; {URL_FORMS}"),
        ));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            // A user name alone is how ssh names its account, but over http it is where
            // access tokens go (`https://TOKEN@host`), so http refuses any user info.
            if userinfo.contains(':') || scheme.starts_with("http") {
                return Err(credentials_in_url(field));
            }
            host
        }
        None => authority,
    };
    if host.is_empty() && scheme != "file" {
        return Err(ValidationError::new(
            field,
            format!("has no host; {URL_FORMS}"),
        ));
    }
    if host.starts_with('-') {
        return Err(option_like_url(field));
    }
    if rest.len() == authority.len() && scheme == "file" {
        return Err(ValidationError::new(
            field,
            format!("has no path; {URL_FORMS}"),
        ));
    }
    Ok(())
}

/// scp-like `user@host:path`.
fn check_scp_like_url(field: &str, url: &str) -> Result<(), ValidationError> {
    if let Some((userinfo, _)) = url.split_once('@') {
        if userinfo.contains(':') {
            return Err(credentials_in_url(field));
        }
    }
    let (user, host) = url
        .split_once(':')
        .filter(|(left, path)| !left.contains('/') && !path.is_empty())
        .and_then(|(left, _)| left.split_once('@'))
        .filter(|(user, host)| !user.is_empty() && !host.is_empty())
        .ok_or_else(|| {
            // The text is not echoed: an unrecognized form may still hold a token.
            ValidationError::new(
                field,
                format!("is not a recognized repository location; {URL_FORMS}"),
            )
        })?;
    if user.starts_with('-') || host.starts_with('-') {
        return Err(option_like_url(field));
    }
    Ok(())
}

/// Git's ref-name rules (`git check-ref-format`), applied to a branch name.
pub(super) fn check_branch(field: &str, branch: &str) -> Result<(), ValidationError> {
    let bad = |why: &str| {
        ValidationError::new(
            field,
            format!("{branch:?} is not a valid branch name: {why}"),
        )
    };
    if branch.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    check_len(field, branch, GIT_BRANCH_BYTES_MAX)?;
    if let Some(c) = branch
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || "~^:?*[\\".contains(*c))
    {
        return Err(bad(&format!(
            "must not contain whitespace, control characters or any of ~^:?*[\\, found {c:?}"
        )));
    }
    if branch.starts_with('-') {
        return Err(bad("must not start with '-'"));
    }
    if branch.contains("..") {
        return Err(bad("must not contain '..'"));
    }
    if branch.contains("@{") || branch == "@" {
        return Err(bad("must not be '@' or contain '@{'"));
    }
    if branch.ends_with('.') {
        return Err(bad("must not end with '.'"));
    }
    for component in branch.split('/') {
        if component.is_empty() {
            return Err(bad("must not start or end with '/' or contain '//'"));
        }
        if component.starts_with('.') {
            return Err(bad("no '/'-separated part may start with '.'"));
        }
        if component.ends_with(".lock") {
            return Err(bad("no '/'-separated part may end with '.lock'"));
        }
    }
    Ok(())
}

pub(super) fn check_commit(field: &str, commit: &str) -> Result<(), ValidationError> {
    let len_ok = (GIT_COMMIT_DIGITS_MIN..=GIT_COMMIT_DIGITS_MAX).contains(&commit.len());
    if !len_ok || !commit.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(ValidationError::new(
            field,
            format!(
                "must be {GIT_COMMIT_DIGITS_MIN} to {GIT_COMMIT_DIGITS_MAX} hex digits, got {commit:?}"
            ),
        ));
    }
    Ok(())
}

/// A path inside the repository or the outbox: relative and unable to climb out with `..`.
pub(super) fn check_relative_path(
    field: &str,
    path: &str,
    max: usize,
) -> Result<(), ValidationError> {
    if path.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    check_len(field, path, max)?;
    if let Some(bad) = path.chars().find(|c| c.is_control()) {
        return Err(ValidationError::new(
            field,
            format!("must not contain control characters, found {bad:?}"),
        ));
    }
    if path.starts_with('/') {
        return Err(ValidationError::new(
            field,
            format!("must be a relative path, got {path:?}"),
        ));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(ValidationError::new(
            field,
            format!("must not contain a '..' segment, got {path:?}"),
        ));
    }
    Ok(())
}

pub(super) fn check_workdir(field: &str, path: &str) -> Result<(), ValidationError> {
    check_len(field, path, WORKDIR_BYTES_MAX)?;
    if !path.starts_with('/') {
        return Err(ValidationError::new(
            field,
            format!("must be an absolute path, got {path:?}"),
        ));
    }
    if let Some(bad) = path.chars().find(|c| c.is_control()) {
        return Err(ValidationError::new(
            field,
            format!("must not contain control characters, found {bad:?}"),
        ));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(ValidationError::new(
            field,
            format!("must not contain a '..' segment, got {path:?}"),
        ));
    }
    Ok(())
}
