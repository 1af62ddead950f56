//! The destinations a `gateway` sandbox may reach through the worker's proxy: the worker's
//! `--gateway-allow` entries. An entry is a domain (`api.anthropic.com`), every subdomain of
//! one (`*.github.com`, which does not match `github.com` itself), or an IPv4 network
//! (`203.0.113.0/24`) for destinations given by address. Matching is by exact label
//! comparison: a hand-written suffix test, because glob crates match paths and characters,
//! not DNS labels (`*.example.com` must not match `evilexample.com`).

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::error::WorkerError;

/// Most entries of an allow list.
pub(crate) const GATEWAY_ALLOW_ENTRIES_MAX: usize = 1024;
/// Longest domain name (RFC 1035).
pub(crate) const DOMAIN_BYTES_MAX: usize = 253;
/// Longest label of a domain name.
const LABEL_BYTES_MAX: usize = 63;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// This name only.
    Domain(String),
    /// Every name ending in `.suffix`.
    Subdomains(String),
    Network(Ipv4Net),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AllowList {
    entries: Vec<Entry>,
}

impl AllowList {
    /// Parses the worker's entries; a bad one is refused naming `gateway_allow`.
    pub(crate) fn parse(items: &[String]) -> Result<AllowList, WorkerError> {
        if items.len() > GATEWAY_ALLOW_ENTRIES_MAX {
            return Err(invalid(format!(
                "{} entries, at most {GATEWAY_ALLOW_ENTRIES_MAX}",
                items.len()
            )));
        }
        let entries = items
            .iter()
            .map(|item| parse_entry(item.trim()))
            .collect::<Result<_, _>>()?;
        Ok(AllowList { entries })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a CONNECT to `host` (a name as the client sent it, or an IPv4 literal) is
    /// allowed by name. A name still has to resolve to an address no sandbox may be denied.
    pub(crate) fn allows(&self, host: &str) -> bool {
        if let Ok(ip) = host.parse::<Ipv4Addr>() {
            return self
                .entries
                .iter()
                .any(|e| matches!(e, Entry::Network(n) if n.contains(&ip)));
        }
        let Ok(name) = normalise(host) else {
            return false;
        };
        self.entries.iter().any(|e| match e {
            Entry::Domain(d) => *d == name,
            Entry::Subdomains(s) => name
                .strip_suffix(s.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            Entry::Network(_) => false,
        })
    }
}

fn parse_entry(item: &str) -> Result<Entry, WorkerError> {
    if item.contains('/') {
        let net: Ipv4Net = item
            .parse()
            .map_err(|e| invalid(format!("{item:?} is not an IPv4 network (a.b.c.d/n): {e}")))?;
        return Ok(Entry::Network(net.trunc()));
    }
    if let Ok(ip) = item.parse::<Ipv4Addr>() {
        return Ok(Entry::Network(Ipv4Net::from(ip)));
    }
    match item.strip_prefix("*.") {
        Some(rest) => Ok(Entry::Subdomains(normalise(rest).map_err(invalid)?)),
        None => Ok(Entry::Domain(normalise(item).map_err(invalid)?)),
    }
}

/// A domain name in lower case without a trailing dot, or why it is not one.
pub(crate) fn normalise(name: &str) -> Result<String, String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    if name.is_empty() || name.len() > DOMAIN_BYTES_MAX {
        return Err(format!(
            "{name:?} is not a domain name (1..={DOMAIN_BYTES_MAX} bytes)"
        ));
    }
    let label_ok = |l: &str| {
        (1..=LABEL_BYTES_MAX).contains(&l.len())
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if !name.split('.').all(label_ok) {
        return Err(format!(
            "{name:?} is not a domain name (labels of letters, digits and inner hyphens)"
        ));
    }
    Ok(name)
}

fn invalid(message: String) -> WorkerError {
    WorkerError::Invalid {
        field: "gateway_allow".to_owned(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> AllowList {
        AllowList::parse(&items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn domains_match_by_whole_labels() {
        let l = list(&["api.anthropic.com", "*.github.com"]);
        assert!(l.allows("api.anthropic.com"));
        assert!(l.allows("API.Anthropic.com."));
        assert!(!l.allows("anthropic.com"));
        assert!(!l.allows("evilapi.anthropic.com"));
        assert!(!l.allows("api.anthropic.com.evil.net"));
        assert!(l.allows("codeload.github.com"));
        assert!(l.allows("a.b.github.com"));
        assert!(!l.allows("github.com"), "*. is strictly below the domain");
        assert!(!l.allows("evilgithub.com"));
        assert!(!l.allows(".github.com"));
        assert!(!l.allows(""));
        assert!(!l.allows("bad_name.github.com"));
    }

    #[test]
    fn addresses_match_networks_only() {
        let l = list(&["100.100.200.0/24", "203.0.113.7", "example.com"]);
        assert!(l.allows("100.100.200.9"));
        assert!(l.allows("203.0.113.7"));
        assert!(!l.allows("203.0.113.8"));
        assert!(!l.allows("100.100.201.1"));
    }

    #[test]
    fn a_bad_entry_is_refused_naming_the_field() {
        for bad in [
            "",
            "*.",
            "exa mple.com",
            "-x.com",
            "10.0.0.0/33",
            "*.*.x.com",
            "a..b",
        ] {
            let e = AllowList::parse(&[bad.to_owned()]).unwrap_err();
            assert!(e.to_string().contains("gateway_allow"), "{bad:?}: {e}");
        }
        let many = vec!["x.com".to_owned(); GATEWAY_ALLOW_ENTRIES_MAX + 1];
        assert!(AllowList::parse(&many).is_err());
        assert!(AllowList::parse(&[]).unwrap().is_empty());
    }
}
