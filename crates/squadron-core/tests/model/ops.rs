//! Abstract operations ("acquire for profile 2 with a stale generation") and the weights
//! of their mixes.

use crate::*;

/// Which fencing token to present.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Tok {
    /// The live lease of this profile or, if it has none, of the next profile that has one.
    Current,
    /// This very profile's live or newest lease, even when it has none live.
    Own,
    /// The right lease with a stale (or future) generation.
    StaleGen,
    /// Some other lease, under this profile's generation.
    OtherLease(usize),
    /// This profile's lease, presented for another profile.
    WrongProfile(usize),
}

/// Which lease reap evidence or a crash takeover names.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// The newest lease of the first profile (from this one on) whose newest lease has
    /// expired or been fenced: what reap evidence and crash takeovers are for.
    Stuck,
    /// The newest lease of the first profile (from this one on) that has any.
    Latest,
    Nth(usize),
    Missing,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Chain {
    Right,
    SeqAhead,
    SeqRepeat,
    WrongPrev,
    Zero,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Verify {
    Unset,
    Right,
    Wrong,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Ev {
    pub(crate) populated: bool,
    pub(crate) gen_ok: bool,
    pub(crate) cgroup_ok: bool,
    pub(crate) observed_ok: bool,
    pub(crate) source_ok: bool,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Next {
    pub(crate) provider: Provider,
    pub(crate) worker_ok: bool,
    pub(crate) cgroup: bool,
    pub(crate) ttl: u64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Gen {
    Right,
    Behind,
    Ahead,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum To {
    Forward,
    Fail,
    FailPreserved,
    Cancel,
    Any(usize),
}

#[derive(Debug, Clone)]
pub(crate) enum Op {
    Acquire {
        p: usize,
        /// Prefer a profile that can be granted (no live lease, nothing unreaped).
        idle: bool,
        gen: Gen,
        next: Next,
    },
    Renew {
        p: usize,
        tok: Tok,
        ttl: u64,
    },
    Release {
        p: usize,
        tok: Tok,
    },
    Fence {
        p: usize,
        tok: Tok,
        reason: FenceReason,
    },
    Reap {
        p: usize,
        target: Target,
        ev: Ev,
    },
    Graceful {
        p: usize,
        tok: Tok,
        chain: Chain,
        verify: Verify,
        seed: u8,
        ev: Option<Ev>,
        next: Next,
    },
    Crash {
        p: usize,
        target: Target,
        gen_ok: bool,
        ev: Option<Ev>,
        next: Next,
    },
    Commit {
        p: usize,
        tok: Tok,
        chain: Chain,
        verify: Verify,
        seed: u8,
    },
    Sweep,
    Submit {
        spec: usize,
    },
    Assign {
        picks: Vec<(usize, usize)>,
        raw: bool,
    },
    Report {
        t: usize,
        raw: bool,
        worker_ok: bool,
        attempt_ok: bool,
        from_ok: bool,
        to: To,
        exit: Option<i32>,
    },
    Cancel {
        t: usize,
    },
    /// The agent of a task's sandbox checks in.
    CheckIn {
        t: usize,
        raw: bool,
        attempt_ok: bool,
        usage: bool,
    },
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyUse {
    Unkeyed,
    Fresh,
    /// Retry the command first sent under the i-th key used so far.
    Same(usize),
    /// Send this step's command under the i-th key used so far.
    Other(usize),
}

#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub(crate) dt: i64,
    pub(crate) key: KeyUse,
    pub(crate) op: Op,
}

/// Weights of the operations in one test's sequences.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mix {
    pub(crate) acquire: u32,
    pub(crate) renew: u32,
    pub(crate) release: u32,
    pub(crate) fence: u32,
    pub(crate) reap: u32,
    pub(crate) graceful: u32,
    pub(crate) crash: u32,
    pub(crate) commit: u32,
    pub(crate) sweep: u32,
    pub(crate) submit: u32,
    pub(crate) assign: u32,
    pub(crate) report: u32,
    pub(crate) cancel: u32,
    pub(crate) check_in: u32,
    /// Percentage of steps that carry an idempotency key.
    pub(crate) keyed: u32,
    pub(crate) max_len: usize,
    /// Largest forward time step, ms.
    pub(crate) dt_max: i64,
}

pub(crate) const BALANCED: Mix = Mix {
    acquire: 12,
    renew: 5,
    release: 5,
    fence: 4,
    reap: 6,
    graceful: 5,
    crash: 5,
    commit: 6,
    sweep: 5,
    submit: 5,
    assign: 4,
    report: 10,
    cancel: 2,
    check_in: 2,
    keyed: 15,
    max_len: 80,
    dt_max: 3_000,
};
