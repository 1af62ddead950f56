//! When this node campaigns, on top of openraft's election timer.
//!
//! openraft 0.9 lets a voter refuse every vote while its leader lease runs (the
//! `election_timeout_max` after it last heard from the leader), and its own timer waits lease
//! plus a random election timeout before a follower that had a leader campaigns: after a leader
//! died its successor came 1.2–1.6 s later, and two followers whose fixed random timeouts lay
//! close split their votes round after round (up to 4.8 s measured, p50 1.6 s over 20 kills).
//! It also has no pre-vote: a follower cut off from the others raised its term at every
//! timeout and deposed the leader when the partition healed.
//!
//! This loop adds two things:
//! - **No campaign that could not win.** Every half election timeout it pings the other voters
//!   over the peer listener (`/internal/v1/ping`); each answers how long ago it heard a leader.
//!   openraft's timer is off (`RuntimeConfigHandle::elect(false)`) while fewer than a majority,
//!   itself counted, would grant a vote: those that answer and have not heard a leader for
//!   the lease (a voter that has refuses every vote). A node that could not win does not raise
//!   the term — pre-vote's effect: a follower deaf to a leader the others still hear (a
//!   one-way partition) raised its term at every timeout and deposed that leader at the heal,
//!   ~1.9 s without reads in the chaos suite.
//! - **One early campaign per leaderless spell**, as etcd's randomised timeout above the lease
//!   does: once no leader has been heard (`LeaderContact`: append-entries and snapshots) for
//!   the lease plus a jitter drawn afresh each spell, it campaigns (`trigger().elect()`) —
//!   the voters' leases have run out by then, so the first campaign can win. A change of this
//!   node's vote (it voted for a candidate, or learned a higher term) counts as hearing from
//!   a leader: an election is under way, and a campaign in the moment between granting a vote
//!   and the winner's first append would depose the winner. A node whose log is shorter than a
//!   reachable voter's (each ping answers with the peer's last log index) does not campaign
//!   early: the voter would refuse it, and its candidacy would win the tie against the longer
//!   log's campaign of the same term whenever its id is larger. If it loses anyway (a
//!   voter with a longer log refuses it, or a same-term candidate with a larger id wins the
//!   tie), openraft's timer runs the election on as before, with its own back-off for a node
//!   that saw a longer log.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rand::Rng;
use squadron_raft::LeaderContact;
use tokio::sync::watch;

use crate::node::ControlNode;

/// Pings per election timeout (the shortest one).
const PINGS_PER_ELECTION_TIMEOUT: u64 = 2;
/// Looks at the election's conditions per heartbeat interval.
const LOOKS_PER_HEARTBEAT: u64 = 2;

/// Whether `reachable` of `voters` (this node counted when it is one) make a majority.
pub fn quorum_reachable(voters: usize, reachable: usize) -> bool {
    voters == 0 || reachable * 2 > voters
}

/// What the last round of pings found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reach {
    /// A majority of the voters, this node counted, answered.
    pub quorum: bool,
    /// The longest log a voter that answered reported.
    pub peer_log: Option<u64>,
    /// The voters of the membership, and whether this node is one.
    pub voters: usize,
    pub voter: bool,
    /// Each other voter that answered: how long it had not heard a leader.
    pub quiet: Vec<PeerQuiet>,
}

/// One voter's answer about its leader contact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerQuiet {
    /// Since it last heard a leader (`None`: an older node that does not say, taken as
    /// willing to vote).
    pub quiet: Option<Duration>,
    /// When its answer came (each as it came: a round waits for its slowest peer).
    pub at: Instant,
}

impl Reach {
    /// Whether a majority of the voters would grant this node a vote at `now`: itself, and
    /// each voter that answered and has not heard a leader for `lease` since (counted on from
    /// its answer, as its silence goes on).
    pub fn could_win(&self, lease: Duration, now: Instant) -> bool {
        let granting = self
            .quiet
            .iter()
            .filter(|p| {
                p.quiet
                    .is_none_or(|q| q + now.saturating_duration_since(p.at) >= lease)
            })
            .count();
        self.quorum && quorum_reachable(self.voters, usize::from(self.voter) + granting)
    }
}

/// When to campaign early, decided from what the loop sees (pure, so it is tested alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Campaign {
    /// The voters' leader lease: `election_timeout_max`.
    pub lease: Duration,
    /// The jitter drawn for this leaderless spell.
    pub jitter: Duration,
    /// Whether this spell's early campaign was made.
    pub made: bool,
}

/// What the loop sees at one look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    pub leader: bool,
    pub voter: bool,
    pub voters: usize,
    /// A majority of the voters would grant this node a vote ([`Reach::could_win`]).
    pub quorum: bool,
    /// A reachable voter's log reaches further than this node's.
    pub behind: bool,
    /// Since a leader was last heard.
    pub heard: Duration,
}

impl Campaign {
    pub fn due(&self, look: &Look) -> bool {
        !self.made
            && !look.leader
            && look.voter
            && look.voters > 1
            && look.quorum
            && !look.behind
            && look.heard > self.lease + self.jitter
    }

    /// A leader was heard since the last look: a new spell starts with the next silence.
    pub fn heard_from_leader(&mut self, jitter: Duration) {
        self.made = false;
        self.jitter = jitter;
    }
}

/// Runs the loop.
pub fn spawn(
    node: Arc<ControlNode>,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let contact: Arc<LeaderContact> = node.leader_contact.clone();
    let raft = &node.config.raft;
    let lease = Duration::from_millis(raft.election_timeout_max_ms);
    let spread_ms = (raft.election_timeout_min_ms / 2).max(1);
    let look_every =
        Duration::from_millis((raft.heartbeat_interval_ms / LOOKS_PER_HEARTBEAT).max(1));
    let reach = Arc::new(Mutex::new(Reach {
        quorum: true,
        peer_log: None,
        voters: 0,
        voter: false,
        quiet: Vec::new(),
    }));
    let pings = tokio::spawn(watch_quorum(node.clone(), reach.clone(), shutdown.clone()));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(look_every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let jitter = || Duration::from_millis(rand::thread_rng().gen_range(0..=spread_ms));
        let mut campaign = Campaign {
            lease,
            jitter: jitter(),
            made: false,
        };
        let mut last_heard = Duration::ZERO;
        let mut last_vote = node.raft.metrics().borrow().vote;
        let mut vote_changed = Instant::now();
        // openraft's own timer starts on.
        let mut may_campaign = true;
        loop {
            tokio::select! {
                _ = shutdown.changed() => {
                    pings.abort();
                    return;
                }
                _ = ticks.tick() => {}
            }
            let vote = node.raft.metrics().borrow().vote;
            if vote != last_vote {
                last_vote = vote;
                vote_changed = Instant::now();
            }
            // A vote change counts as hearing a leader here only: the pings answer other
            // voters with real leader contact, since a vote not yet committed refuses no one.
            let heard = contact.quiet_for().min(vote_changed.elapsed());
            if heard < last_heard {
                campaign.heard_from_leader(jitter());
            }
            last_heard = heard;
            let members = node.members();
            let reached = reach.lock().unwrap_or_else(PoisonError::into_inner).clone();
            let could_win = reached.could_win(lease, Instant::now());
            if could_win != may_campaign {
                may_campaign = could_win;
                node.raft.runtime_config().elect(could_win);
                if could_win {
                    tracing::info!("a majority of voters would vote; this node may campaign");
                } else {
                    tracing::debug!(
                        "fewer than a majority of voters would vote (unreachable, or a leader \
                         heard within the lease); this node does not campaign"
                    );
                }
            }
            let own_log = node.raft.metrics().borrow().last_log_index;
            let look = Look {
                leader: node.is_leader(),
                voter: members.get(&node.id).is_some_and(|(_, voter)| *voter),
                voters: members.values().filter(|(_, voter)| *voter).count(),
                quorum: could_win,
                behind: reached.peer_log > own_log,
                heard,
            };
            if campaign.due(&look) {
                campaign.made = true;
                tracing::info!(
                    heard_ms = heard.as_millis() as u64,
                    "no leader heard for the lease: campaigning"
                );
                if let Err(e) = node.raft.trigger().elect().await {
                    tracing::warn!(error = %e, "the election could not be started");
                }
            }
        }
    })
}

/// Pings every other voter every half election timeout and keeps what the round found.
async fn watch_quorum(
    node: Arc<ControlNode>,
    reach: Arc<Mutex<Reach>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let every = Duration::from_millis(
        (node.config.raft.election_timeout_min_ms / PINGS_PER_ELECTION_TIMEOUT).max(1),
    );
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = ticks.tick() => {}
        }
        let found = ping_voters(&node, every).await;
        let was = std::mem::replace(
            &mut *reach.lock().unwrap_or_else(PoisonError::into_inner),
            found.clone(),
        );
        if was.quorum && !found.quorum {
            tracing::warn!(
                "fewer than a majority of voters answer; this node does not campaign until they do"
            );
        }
    }
}

async fn ping_voters(node: &ControlNode, timeout: Duration) -> Reach {
    let members = node.members();
    let voters: Vec<_> = members.iter().filter(|(_, (_, voter))| *voter).collect();
    let me = usize::from(voters.iter().any(|(id, _)| **id == node.id));
    let peer = node.writes.peer();
    let answers = join_all(voters.iter().filter(|(id, _)| **id != node.id).map(
        |(_, (addr, _))| async {
            let reply = peer.ping(addr, timeout).await?;
            Some((reply, Instant::now()))
        },
    ))
    .await;
    let reachable = me + answers.iter().flatten().count();
    Reach {
        quorum: quorum_reachable(voters.len(), reachable),
        peer_log: answers
            .iter()
            .flatten()
            .filter_map(|(a, _)| a.last_log_index)
            .max(),
        voters: voters.len(),
        voter: me == 1,
        quiet: answers
            .iter()
            .flatten()
            .map(|(a, at)| PeerQuiet {
                quiet: a.leader_heard_ms_ago.map(Duration::from_millis),
                at: *at,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_counts_this_node_too() {
        assert!(quorum_reachable(1, 1));
        assert!(!quorum_reachable(3, 1));
        assert!(quorum_reachable(3, 2));
        assert!(!quorum_reachable(4, 2));
        assert!(quorum_reachable(5, 3));
        assert!(
            quorum_reachable(0, 0),
            "no membership yet: leave openraft alone"
        );
    }

    fn look(heard_ms: u64) -> Look {
        Look {
            leader: false,
            voter: true,
            voters: 3,
            quorum: true,
            behind: false,
            heard: Duration::from_millis(heard_ms),
        }
    }

    fn reach_at(at: Instant, quiet: &[Option<u64>]) -> Reach {
        Reach {
            quorum: true,
            peer_log: None,
            voters: 3,
            voter: true,
            quiet: quiet
                .iter()
                .map(|q| PeerQuiet {
                    quiet: q.map(Duration::from_millis),
                    at,
                })
                .collect(),
        }
    }

    fn reach(quiet: &[Option<u64>]) -> Reach {
        reach_at(Instant::now(), quiet)
    }

    /// Pre-vote's effect: a node counts as votes only the voters whose leader lease ran out.
    #[test]
    fn a_node_could_win_only_where_a_majority_has_not_heard_a_leader_for_the_lease() {
        let lease = Duration::from_millis(800);
        let now = Instant::now();
        // Deaf to a leader both others hear (the leader answers 0): it would lose.
        assert!(!reach(&[Some(0), Some(40)]).could_win(lease, now));
        // The leader gone (no answer), the other follower silent for the lease too: it wins.
        assert!(reach(&[Some(800)]).could_win(lease, now));
        assert!(!reach(&[Some(700)]).could_win(lease, now));
        // The other's silence goes on after its answer.
        let r = reach_at(now, &[Some(700)]);
        assert!(r.could_win(lease, now + Duration::from_millis(100)));
        // An older node that does not say counts as willing, as before.
        assert!(reach(&[None]).could_win(lease, now));
        // Alone of three: never, whatever it hears.
        assert!(!reach(&[]).could_win(lease, now));
        let unreachable = Reach {
            quorum: false,
            ..reach(&[Some(5_000), Some(5_000)])
        };
        assert!(!unreachable.could_win(lease, now));
        // A learner counts only the voters' votes.
        let learner = Reach {
            voter: false,
            ..reach(&[Some(900), Some(900)])
        };
        assert!(learner.could_win(lease, now));
        assert!(!Reach {
            voter: false,
            ..reach(&[Some(900)])
        }
        .could_win(lease, now));
    }

    #[test]
    fn a_follower_campaigns_early_once_the_lease_and_its_jitter_are_over() {
        let mut c = Campaign {
            lease: Duration::from_millis(800),
            jitter: Duration::from_millis(120),
            made: false,
        };
        assert!(!c.due(&look(900)), "within lease + jitter");
        assert!(c.due(&look(921)));
        c.made = true;
        assert!(
            !c.due(&look(5_000)),
            "once per spell: openraft's timer goes on"
        );
        c.heard_from_leader(Duration::from_millis(10));
        assert!(c.due(&look(811)), "a new spell, a new jitter");
    }

    #[test]
    fn no_early_campaign_without_a_majority_as_leader_as_learner_alone_or_behind() {
        let c = Campaign {
            lease: Duration::from_millis(800),
            jitter: Duration::ZERO,
            made: false,
        };
        let quiet = look(10_000);
        assert!(c.due(&quiet));
        for other in [
            Look {
                quorum: false,
                ..quiet
            },
            Look {
                leader: true,
                ..quiet
            },
            Look {
                voter: false,
                ..quiet
            },
            Look {
                behind: true,
                ..quiet
            },
            Look { voters: 1, ..quiet },
        ] {
            assert!(!c.due(&other), "{other:?}");
        }
    }
}
