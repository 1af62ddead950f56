//! Egress injection (issue 14 item 8): a credential an admin binds to one upstream API never
//! enters a sandbox. The sandbox gets a base URL on its own loopback and a placeholder key;
//! the worker's proxy swaps the placeholder for the value in `header` and forwards to
//! `upstream` over TLS. The upstream is the admin's choice, never the submitter's: a
//! submitter who could name it could send the value anywhere.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::limits::{
    EGRESS_HEADER_BYTES_MAX, EGRESS_UPSTREAM_BYTES_MAX, EGRESS_VALUE_PREFIX_BYTES_MAX,
};
use crate::rejection::Rejection;

/// Where, and in which header, a credential's value may be sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EgressBinding {
    /// `https://host[:port][/base path]`: requests to the sandbox's base URL go here, with
    /// their path appended.
    pub upstream: String,
    /// The request header that carries the value (`x-api-key`, `authorization`), lower case.
    pub header: String,
    /// Text in front of the value in that header (`Bearer `); often empty.
    pub value_prefix: String,
}

/// Headers the proxy owns or that describe the connection, never a credential's header.
const RESERVED_HEADERS: [&str; 9] = [
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "keep-alive",
    "proxy-authorization",
];

impl EgressBinding {
    /// Checks the binding's shape; `field` names it in the refusal (`egress`).
    pub fn check(&self, field: &str) -> Result<(), Rejection> {
        check_upstream(&format!("{field}.upstream"), &self.upstream)?;
        check_header(&format!("{field}.header"), &self.header)?;
        let prefix = &self.value_prefix;
        if prefix.len() > EGRESS_VALUE_PREFIX_BYTES_MAX
            || !prefix.bytes().all(|b| (0x20..0x7f).contains(&b))
        {
            return Err(Rejection::invalid(
                format!("{field}.value_prefix"),
                format!(
                    "must be at most {EGRESS_VALUE_PREFIX_BYTES_MAX} printable ASCII characters"
                ),
            ));
        }
        Ok(())
    }
}

fn check_upstream(field: &str, url: &str) -> Result<(), Rejection> {
    let bad = |why: &str| Err(Rejection::invalid(field, format!("{why}, got {url:?}")));
    if url.len() > EGRESS_UPSTREAM_BYTES_MAX {
        return bad(&format!(
            "must be at most {EGRESS_UPSTREAM_BYTES_MAX} bytes"
        ));
    }
    let Some(rest) = url.strip_prefix("https://") else {
        return bad("must be an https:// URL: the value travels only over TLS");
    };
    if url.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
        return bad("must be printable ASCII without spaces");
    }
    if url.contains(['?', '#']) {
        return bad("must not carry a query or a fragment");
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return bad("must not carry a user name or password");
    }
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    if host.is_empty() {
        return bad("must name a host");
    }
    Ok(())
}

fn check_header(field: &str, header: &str) -> Result<(), Rejection> {
    let shape = !header.is_empty()
        && header.len() <= EGRESS_HEADER_BYTES_MAX
        && header
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !shape {
        return Err(Rejection::invalid(
            field,
            format!(
                "must be 1 to {EGRESS_HEADER_BYTES_MAX} characters of a-z, 0-9 and '-', got \
                 {header:?}"
            ),
        ));
    }
    if RESERVED_HEADERS.contains(&header) {
        return Err(Rejection::invalid(
            field,
            format!("{header} describes the connection and cannot carry a credential"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(upstream: &str, header: &str, prefix: &str) -> EgressBinding {
        EgressBinding {
            upstream: upstream.into(),
            header: header.into(),
            value_prefix: prefix.into(),
        }
    }

    fn field_of(b: &EgressBinding) -> Option<String> {
        match b.check("egress") {
            Ok(()) => None,
            Err(Rejection::Invalid(e)) => Some(e.field),
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_binding_is_https_a_plain_header_and_a_printable_prefix() {
        for ok in [
            binding("https://api.anthropic.com", "x-api-key", ""),
            binding("https://10.0.0.1:8443/v1", "authorization", "Bearer "),
        ] {
            assert_eq!(field_of(&ok), None, "{ok:?}");
        }
        let up = Some("egress.upstream".to_string());
        for url in [
            "http://api.example.com",
            "https://",
            "https://:443/x",
            "https://user:pw@api.example.com",
            "https://api.example.com/?q=1",
            "https://api.example.com/#x",
            "https://api.example.com/a b",
        ] {
            assert_eq!(field_of(&binding(url, "x-api-key", "")), up, "{url}");
        }
        let long = format!("https://{}", "a".repeat(EGRESS_UPSTREAM_BYTES_MAX));
        assert_eq!(field_of(&binding(&long, "x-api-key", "")), up);
        let header = Some("egress.header".to_string());
        for h in ["", "X-Api-Key", "x api", "host", "content-length", "a:b"] {
            assert_eq!(field_of(&binding("https://a.b", h, "")), header, "{h:?}");
        }
        let prefix = Some("egress.value_prefix".to_string());
        for p in [
            "Bearer\n",
            "\u{e9}",
            &"x".repeat(EGRESS_VALUE_PREFIX_BYTES_MAX + 1),
        ] {
            assert_eq!(field_of(&binding("https://a.b", "x", p)), prefix, "{p:?}");
        }
    }
}
