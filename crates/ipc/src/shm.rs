//! The shared segment of one client: a header with two doorbells and a heartbeat, then one slot
//! per queue. The agent writes each queue's state; the daemon writes each queue's command. Words
//! are atomics, and a side that sleeps does so in `futex(2)` on a doorbell, so a decision reaches
//! the other process with one wake-up and no socket traffic.
//!
//! The daemon creates the segment (a sealed `memfd`: the client cannot shrink it under the
//! daemon) and trusts nothing it reads from it beyond what the decoders check.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
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
    /// Daemon → agent: bumped after a slot's command changed.
    pub to_agent: Doorbell,
    /// Bumped by the agent at least every [`HEARTBEAT`]; the daemon's watchdog reads it.
    pub heartbeat: AtomicU64,
    /// Set by the daemon while its hooks want `Work` messages.
    pub wants_work: AtomicU32,
}

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
}

/// What the daemon tells a queue: run or stay suspended, and whether submissions are refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Command {
    pub generation: u64,
    pub suspended: bool,
    pub refused: bool,
}

impl Command {
    pub fn encode(self) -> u64 {
        (self.generation << 2) | (u64::from(self.refused) << 1) | u64::from(self.suspended)
    }

    pub fn decode(word: u64) -> Self {
        Self {
            generation: word >> 2,
            suspended: word & 1 != 0,
            refused: word & 2 != 0,
        }
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

impl Doorbell {
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
            std::hint::spin_loop();
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
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping holds only atomics (Header, Slot), which are shared between threads and
// processes by design; the pointer stays valid until Drop unmaps it.
unsafe impl Send for Segment {}
// SAFETY: as above; every access through `&Segment` is an atomic operation.
unsafe impl Sync for Segment {}

fn size_for(slots: u32) -> usize {
    size_of::<Header>() + slots as usize * size_of::<Slot>()
}

impl Segment {
    /// A new, zeroed segment with `slots` slots, sealed against resizing.
    pub fn create(slots: u32) -> Result<Self, ShmError> {
        let len = size_for(slots);
        // SAFETY: the name is a NUL-terminated literal; the flags are valid for memfd_create.
        let raw = unsafe {
            libc::memfd_create(
                c"xpreempt-segment".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(ShmError::Create(io::Error::last_os_error()));
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate and fcntl on a descriptor we own.
        let sized = unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } == 0
            && unsafe {
                libc::fcntl(
                    fd.as_raw_fd(),
                    libc::F_ADD_SEALS,
                    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
                )
            } == 0;
        if !sized {
            return Err(ShmError::Create(io::Error::last_os_error()));
        }
        let seg = Self::map(fd, len)?;
        let h = seg.header();
        h.version.store(crate::PROTOCOL_VERSION, Ordering::Relaxed);
        h.slots.store(slots, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok(seg)
    }

    /// Maps a segment received from the daemon, checking its size, magic and version.
    pub fn open(fd: OwnedFd) -> Result<Self, ShmError> {
        // SAFETY: fstat into a zeroed buffer on a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(ShmError::Map(io::Error::last_os_error()));
        }
        let got = st.st_size as usize;
        if got < size_of::<Header>() {
            return Err(ShmError::Size {
                expected: size_of::<Header>(),
                got,
            });
        }
        let seg = Self::map(fd, got)?;
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

    fn map(fd: OwnedFd, len: usize) -> Result<Self, ShmError> {
        // SAFETY: a fresh shared mapping of `len` bytes of a file at least that long.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ShmError::Map(io::Error::last_os_error()));
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| ShmError::Map(io::Error::other("mmap returned a null mapping")))?;
        Ok(Self { ptr, len, fd })
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the mapping is page-aligned, at least size_of::<Header>() long, and Header
        // is made of atomics, valid for any bit pattern (zeroed at creation).
        unsafe { &*self.ptr.as_ptr().cast::<Header>() }
    }

    pub fn slots(&self) -> u32 {
        ((self.len - size_of::<Header>()) / size_of::<Slot>()) as u32
    }

    pub fn slot(&self, index: u32) -> Option<&Slot> {
        if index >= self.slots() {
            return None;
        }
        let offset = size_of::<Header>() + index as usize * size_of::<Slot>();
        // SAFETY: offset + size_of::<Slot>() <= len (checked above); Header's size is a multiple
        // of Slot's 64-byte alignment, so the slot is aligned; Slot is made of atomics.
        Some(unsafe { &*self.ptr.as_ptr().add(offset).cast::<Slot>() })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a live, aligned u32 with a valid timespec; shared (not PRIVATE)
    // because the word lives in memory mapped by two processes. Any return is fine: callers
    // re-read the word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE of at most one waiter on a live, aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            1u32,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        fn commands_round_trip(generation in 0u64..(1 << 60), suspended: bool, refused: bool) {
            let c = Command { generation, suspended, refused };
            prop_assert_eq!(Command::decode(c.encode()), c);
        }
    }
}
