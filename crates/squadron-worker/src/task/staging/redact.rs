//! The repository URL never reaches a message: every spelling of it in git's messages is
//! replaced, and any user information left in a URL is blanked.

use super::{CLONE_ERROR_BYTES_MAX, URL_PLACEHOLDER};
use crate::support::truncate_at_char;

/// Replaces every spelling of `url` in a git message, and any `user:password@` left in a URL
/// git may have rebuilt, so messages can be logged and stored.
pub(crate) fn redact_url(message: &str, url: &str) -> String {
    let mut needles = vec![url.to_string()];
    if let Some(path) = url.strip_prefix("file://") {
        needles.push(path.to_string());
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        if let Some((userinfo, host_path)) = rest.split_once('@') {
            if !userinfo.contains('/') {
                needles.push(format!("{scheme}://{host_path}"));
                needles.push(host_path.to_string());
            }
        }
    }
    let trimmed: Vec<String> = needles
        .iter()
        .filter_map(|n| n.strip_suffix('/').map(str::to_string))
        .collect();
    needles.extend(trimmed);
    needles.retain(|n| n.len() >= 2);
    needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let mut out = message.to_string();
    for needle in &needles {
        out = out.replace(needle.as_str(), URL_PLACEHOLDER);
    }
    truncate_at_char(&scrub_userinfo(&out), CLONE_ERROR_BYTES_MAX).to_string()
}

/// Blanks the user information of every `scheme://user:secret@host` in `text`.
fn scrub_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end = tail
            .find(|c: char| c == '/' || c.is_whitespace() || c == '\'' || c == '"')
            .unwrap_or(tail.len());
        match tail[..authority_end].rfind('@') {
            Some(userinfo_end) => {
                out.push_str("***");
                rest = &tail[userinfo_end..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}
