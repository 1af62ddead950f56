//! The answer of a linearizability search.

/// What the search concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable {
        states: usize,
    },
    NotLinearizable {
        /// How many operations the deepest partial linearization held.
        deepest: usize,
        /// The ids of that partial linearization, in order.
        prefix: Vec<usize>,
        /// The operation that had to take effect next but could not (its return was reached).
        blocked: Option<usize>,
        /// The model state at the deepest point.
        state: String,
    },
    /// The state-space bound was reached before an answer.
    Unknown {
        states: usize,
    },
}

impl Verdict {
    pub fn is_linearizable(&self) -> bool {
        matches!(self, Verdict::Linearizable { .. })
    }
}
