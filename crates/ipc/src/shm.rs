//! The shared segment of one client: a header with two doorbells and a heartbeat, then one slot
//! per queue. The agent writes each queue's state; the daemon writes each queue's command. Words
//! are atomics, and a side that sleeps does so in `futex(2)` on a doorbell, so a decision reaches
//! the other process with one wake-up and no socket traffic.
//!
//! The daemon creates the segment (a sealed `memfd`: the client cannot shrink it under the
//! daemon) and trusts nothing it reads from it beyond what the decoders check.
//!
//! With the fast path ([`crate::board`]) a slot also carries the queue's part of it: which bits
//! of the user's board stop the queue at once (`preempted_by`), which bits a suspension of the
//! daemon's lasts for (`lift`, with [`Command::liftable`]), and the queue's own bit's
//! neighbourhood (`quiet`: which of the queue's Ready/Idle reports need no wake-up of the daemon
//! at once, [`Quiet`]).

use crate::bits::Bits;
pub use crate::gpu_words::GpuWords;
use crate::mapping::{Mapping, futex_wait, futex_wake};
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use thiserror::Error;
use xpreempt_core::sched::QueueReport;

const MAGIC: u64 = u64::from_le_bytes(*b"XPRMPT01");

/// Slots per client segment: the most queues one process registers.
pub const SLOTS: u32 = 256;

#[repr(C, align(64))]
pub struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    slots: AtomicU32,
    /// Agent → daemon: bumped after a slot's state changed.
    pub to_daemon: Doorbell,
    /// Daemon → agent: bumped after a slot's command changed (an agent with a bell on its
    /// user's board waits there instead, and the daemon rings that).
    pub to_agent: Doorbell,
    /// Bumped by the agent at least every [`HEARTBEAT`]; the daemon's watchdog reads it.
    pub heartbeat: AtomicU64,
    /// Set by the daemon while its hooks want `Work` messages.
    pub wants_work: AtomicU32,
    /// Bumped by the daemon at least every [`DAEMON_BEAT`]: an agent whose queue the daemon
    /// holds suspended gives the daemon up when this stops moving (a stopped or hung daemon
    /// must not hold an application).
    pub daemon_beat: AtomicU64,
}

/// How often the daemon shows it is alive to every agent.
pub const DAEMON_BEAT: Duration = Duration::from_millis(250);

/// How often an agent shows it is alive.
pub const HEARTBEAT: Duration = Duration::from_millis(20);

/// A futex word with a flag saying whether its one waiter sleeps, so that a ringer skips the
/// system call while the waiter spins or works.
#[repr(C)]
pub struct Doorbell {
    word: AtomicU32,
    sleeping: AtomicU32,
}

#[repr(C, align(64))]
pub struct Slot {
    /// Agent → daemon: the queue's last Ready/Idle report ([`encode_report`]).
    pub report: AtomicU64,
    /// Daemon → agent: the command ([`Command::encode`]).
    pub command: AtomicU64,
    /// Agent → daemon: the generation of the last command applied.
    pub applied: AtomicU64,
    pub in_flight: AtomicU32,
    pub pending: AtomicU32,
    pub preemptions: AtomicU64,
    pub resumes: AtomicU64,
    pub suspend_p99_ns: AtomicU64,
    /// Agent → daemon: the queue's suspend and resume latencies, for the daemon's histograms;
    /// `drain_latency` holds the suspensions that drained although its level could stop the
    /// hardware.
    pub suspend_latency: Latencies,
    pub drain_latency: Latencies,
    pub resume_latency: Latencies,
    /// Agent → daemon: the queue's GPU time per command, busy fraction, bursts and gaps.
    pub gpu: GpuWords,
    /// Daemon → agent: board bits whose queues, while active, stop this one at once (the
    /// policy's order says so whatever else happens); written whenever it changes.
    pub preempted_by: Bits,
    /// Daemon → agent: with [`Command::liftable`], the daemon's suspension lasts only while one
    /// of these bits is set. Written before the command word that refers to it.
    pub lift: Bits,
    /// Daemon → agent: which of this queue's reports need not ring the daemon at once
    /// ([`Quiet`], encoded; [`Slot::quiet`] reads it).
    pub quiet: AtomicU32,
}

/// Upper bounds of the latency buckets a slot carries, in ns: from 2^10 (about 1 µs) to 2^30
/// (about 1.07 s), each power of two and the quarters between it and the next (1, 1.25, 1.5,
/// 1.75 times it), so that a quantile merged from these counts is known within a quarter of an
/// octave (the daemon's mechanism costs); the metrics show the powers of two. Every bound is an
/// exact bucket edge of the agent's log-linear histograms (16 sub-buckets per power of two), so
/// each count is exact.
pub const LATENCY_BOUNDS_NS: [u64; LATENCY_BUCKETS] = {
    let mut b = [0; LATENCY_BUCKETS];
    let mut i = 0;
    while i < LATENCY_BUCKETS {
        b[i] = (4 + (i as u64 % 4)) << (8 + i / 4);
        i += 1;
    }
    b
};
pub const LATENCY_BUCKETS: usize = 81;

/// A latency histogram as a slot carries it: how many samples fell below each of
/// [`LATENCY_BOUNDS_NS`] (cumulative), how many there were, and their sum. Each word only grows
/// while the queue lives; a reader that races the writer may see a count that lags a bucket, which
/// [`Latencies::load`] evens out.
#[repr(C)]
pub struct Latencies {
    below: [AtomicU64; LATENCY_BUCKETS],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

/// What [`Latencies`] held when read: cumulative and non-decreasing, with `count` at least the
/// last bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyCounts {
    pub below: [u64; LATENCY_BUCKETS],
    pub count: u64,
    pub sum_ns: u64,
}

impl Default for LatencyCounts {
    fn default() -> Self {
        Self {
            below: [0; LATENCY_BUCKETS],
            count: 0,
            sum_ns: 0,
        }
    }
}

impl LatencyCounts {
    /// What a slot carries for `h` (values in ns).
    pub fn of(h: &xpreempt_types::histogram::Histogram) -> Self {
        let mut c = Self {
            count: h.count(),
            sum_ns: h.sum().min(u128::from(u64::MAX)) as u64,
            ..Self::default()
        };
        h.counts_below(&LATENCY_BOUNDS_NS, &mut c.below);
        c
    }
}

impl Latencies {
    /// Publishes `h` (values in ns).
    pub fn store(&self, h: &xpreempt_types::histogram::Histogram) {
        let c = LatencyCounts::of(h);
        self.sum_ns.store(c.sum_ns, Ordering::Relaxed);
        for (word, n) in self.below.iter().zip(c.below) {
            word.store(n, Ordering::Relaxed);
        }
        self.count.store(c.count, Ordering::Release);
    }

    /// No samples: a slot reused after an earlier queue, before its agent publishes.
    pub fn clear(&self) {
        self.store(&xpreempt_types::histogram::Histogram::new());
    }

    pub fn load(&self) -> LatencyCounts {
        let count = self.count.load(Ordering::Acquire);
        let mut out = LatencyCounts {
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
            ..LatencyCounts::default()
        };
        // Words written after `count` was read may be ahead of it; buckets are cumulative, so a
        // later one is never below an earlier one.
        let mut running = 0;
        for (dst, word) in out.below.iter_mut().zip(&self.below) {
            running = running.max(word.load(Ordering::Relaxed));
            *dst = running;
        }
        out.count = count.max(running);
        out
    }
}

/// Which of a queue's Ready/Idle reports the daemon needs a doorbell for, as the fast path's
/// neighbourhood of the queue allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Quiet {
    /// Every report rings at once.
    Loud = 0,
    /// None rings: nothing else on the queue's device to decide for; the daemon reads the
    /// report when it needs it.
    Alone = 1,
    /// Every report may ring later, off the application's thread (the agent's
    /// `ReportSink::flush`): the queue ranks above every other queue of its device, and those
    /// all sit on its board, so its bit alone stops and restarts them; the daemon only confirms.
    Late = 2,
}

/// What the daemon tells a queue: run or stay suspended, and whether submissions are refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Command {
    pub generation: u64,
    pub suspended: bool,
    pub refused: bool,
    /// The suspension is only for the queues of the slot's `lift` bits: it ends, without a word
    /// from the daemon, once none of them is set on the board.
    pub liftable: bool,
}

impl Command {
    pub fn encode(self) -> u64 {
        (self.generation << 3)
            | (u64::from(self.liftable) << 2)
            | (u64::from(self.refused) << 1)
            | u64::from(self.suspended)
    }

    pub fn decode(word: u64) -> Self {
        Self {
            generation: word >> 3,
            suspended: word & 1 != 0,
            refused: word & 2 != 0,
            liftable: word & 4 != 0,
        }
    }

    /// Whether the daemon's command holds the queue now, given the board's active bits and the
    /// slot's `lift` bits read after this command.
    pub fn holds(self, active: u128, lift: u128) -> bool {
        self.suspended && !(self.liftable && active & lift == 0)
    }
}

impl Slot {
    /// The command with the `lift` bits it refers to (read consistently: the daemon writes the
    /// bits first, then the command word).
    pub fn command_and_lift(&self) -> (Command, u128) {
        loop {
            let word = self.command.load(Ordering::SeqCst);
            let lift = self.lift.load();
            if self.command.load(Ordering::SeqCst) == word {
                return (Command::decode(word), lift);
            }
        }
    }

    /// What the daemon last said about this queue's reports (an unknown word: ring for all).
    pub fn quiet(&self) -> Quiet {
        match self.quiet.load(Ordering::SeqCst) {
            1 => Quiet::Alone,
            2 => Quiet::Late,
            _ => Quiet::Loud,
        }
    }

    pub fn set_quiet(&self, quiet: Quiet) {
        self.quiet.store(quiet as u32, Ordering::SeqCst);
    }
}

/// A Ready/Idle report as a slot word: generation (32 bits), active, pending (31 bits). Other
/// reports do not travel through the segment.
pub fn encode_report(report: QueueReport) -> Option<u64> {
    let (generation, active, pending) = match report {
        QueueReport::Ready {
            pending,
            generation,
        } => (generation, 1, pending.min(0x7fff_ffff) as u64),
        QueueReport::Idle { generation } => (generation, 0, 0),
        _ => return None,
    };
    Some(((generation & 0xffff_ffff) << 32) | (active << 31) | pending)
}

/// The report a slot word holds; `None` before the first one.
pub fn decode_report(word: u64) -> Option<QueueReport> {
    let generation = word >> 32;
    if generation == 0 {
        return None;
    }
    Some(if word & (1 << 31) != 0 {
        QueueReport::Ready {
            pending: (word & 0x7fff_ffff) as usize,
            generation,
        }
    } else {
        QueueReport::Idle { generation }
    })
}

impl Default for Doorbell {
    fn default() -> Self {
        Self::new()
    }
}

impl Doorbell {
    /// A doorbell outside any segment (nobody else rings it).
    pub const fn new() -> Self {
        Self {
            word: AtomicU32::new(0),
            sleeping: AtomicU32::new(0),
        }
    }

    pub fn value(&self) -> u32 {
        self.word.load(Ordering::SeqCst)
    }

    /// Publishes what was written before it and wakes the waiter if it sleeps.
    pub fn ring(&self) {
        self.word.fetch_add(1, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) != 0 {
            futex_wake(&self.word);
        }
    }

    /// Waits until the doorbell moves past `seen`: spins for `spin`, then sleeps in the kernel
    /// until rung or `timeout` passes. Returns the new value (equal to `seen` on timeout).
    ///
    /// The spin yields the CPU on every turn: a spinning daemon or agent must not take the core
    /// of the application thread whose work it schedules, and on an idle core a yield returns at
    /// once (measured with `bench-request` on a 2-core host: the daemon beside a BE added 40 µs to
    /// a request's p50 with spins that held the core, 12–15 µs with spins that yield).
    pub fn wait(&self, seen: u32, spin: Duration, timeout: Duration) -> u32 {
        let start = Instant::now();
        loop {
            let v = self.value();
            if v != seen {
                return v;
            }
            if start.elapsed() >= spin {
                break;
            }
            std::thread::yield_now();
        }
        self.sleeping.store(1, Ordering::SeqCst);
        // A ring between the spin and this store is seen here (both sides use SeqCst).
        if self.value() == seen {
            futex_wait(&self.word, seen, timeout);
        }
        self.sleeping.store(0, Ordering::SeqCst);
        self.value()
    }
}

#[derive(Debug, Error)]
pub enum ShmError {
    #[error("creating the shared segment")]
    Create(#[source] io::Error),
    #[error("mapping the shared segment")]
    Map(#[source] io::Error),
    #[error("the shared segment is {got} bytes, expected {expected}")]
    Size { expected: usize, got: usize },
    #[error("the shared segment is not xpreempt's (bad magic) or of protocol version {0}")]
    Foreign(u32),
}

/// A mapped client segment.
pub struct Segment {
    map: Mapping,
}

fn size_for(slots: u32) -> usize {
    size_of::<Header>() + slots as usize * size_of::<Slot>()
}

impl Segment {
    /// A new, zeroed segment with `slots` slots, sealed against resizing.
    pub fn create(slots: u32) -> Result<Self, ShmError> {
        let map =
            Mapping::create(c"xpreempt-segment", size_for(slots)).map_err(ShmError::Create)?;
        let seg = Self { map };
        let h = seg.header();
        h.version.store(crate::PROTOCOL_VERSION, Ordering::Relaxed);
        h.slots.store(slots, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok(seg)
    }

    /// Maps a segment received from the daemon, checking its size, magic and version.
    pub fn open(fd: OwnedFd) -> Result<Self, ShmError> {
        let got = Mapping::size_of(&fd).map_err(ShmError::Map)?;
        if got < size_of::<Header>() {
            return Err(ShmError::Size {
                expected: size_of::<Header>(),
                got,
            });
        }
        let seg = Self {
            map: Mapping::map(fd, got).map_err(ShmError::Map)?,
        };
        let h = seg.header();
        let version = h.version.load(Ordering::Relaxed);
        if h.magic.load(Ordering::Acquire) != MAGIC || version != crate::PROTOCOL_VERSION {
            return Err(ShmError::Foreign(version));
        }
        let expected = size_for(h.slots.load(Ordering::Relaxed));
        if got != expected {
            return Err(ShmError::Size { expected, got });
        }
        Ok(seg)
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the mapping is page-aligned and at least size_of::<Header>() long (checked at
        // creation and open), and Header is made of atomics.
        unsafe { self.map.at::<Header>(0) }
    }

    pub fn slots(&self) -> u32 {
        ((self.map.len() - size_of::<Header>()) / size_of::<Slot>()) as u32
    }

    pub fn slot(&self, index: u32) -> Option<&Slot> {
        if index >= self.slots() {
            return None;
        }
        let offset = size_of::<Header>() + index as usize * size_of::<Slot>();
        // SAFETY: offset + size_of::<Slot>() <= len (checked above); Header's size is a multiple
        // of Slot's 64-byte alignment, so the slot is aligned; Slot is made of atomics.
        Some(unsafe { self.map.at::<Slot>(offset) })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.map.fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn latencies_cross_the_segment_as_cumulative_buckets() {
        let seg = Segment::create(1).unwrap();
        let slot = seg.slot(0).unwrap();
        assert_eq!(slot.suspend_latency.load(), LatencyCounts::default());
        let mut h = xpreempt_types::histogram::Histogram::new();
        for v in [500, 1024, 5_000, 2_000_000, 5_000_000_000] {
            h.record(v);
        }
        slot.suspend_latency.store(&h);
        let got = slot.suspend_latency.load();
        assert_eq!(got.count, 5);
        assert_eq!(got.sum_ns, 5_002_006_524);
        // Below 1024 ns: one; below 2048: two (1024 itself is not below 1024); ...
        assert_eq!(got.below[0], 1);
        assert_eq!(got.below[1], 2);
        assert_eq!(
            got.below[LATENCY_BUCKETS - 1],
            4,
            "5 s is above every bound"
        );
        assert!(got.below.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(LATENCY_BOUNDS_NS[..6], [1024, 1280, 1536, 1792, 2048, 2560]);
        assert_eq!(LATENCY_BOUNDS_NS[LATENCY_BUCKETS - 1], 1 << 30);
        for (&bound, &below) in LATENCY_BOUNDS_NS.iter().zip(&got.below) {
            let exact = [500u64, 1024, 5_000, 2_000_000, 5_000_000_000]
                .iter()
                .filter(|&&v| v < bound)
                .count() as u64;
            assert_eq!(below, exact, "below {bound}");
        }
        // A reader that raced the writer (a later bucket and the count not yet written) still
        // gets cumulative counts that end at most at the count.
        slot.resume_latency.below[3].store(7, Ordering::Relaxed);
        let torn = slot.resume_latency.load();
        assert!(torn.below.windows(2).all(|w| w[0] <= w[1]), "{torn:?}");
        assert_eq!(torn.below[LATENCY_BUCKETS - 1], 7);
        assert_eq!(torn.count, 7);
    }

    #[test]
    fn a_segment_opens_from_its_fd_and_shares_words() {
        let a = Segment::create(8).unwrap();
        let fd = a.fd().try_clone_to_owned().unwrap();
        let b = Segment::open(fd).unwrap();
        assert_eq!(b.slots(), 8);
        a.slot(3).unwrap().pending.store(5, Ordering::SeqCst);
        assert_eq!(b.slot(3).unwrap().pending.load(Ordering::SeqCst), 5);
        assert!(b.slot(8).is_none());
    }

    #[test]
    fn a_sealed_segment_cannot_shrink() {
        let a = Segment::create(2).unwrap();
        // SAFETY: ftruncate on the segment's own descriptor.
        let r = unsafe { libc::ftruncate(a.fd().as_raw_fd(), 0) };
        assert_ne!(r, 0, "the seal must refuse a shrink");
    }

    #[test]
    fn a_ring_wakes_a_sleeping_waiter_in_another_thread() {
        let seg = std::sync::Arc::new(Segment::create(1).unwrap());
        let seen = seg.header().to_daemon.value();
        let waiter = {
            let seg = seg.clone();
            std::thread::spawn(move || {
                seg.header()
                    .to_daemon
                    .wait(seen, Duration::ZERO, Duration::from_secs(10))
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        seg.header().to_daemon.ring();
        assert_eq!(waiter.join().unwrap(), seen + 1);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "woken by the ring, not the timeout"
        );
    }

    proptest! {
        #[test]
        fn reports_round_trip(pending in 0usize..0x7fff_ffff, generation in 1u64..u32::MAX as u64, ready: bool) {
            let r = if ready { QueueReport::Ready { pending, generation } } else { QueueReport::Idle { generation } };
            prop_assert_eq!(decode_report(encode_report(r).unwrap()), Some(r));
        }

        #[test]
        fn commands_round_trip(generation in 0u64..(1 << 60), suspended: bool, refused: bool, liftable: bool) {
            let c = Command { generation, suspended, refused, liftable };
            prop_assert_eq!(Command::decode(c.encode()), c);
        }
    }
}
