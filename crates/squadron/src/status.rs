//! `squadron cluster status`: asks every given endpoint and every member the first answering
//! node lists for its own view (a stale read, so a node without a leader still answers), and
//! puts the answers together.

use serde::{Deserialize, Serialize};
use squadron_client::{normalize_endpoint, ClusterStatus, Consistency, MemberView, SquadronClient};

use crate::output::{short, Table};

/// The cluster as its nodes see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The leader reported at the highest term any reachable node is in.
    pub leader: Option<u64>,
    /// The highest term any reachable node is in.
    pub term: u64,
    pub nodes: Vec<NodeView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    /// The node id: its own answer, or the member list's id for its address.
    pub id: Option<u64>,
    pub role: Option<String>,
    pub term: Option<u64>,
    pub applied: Option<u64>,
    pub last_log_index: Option<u64>,
    pub digest: Option<String>,
    /// The node's REST `host:port`.
    pub rest: String,
    /// Whether the member list names it a voter (`None` when it is not in the list).
    pub voter: Option<bool>,
    /// The leader this node knows.
    pub leader: Option<u64>,
    pub reachable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One node asked: its address and its answer.
#[derive(Debug, Clone)]
pub struct Probe {
    /// REST `host:port` (no scheme).
    pub rest: String,
    pub answer: Result<ClusterStatus, String>,
}

/// `http://127.0.0.1:8211/` → `127.0.0.1:8211`, so endpoints and member addresses compare.
pub fn addr_key(endpoint: &str) -> String {
    let url = normalize_endpoint(endpoint);
    match url.split_once("://") {
        Some((_, rest)) => rest.to_string(),
        None => url,
    }
}

/// Puts the answers together. `probes` are in the order asked (the given endpoints first);
/// the member list is the first answering node's.
pub fn assemble(probes: &[Probe]) -> ClusterView {
    let members: Vec<MemberView> = probes
        .iter()
        .find_map(|p| p.answer.as_ref().ok())
        .map(|s| s.members.clone())
        .unwrap_or_default();
    let member_by_addr = |rest: &str| members.iter().find(|m| addr_key(&m.rest) == rest);

    let mut nodes: Vec<NodeView> = Vec::new();
    for probe in probes {
        let view = match &probe.answer {
            Ok(s) => NodeView {
                id: Some(s.node_id),
                role: Some(s.role.clone()),
                term: Some(s.term),
                applied: s.applied,
                last_log_index: s.last_log_index,
                digest: Some(s.digest.clone()),
                rest: probe.rest.clone(),
                voter: members.iter().find(|m| m.id == s.node_id).map(|m| m.voter),
                leader: s.leader,
                reachable: true,
                error: None,
            },
            Err(e) => {
                let member = member_by_addr(&probe.rest);
                NodeView {
                    id: member.map(|m| m.id),
                    role: None,
                    term: None,
                    applied: None,
                    last_log_index: None,
                    digest: None,
                    rest: probe.rest.clone(),
                    voter: member.map(|m| m.voter),
                    leader: None,
                    reachable: false,
                    error: Some(e.clone()),
                }
            }
        };
        // The same node reached under two addresses (or asked twice) is listed once; an
        // answer beats a failure.
        let same = nodes
            .iter()
            .position(|n| n.rest == view.rest || (n.id.is_some() && n.id == view.id));
        match same {
            Some(i) if !nodes[i].reachable && view.reachable => nodes[i] = view,
            Some(_) => {}
            None => nodes.push(view),
        }
    }
    nodes.sort_by(|a, b| (a.id.is_none(), a.id, &a.rest).cmp(&(b.id.is_none(), b.id, &b.rest)));

    let term = nodes.iter().filter_map(|n| n.term).max().unwrap_or(0);
    let at_term: Vec<&NodeView> = nodes
        .iter()
        .filter(|n| n.reachable && n.term == Some(term))
        .collect();
    let leader = at_term
        .iter()
        .find(|n| n.role.as_deref() == Some("leader"))
        .and_then(|n| n.id)
        .or_else(|| most_common(at_term.iter().filter_map(|n| n.leader)));
    ClusterView {
        leader,
        term,
        nodes,
    }
}

fn most_common(ids: impl Iterator<Item = u64>) -> Option<u64> {
    let mut counts: std::collections::BTreeMap<u64, usize> = std::collections::BTreeMap::new();
    for id in ids {
        *counts.entry(id).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|(id, n)| (*n, std::cmp::Reverse(*id)))
        .map(|(id, _)| id)
}

async fn probe(client: &SquadronClient, rest: String) -> Probe {
    let one = client.with_endpoints(vec![rest.clone()]);
    let answer = one
        .cluster_status(Consistency::Stale)
        .await
        .map_err(|e| e.to_string());
    Probe { rest, answer }
}

async fn probe_all(client: &SquadronClient, addrs: Vec<String>) -> Vec<Probe> {
    let mut set = tokio::task::JoinSet::new();
    for (i, rest) in addrs.into_iter().enumerate() {
        let client = client.clone();
        set.spawn(async move { (i, probe(&client, rest).await) });
    }
    let mut out = Vec::new();
    while let Some(joined) = set.join_next().await {
        if let Ok(p) = joined {
            out.push(p);
        }
    }
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, p)| p).collect()
}

/// Asks every endpoint, then every member not asked yet.
pub async fn gather(client: &SquadronClient) -> Vec<Probe> {
    let mut asked: Vec<String> = Vec::new();
    for e in client.endpoints() {
        let key = addr_key(e);
        if !asked.contains(&key) {
            asked.push(key);
        }
    }
    let mut probes = probe_all(client, asked.clone()).await;
    let members: Vec<String> = probes
        .iter()
        .find_map(|p| p.answer.as_ref().ok())
        .map(|s| s.members.iter().map(|m| addr_key(&m.rest)).collect())
        .unwrap_or_default();
    let missing: Vec<String> = members.into_iter().filter(|m| !asked.contains(m)).collect();
    if !missing.is_empty() {
        probes.extend(probe_all(client, missing).await);
    }
    probes
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

pub fn render(view: &ClusterView) -> String {
    let mut out = format!("leader: {}   term: {}\n", opt(view.leader), view.term);
    let mut t = Table::new(&[
        "id",
        "role",
        "voter",
        "term",
        "applied",
        "last_log",
        "digest",
        "rest",
        "reachable",
    ]);
    for n in &view.nodes {
        t.row(vec![
            opt(n.id),
            n.role.clone().unwrap_or_else(|| "-".into()),
            opt(n.voter),
            opt(n.term),
            opt(n.applied),
            opt(n.last_log_index),
            n.digest.as_deref().map(short).unwrap_or_else(|| "-".into()),
            n.rest.clone(),
            if n.reachable {
                "yes".into()
            } else {
                "NO".into()
            },
        ]);
    }
    out.push_str(&t.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, port: u16) -> MemberView {
        MemberView {
            id,
            rest: format!("127.0.0.1:{port}"),
            grpc: format!("127.0.0.1:{}", port + 100),
            peer: format!("127.0.0.1:{}", port + 200),
            voter: true,
        }
    }

    fn status(id: u64, role: &str, term: u64, leader: Option<u64>) -> ClusterStatus {
        ClusterStatus {
            node_id: id,
            role: role.into(),
            leader,
            term,
            last_log_index: Some(10),
            applied: Some(10),
            snapshot: None,
            purged: None,
            digest: "ab".repeat(32),
            clock_ms: 0,
            members: vec![member(1, 8211), member(2, 8212), member(3, 8213)],
        }
    }

    fn ok(port: u16, s: ClusterStatus) -> Probe {
        Probe {
            rest: format!("127.0.0.1:{port}"),
            answer: Ok(s),
        }
    }

    fn down(port: u16) -> Probe {
        Probe {
            rest: format!("127.0.0.1:{port}"),
            answer: Err("connection refused".into()),
        }
    }

    #[test]
    fn addresses_compare_without_scheme_or_slash() {
        assert_eq!(addr_key("http://127.0.0.1:8211/"), "127.0.0.1:8211");
        assert_eq!(addr_key("127.0.0.1:8211"), "127.0.0.1:8211");
    }

    #[test]
    fn unreachable_members_are_listed_with_their_ids() {
        let view = assemble(&[
            ok(8212, status(2, "follower", 3, Some(1))),
            ok(8211, status(1, "leader", 3, Some(1))),
            down(8213),
        ]);
        assert_eq!(view.leader, Some(1));
        assert_eq!(view.term, 3);
        let ids: Vec<_> = view.nodes.iter().map(|n| (n.id, n.reachable)).collect();
        assert_eq!(
            ids,
            vec![(Some(1), true), (Some(2), true), (Some(3), false)]
        );
        assert_eq!(view.nodes[2].voter, Some(true));
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["nodes"][2]["reachable"], false);
        assert_eq!(json["nodes"][0]["role"], "leader");
        assert!(json["nodes"][0]["digest"].is_string());
    }

    #[test]
    fn the_highest_term_decides_the_leader() {
        // Node 1 is a deposed leader still at term 3; nodes 2 and 3 moved on to term 4.
        let view = assemble(&[
            ok(8211, status(1, "leader", 3, Some(1))),
            ok(8212, status(2, "follower", 4, Some(3))),
            ok(8213, status(3, "candidate", 4, None)),
        ]);
        assert_eq!(view.term, 4);
        assert_eq!(view.leader, Some(3));
    }

    #[test]
    fn no_leader_when_nobody_knows_one() {
        let view = assemble(&[
            ok(8211, status(1, "candidate", 5, None)),
            down(8212),
            down(8213),
        ]);
        assert_eq!(view.leader, None);
        assert_eq!(view.nodes.iter().filter(|n| !n.reachable).count(), 2);
    }

    #[test]
    fn the_same_node_is_listed_once_and_an_answer_wins() {
        let view = assemble(&[
            down(8211),
            ok(8212, status(2, "follower", 1, Some(1))),
            ok(8211, status(1, "leader", 1, Some(1))),
            down(8213),
        ]);
        assert_eq!(view.nodes.len(), 3);
        assert!(view.nodes[0].reachable);
    }

    #[test]
    fn an_unknown_unreachable_endpoint_has_no_id_and_sorts_last() {
        let view = assemble(&[down(9999), ok(8211, status(1, "leader", 2, Some(1)))]);
        assert_eq!(view.nodes.last().map(|n| n.id), Some(None));
        assert_eq!(
            view.nodes.last().map(|n| n.rest.as_str()),
            Some("127.0.0.1:9999")
        );
    }

    #[test]
    fn the_table_shows_every_node() {
        let view = assemble(&[ok(8211, status(1, "leader", 2, Some(1))), down(8212)]);
        let text = render(&view);
        assert!(text.starts_with("leader: 1   term: 2\n"), "{text}");
        assert!(text.contains("127.0.0.1:8212"));
        assert!(
            text.lines()
                .any(|l| l.starts_with("2 ") && l.ends_with("NO")),
            "{text}"
        );
    }
}
