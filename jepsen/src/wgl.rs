//! Wing–Gong linearizability search with Lowe's memoisation ("WGL"), over one key's
//! operations.
//!
//! Operations are laid out as call and return entries in real-time order. The search walks the
//! entries: at a call it tries to linearize that operation next (the model must accept it in the
//! current state); at a return of an operation it has not linearized yet it backtracks, because
//! that operation must take effect before it returns. A cache of (linearized set, state) pairs
//! cuts repeated work. An operation of unknown outcome has no return entry: it may be linearized
//! anywhere after its call, or never (Jepsen's `info`). The search succeeds once every operation
//! with a known outcome is linearized.

use std::collections::HashSet;

use crate::model::Model;
pub use crate::verdict::Verdict;

/// Most (linearized set, state) pairs one search may remember before it answers `Unknown`.
pub const WGL_STATES_MAX: usize = 1_000_000;

const NIL: usize = usize::MAX;

/// One operation as the search sees it.
#[derive(Debug, Clone)]
pub struct TimedStep<S> {
    /// The caller's handle (an index into its operation list), returned in verdicts.
    pub id: usize,
    pub step: S,
    pub invoke_ms: f64,
    /// `None` for an unknown outcome: the operation may take effect at any later time, or never.
    pub complete_ms: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    op: usize,
    is_call: bool,
    /// For a call: its return entry, or NIL.
    ret: usize,
}

/// The search, with its bound.
#[derive(Debug, Clone, Copy)]
pub struct WglSearch {
    pub states_max: usize,
}

impl Default for WglSearch {
    fn default() -> Self {
        Self {
            states_max: WGL_STATES_MAX,
        }
    }
}

fn bit_set(bits: &mut [u64], i: usize, on: bool) {
    if let Some(w) = bits.get_mut(i / 64) {
        if on {
            *w |= 1u64 << (i % 64);
        } else {
            *w &= !(1u64 << (i % 64));
        }
    }
}

impl WglSearch {
    pub fn check<M: Model>(&self, model: &M, ops: &[TimedStep<M::Step>]) -> Verdict {
        // Entry 0 is the head sentinel.
        let mut times: Vec<(f64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, op) in ops.iter().enumerate() {
            times.push((op.invoke_ms, true, i));
            if let Some(c) = op.complete_ms {
                // A completion recorded before its own call (clock noise) is moved after it.
                times.push((c.max(op.invoke_ms), false, i));
            }
        }
        // Calls before returns at equal times: treating such a pair as concurrent is the
        // permissive reading, so a tie never produces a false alarm.
        times.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut entries = vec![Entry {
            op: NIL,
            is_call: false,
            ret: NIL,
        }];
        let mut call_of = vec![NIL; ops.len()];
        let mut ret_of = vec![NIL; ops.len()];
        for &(_, is_call, op) in &times {
            let idx = entries.len();
            entries.push(Entry {
                op,
                is_call,
                ret: NIL,
            });
            if is_call {
                call_of[op] = idx;
            } else {
                ret_of[op] = idx;
            }
        }
        for (op, &c) in call_of.iter().enumerate() {
            if let Some(e) = entries.get_mut(c) {
                e.ret = ret_of[op];
            }
        }
        let n = entries.len();
        let mut next: Vec<usize> = (0..n)
            .map(|i| if i + 1 < n { i + 1 } else { NIL })
            .collect();
        let mut prev: Vec<usize> = (0..n).map(|i| if i == 0 { NIL } else { i - 1 }).collect();
        let remove = |next: &mut Vec<usize>, prev: &mut Vec<usize>, e: usize| {
            let (p, x) = (prev[e], next[e]);
            next[p] = x;
            if x != NIL {
                prev[x] = p;
            }
        };
        let reinsert = |next: &mut Vec<usize>, prev: &mut Vec<usize>, e: usize| {
            let (p, x) = (prev[e], next[e]);
            next[p] = e;
            if x != NIL {
                prev[x] = e;
            }
        };

        let mut required = ops.iter().filter(|o| o.complete_ms.is_some()).count();
        let mut linearized = vec![0u64; ops.len().div_ceil(64).max(1)];
        let mut state = model.init();
        let mut stack: Vec<(usize, M::State)> = Vec::new();
        let mut cache: HashSet<(Vec<u64>, M::State)> = HashSet::new();
        let mut deepest: (usize, Vec<usize>, Option<usize>, String) =
            (0, Vec::new(), None, format!("{state:?}"));
        let mut entry = next[0];
        loop {
            if required == 0 {
                return Verdict::Linearizable {
                    states: cache.len(),
                };
            }
            let backtrack = if entry == NIL {
                true
            } else {
                let e = entries[entry];
                if e.is_call {
                    let mut advanced = false;
                    if let Some(new_state) = model.step(&state, &ops[e.op].step) {
                        let mut bits = linearized.clone();
                        bit_set(&mut bits, e.op, true);
                        if cache.insert((bits.clone(), new_state.clone())) {
                            if cache.len() > self.states_max {
                                return Verdict::Unknown {
                                    states: cache.len(),
                                };
                            }
                            stack.push((entry, std::mem::replace(&mut state, new_state)));
                            linearized = bits;
                            remove(&mut next, &mut prev, entry);
                            if e.ret != NIL {
                                remove(&mut next, &mut prev, e.ret);
                                required -= 1;
                            }
                            if stack.len() > deepest.0 {
                                deepest = (
                                    stack.len(),
                                    stack.iter().map(|(c, _)| ops[entries[*c].op].id).collect(),
                                    None,
                                    format!("{state:?}"),
                                );
                            }
                            entry = next[0];
                            advanced = true;
                        }
                    }
                    if !advanced {
                        entry = next[entry];
                    }
                    false
                } else {
                    if stack.len() == deepest.0 && deepest.2.is_none() {
                        deepest.2 = Some(ops[e.op].id);
                    }
                    true
                }
            };
            if backtrack {
                let Some((call, prev_state)) = stack.pop() else {
                    return Verdict::NotLinearizable {
                        deepest: deepest.0,
                        prefix: deepest.1,
                        blocked: deepest.2,
                        state: deepest.3,
                    };
                };
                let e = entries[call];
                if e.ret != NIL {
                    reinsert(&mut next, &mut prev, e.ret);
                    required += 1;
                }
                reinsert(&mut next, &mut prev, call);
                bit_set(&mut linearized, e.op, false);
                state = prev_state;
                entry = next[call];
            }
        }
    }
}
