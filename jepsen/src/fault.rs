//! The concrete faults a nemesis picks from.

/// One concrete fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    IsolateOne,
    IsolateLeader,
    Halves,
    MajoritiesRing,
    Bridge,
    /// Isolate a follower until the leader has snapshotted and purged its log past what the
    /// follower applied, so the heal makes it catch up by snapshot install.
    IsolatePastSnapshot,
    /// A follower hears nothing from the leader; the leader still hears it.
    OneWayFromLeader,
    /// The leader hears nothing from one follower; the follower still hears it.
    OneWayToLeader,
    /// Every node drops a fifth of what every other node sends it.
    PacketLoss,
    /// Every node gets what every other node sends it 25 ms late.
    PacketDelay,
    KillOne,
    KillLeader,
    KillMajority,
    PauseOne,
    PauseLeader,
    RemoveVoter,
    /// Remove the leader from the membership (it steps down once the change commits).
    RemoveLeader,
    ClockSkew,
    ClockSkewLeader,
    /// Skew a follower's clock, then kill the leader: the skewed node may lead next.
    ClockSkewFollowerKillLeader,
    /// Skew the leader's clock and isolate it.
    ClockSkewLeaderIsolated,
    /// Kill one node and drop every write its filesystem had not synced (lazyfs).
    CrashOne,
    CrashLeader,
    /// Every node at once: a power cut of the whole cluster.
    CrashAll,
    /// A follower replaced by a node with an empty disk: removed from the membership, killed,
    /// its data (not its certificates) deleted and its config made a joiner's; on heal it is
    /// started, added as a learner (it catches up by snapshot) and promoted.
    ReplaceWiped,
    /// SIGSTOP of the takeover workload's worker until its agents' leases have run out; after
    /// SIGCONT each of those generations tries to commit (a late writer, which must be
    /// refused).
    WorkerPause,
}

impl Fault {
    /// Every fault, in declaration order.
    pub const ALL: [Fault; 26] = [
        Fault::IsolateOne,
        Fault::IsolateLeader,
        Fault::Halves,
        Fault::MajoritiesRing,
        Fault::Bridge,
        Fault::IsolatePastSnapshot,
        Fault::OneWayFromLeader,
        Fault::OneWayToLeader,
        Fault::PacketLoss,
        Fault::PacketDelay,
        Fault::KillOne,
        Fault::KillLeader,
        Fault::KillMajority,
        Fault::PauseOne,
        Fault::PauseLeader,
        Fault::RemoveVoter,
        Fault::RemoveLeader,
        Fault::ClockSkew,
        Fault::ClockSkewLeader,
        Fault::ClockSkewFollowerKillLeader,
        Fault::ClockSkewLeaderIsolated,
        Fault::CrashOne,
        Fault::CrashLeader,
        Fault::CrashAll,
        Fault::ReplaceWiped,
        Fault::WorkerPause,
    ];

    /// The fault a name (`partition-one`, `packet-loss`, …) stands for.
    pub fn by_name(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Fault::IsolateOne => "partition-one",
            Fault::IsolateLeader => "partition-leader",
            Fault::Halves => "partition-halves",
            Fault::MajoritiesRing => "partition-majorities-ring",
            Fault::Bridge => "partition-bridge",
            Fault::IsolatePastSnapshot => "partition-past-snapshot",
            Fault::OneWayFromLeader => "partition-one-way-from-leader",
            Fault::OneWayToLeader => "partition-one-way-to-leader",
            Fault::PacketLoss => "packet-loss",
            Fault::PacketDelay => "packet-delay",
            Fault::KillOne => "kill-one",
            Fault::KillLeader => "kill-leader",
            Fault::KillMajority => "kill-majority",
            Fault::PauseOne => "pause-one",
            Fault::PauseLeader => "pause-leader",
            Fault::RemoveVoter => "membership-remove",
            Fault::RemoveLeader => "membership-remove-leader",
            Fault::ClockSkew => "clock-skew",
            Fault::ClockSkewLeader => "clock-skew-leader",
            Fault::ClockSkewFollowerKillLeader => "clock-skew-follower-kill-leader",
            Fault::ClockSkewLeaderIsolated => "clock-skew-leader-isolated",
            Fault::CrashOne => "crash-one",
            Fault::CrashLeader => "crash-leader",
            Fault::CrashAll => "crash-all",
            Fault::ReplaceWiped => "replace-wiped",
            Fault::WorkerPause => "worker-pause",
        }
    }

    /// Whether the fault drops unsynced writes (needs lazyfs under the nodes).
    pub fn is_crash(self) -> bool {
        matches!(self, Fault::CrashOne | Fault::CrashLeader | Fault::CrashAll)
    }

    /// Whether the fault moves a node's clock (libfaketime).
    pub fn is_clock(self) -> bool {
        matches!(
            self,
            Fault::ClockSkew
                | Fault::ClockSkewLeader
                | Fault::ClockSkewFollowerKillLeader
                | Fault::ClockSkewLeaderIsolated
        )
    }

    pub fn is_partition(self) -> bool {
        matches!(
            self,
            Fault::IsolateOne
                | Fault::IsolateLeader
                | Fault::Halves
                | Fault::MajoritiesRing
                | Fault::Bridge
                | Fault::IsolatePastSnapshot
                | Fault::OneWayFromLeader
                | Fault::OneWayToLeader
                | Fault::PacketLoss
                | Fault::PacketDelay
                | Fault::ClockSkewLeaderIsolated
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Fault;

    #[test]
    fn every_fault_has_its_own_name_and_is_found_by_it() {
        let mut names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
        for f in Fault::ALL {
            assert_eq!(Fault::by_name(f.name()), Some(f));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Fault::ALL.len());
        assert_eq!(Fault::by_name("partition-sideways"), None);
    }
}
