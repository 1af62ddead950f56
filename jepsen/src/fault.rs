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
    KillOne,
    KillLeader,
    KillMajority,
    PauseOne,
    PauseLeader,
    RemoveVoter,
    ClockSkew,
    ClockSkewLeader,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::IsolateOne => "partition-one",
            Fault::IsolateLeader => "partition-leader",
            Fault::Halves => "partition-halves",
            Fault::MajoritiesRing => "partition-majorities-ring",
            Fault::Bridge => "partition-bridge",
            Fault::IsolatePastSnapshot => "partition-past-snapshot",
            Fault::KillOne => "kill-one",
            Fault::KillLeader => "kill-leader",
            Fault::KillMajority => "kill-majority",
            Fault::PauseOne => "pause-one",
            Fault::PauseLeader => "pause-leader",
            Fault::RemoveVoter => "membership-remove",
            Fault::ClockSkew => "clock-skew",
            Fault::ClockSkewLeader => "clock-skew-leader",
        }
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
        )
    }
}
