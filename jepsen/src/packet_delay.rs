//! Packet delay for the nemesis. This kernel has no `netem` qdisc, but it has NFQUEUE: an
//! iptables rule hands each packet it matches to a netlink queue, and the packet waits there
//! until whoever reads the queue gives its verdict. A [`Delayer`] is a thread that enters one
//! node's network namespace, binds [`DELAY_QUEUE`] there and accepts every packet `delay` after
//! it arrived, in arrival order; `NamespaceNet::delay` points the namespace's INPUT rules for
//! what the other nodes send at it. Healing removes the rules first, then stops the thread,
//! which lets through what it still holds.
//!
//! Written here on `nfq` (netlink, no C library): a userspace proxy between the nodes would
//! need every node's peer addresses rewritten, where this delays the packets the nodes already
//! exchange, TCP's own retransmissions and acknowledgements included.
//!
//! Limits: the thread looks at its queue every millisecond, through the netlink socket's
//! default receive buffer (`nfq` does not let it be raised), each packet a message of its
//! metadata only; a load that overflows the buffer or the kernel's queue between two looks is
//! let through undelayed (fail open), not dropped. The chaos runs' loads are far below it.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nfq::{Message, Queue, Verdict};
use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};

use crate::netns::NetError;

/// The queue number the delay rules send packets to (queues are per namespace).
pub const DELAY_QUEUE: u16 = 7;
/// Packets the kernel holds for the queue; past that it lets new ones through undelayed
/// (fail open) instead of dropping them: a delay fault is not a loss fault.
const QUEUE_PACKETS_MAX: u32 = 16_384;
/// The longest a delayer sleeps between looks at its queue: the delay's granularity.
const POLL_MS: u64 = 1;
/// How long a delayer may take to enter its namespace and bind its queue.
const START_TIMEOUT_MS: u64 = 5_000;

/// One namespace's delay thread; dropping it stops the thread.
#[derive(Debug)]
pub struct Delayer {
    stop: Arc<AtomicBool>,
    delayed: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Delayer {
    /// Starts delaying what reaches [`DELAY_QUEUE`] in the namespace named `ns` by `delay`;
    /// returns once the queue is bound there, so rules added after it never meet an unbound
    /// queue.
    pub fn start(ns: &str, delay: Duration) -> Result<Delayer, NetError> {
        let path = format!("/run/netns/{ns}");
        let (stop, delayed) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (ready, bound) = mpsc::channel();
        let (s, d) = (stop.clone(), delayed.clone());
        let thread = std::thread::Builder::new()
            .name(format!("delay-{ns}"))
            .spawn(move || match open_queue(&path) {
                Ok(queue) => {
                    let _ = ready.send(Ok(()));
                    hold_and_release(queue, delay, &s, &d);
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                }
            })
            .map_err(|e| failed(ns, &e.to_string()))?;
        let delayer = Delayer {
            stop,
            delayed,
            thread: Some(thread),
        };
        match bound.recv_timeout(Duration::from_millis(START_TIMEOUT_MS)) {
            Ok(Ok(())) => Ok(delayer),
            Ok(Err(message)) => Err(failed(ns, &message)),
            Err(_) => {
                // Stuck entering the namespace or binding: left to itself, not waited for.
                let mut delayer = delayer;
                delayer.stop.store(true, Ordering::Release);
                drop(delayer.thread.take());
                Err(failed(ns, "the queue was not bound in time"))
            }
        }
    }

    /// Stops the thread, letting through what it holds; returns how many packets it delayed,
    /// or why it stopped before (a thread that panicked closed its queue, and the kernel
    /// dropped what it held; `--queue-bypass` let the rest through undelayed).
    pub fn stop(mut self) -> Result<u64, String> {
        self.finish()?;
        Ok(self.delayed.load(Ordering::Relaxed))
    }

    fn finish(&mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::Release);
        match self.thread.take().map(JoinHandle::join) {
            Some(Err(_)) => Err("the delay thread panicked".to_string()),
            _ => Ok(()),
        }
    }
}

impl Drop for Delayer {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

fn failed(ns: &str, message: &str) -> NetError {
    NetError::Command {
        command: format!("packet delay in {ns}"),
        message: message.to_string(),
    }
}

/// Enters the namespace at `path` (this thread only) and binds the delay queue there.
fn open_queue(path: &str) -> Result<Queue, String> {
    let ns = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network))
        .map_err(|e| format!("entering {path}: {e}"))?;
    let mut queue = Queue::open().map_err(|e| format!("opening a netfilter queue: {e}"))?;
    queue
        .bind(DELAY_QUEUE)
        .map_err(|e| format!("binding queue {DELAY_QUEUE}: {e}"))?;
    // Only the verdict is given back: the packet itself need not come up.
    queue
        .set_copy_range(DELAY_QUEUE, 0)
        .and_then(|()| queue.set_queue_max_len(DELAY_QUEUE, QUEUE_PACKETS_MAX))
        .and_then(|()| queue.set_fail_open(DELAY_QUEUE, true))
        .map_err(|e| format!("configuring queue {DELAY_QUEUE}: {e}"))?;
    queue.set_nonblocking(true);
    Ok(queue)
}

/// Holds each packet `delay` from its arrival, then accepts it; once `stop` is set, accepts
/// everything it holds and returns.
fn hold_and_release(mut queue: Queue, delay: Duration, stop: &AtomicBool, delayed: &AtomicU64) {
    let mut held: VecDeque<(Instant, Message)> = VecDeque::new();
    loop {
        let stopping = stop.load(Ordering::Acquire);
        loop {
            match queue.recv() {
                Ok(message) => held.push_back((Instant::now() + delay, message)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    eprintln!("packet delay: reading the queue: {e}");
                    break;
                }
            }
        }
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| stopping || *due <= now) {
            let Some((_, mut message)) = held.pop_front() else {
                break;
            };
            message.set_verdict(Verdict::Accept);
            if let Err(e) = queue.verdict(message) {
                eprintln!("packet delay: a verdict failed: {e}");
            }
            delayed.fetch_add(1, Ordering::Relaxed);
        }
        if stopping {
            return;
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
}
