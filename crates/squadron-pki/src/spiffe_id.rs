//! Who a certificate speaks for: a SPIFFE URI in the certificate's subject alternative names.
//! The identity is the only thing the control plane believes about a caller holding a
//! certificate — never a field of the request (DESIGN §5).

use std::fmt;
use std::str::FromStr;

use squadron_core::ids::WorkerId;

use crate::error::PkiError;

/// The trust domain of every Squadron identity.
pub const TRUST_DOMAIN: &str = "squadron.local";
/// Longest identity accepted when parsing (a URI SAN is attacker-supplied until verified).
pub const SPIFFE_ID_BYTES_MAX: usize = 256;

/// What an agent certificate is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AgentSubject {
    /// The agent of one dedicated task: `agent/task-{id}`.
    Task(u64),
    /// One generation of a profile's writer: `agent/profile-{id}-g{generation}`.
    ProfileGeneration { profile: u64, generation: u64 },
}

/// A Squadron identity, `spiffe://squadron.local/{kind}/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SpiffeId {
    /// A control node: `node/{id}`.
    Node(u64),
    /// A worker: `worker/{id}`.
    Worker(WorkerId),
    /// An agent inside a sandbox.
    Agent(AgentSubject),
}

impl SpiffeId {
    /// The URI that goes into the certificate.
    pub fn uri(&self) -> String {
        self.to_string()
    }

    pub fn is_node(&self) -> bool {
        matches!(self, SpiffeId::Node(_))
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spiffe://{TRUST_DOMAIN}/")?;
        match self {
            SpiffeId::Node(id) => write!(f, "node/{id}"),
            SpiffeId::Worker(id) => write!(f, "worker/{id}"),
            SpiffeId::Agent(AgentSubject::Task(id)) => write!(f, "agent/task-{id}"),
            SpiffeId::Agent(AgentSubject::ProfileGeneration {
                profile,
                generation,
            }) => write!(f, "agent/profile-{profile}-g{generation}"),
        }
    }
}

impl FromStr for SpiffeId {
    type Err = PkiError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| PkiError::Identity(format!("{why}: {:?}", truncate(s)));
        if s.len() > SPIFFE_ID_BYTES_MAX {
            return Err(bad("identity too long"));
        }
        let rest = s
            .strip_prefix("spiffe://")
            .and_then(|r| r.strip_prefix(TRUST_DOMAIN))
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(|| bad("not an identity of this trust domain"))?;
        let (kind, name) = rest
            .split_once('/')
            .ok_or_else(|| bad("identity has no kind"))?;
        match kind {
            "node" => parse_u64(name)
                .filter(|id| *id > 0)
                .map(SpiffeId::Node)
                .ok_or_else(|| bad("node id must be a positive integer")),
            "worker" => WorkerId::new(name)
                .map(SpiffeId::Worker)
                .map_err(|e| PkiError::Identity(e.to_string())),
            "agent" => parse_agent(name)
                .map(SpiffeId::Agent)
                .ok_or_else(|| bad("agent identity must be task-{id} or profile-{id}-g{n}")),
            _ => Err(bad("unknown identity kind")),
        }
    }
}

fn parse_agent(name: &str) -> Option<AgentSubject> {
    if let Some(id) = name.strip_prefix("task-") {
        return parse_u64(id).map(AgentSubject::Task);
    }
    let rest = name.strip_prefix("profile-")?;
    let (profile, generation) = rest.split_once("-g")?;
    Some(AgentSubject::ProfileGeneration {
        profile: parse_u64(profile)?,
        generation: parse_u64(generation)?,
    })
}

/// Digits only: `u64::from_str` also takes a leading `+`, which would give one identity two
/// spellings.
fn parse_u64(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return None;
    }
    s.parse().ok()
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_round_trip() {
        let ids = [
            SpiffeId::Node(3),
            SpiffeId::Worker(WorkerId::new("w-1.a_b").unwrap()),
            SpiffeId::Agent(AgentSubject::Task(42)),
            SpiffeId::Agent(AgentSubject::ProfileGeneration {
                profile: 7,
                generation: 12,
            }),
        ];
        for id in ids {
            let text = id.to_string();
            assert!(text.starts_with("spiffe://squadron.local/"), "{text}");
            assert_eq!(text.parse::<SpiffeId>().unwrap(), id);
        }
        assert_eq!(
            SpiffeId::Agent(AgentSubject::ProfileGeneration {
                profile: 7,
                generation: 12
            })
            .to_string(),
            "spiffe://squadron.local/agent/profile-7-g12"
        );
    }

    #[test]
    fn foreign_and_malformed_identities_are_refused() {
        for bad in [
            "",
            "spiffe://example.org/node/1",
            "spiffe://squadron.local/node/0",
            "spiffe://squadron.local/node/+1",
            "spiffe://squadron.local/node/01",
            "spiffe://squadron.local/node/x",
            "spiffe://squadron.local/node",
            "spiffe://squadron.local/admin/1",
            "spiffe://squadron.local/worker/",
            "spiffe://squadron.local/worker/UPPER",
            "spiffe://squadron.local/worker/a/b",
            "spiffe://squadron.local/agent/task-",
            "spiffe://squadron.local/agent/profile-1",
            "spiffe://squadron.local/agent/profile-1-gx",
            "https://squadron.local/node/1",
        ] {
            assert!(bad.parse::<SpiffeId>().is_err(), "{bad:?} was accepted");
        }
        let long = format!("spiffe://squadron.local/worker/{}", "a".repeat(300));
        assert!(long.parse::<SpiffeId>().is_err());
    }
}
