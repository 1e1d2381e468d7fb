//! The fast path's board: one shared segment per user, mapped by the daemon and by every agent
//! of that user, through which a queue's becoming active reaches the queues it preempts without
//! passing through the daemon.
//!
//! The daemon gives a queue a bit and each agent a bell. An agent sets its queue's bit in
//! `active` when the queue gets work (before its first launch) and clears it when the queue goes
//! idle, then rings the bells the daemon listed in the bit's lane: the agents holding queues that
//! the bit preempts. Those agents read the board and their slots' `preempted_by` bits and stop
//! (or, for a `liftable` suspension of the daemon's, restart) their queues at once. The daemon
//! still sees every Ready/Idle and stays the authority: it writes the masks from its policy's
//! order, leaves out clients that died or stopped answering, and its commands overrule.
//!
//! Only processes of one user share a board, and they may change each other's queues anyway
//! (`Cred::may_change`); queues of another user are stopped through the daemon alone.

pub use crate::bits::Bits;
use crate::mapping::Mapping;
use crate::shm::{Doorbell, ShmError};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Queues of one user that get a bit: more than this go through the daemon alone.
pub const BOARD_BITS: u32 = 128;
/// Agents of one user that get a bell: more than this wait on their segment and get no bits.
pub const BOARD_BELLS: u32 = 128;

const MAGIC: u64 = u64::from_le_bytes(*b"XPBOARD1");

#[repr(C, align(64))]
pub struct BoardHeader {
    magic: AtomicU64,
    version: AtomicU32,
    bits: AtomicU32,
    /// Agents → agents: the bits of the queues that have work now.
    pub active: Bits,
}

/// What the owner of a bit must do when it flips the bit.
#[repr(C, align(64))]
pub struct Lane {
    /// Daemon → owner: the bells of the agents whose queues this bit preempts.
    pub wakes: Bits,
}

/// One agent's doorbell, on a line of its own.
#[repr(C, align(64))]
pub struct Bell {
    pub doorbell: Doorbell,
}

/// A mapped board.
pub struct Board {
    map: Mapping,
}

const LANES_AT: usize = size_of::<BoardHeader>();
const BELLS_AT: usize = LANES_AT + BOARD_BITS as usize * size_of::<Lane>();
const SIZE: usize = BELLS_AT + BOARD_BELLS as usize * size_of::<Bell>();

impl Board {
    /// A new, empty board (the daemon's, one per user).
    pub fn create() -> Result<Self, ShmError> {
        let map = Mapping::create(c"xpreempt-board", SIZE).map_err(ShmError::Create)?;
        let board = Self { map };
        let h = board.header();
        h.version.store(crate::PROTOCOL_VERSION, Ordering::Relaxed);
        h.bits.store(BOARD_BITS, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok(board)
    }

    /// Maps a board received from the daemon, checking its size, magic and version.
    pub fn open(fd: OwnedFd) -> Result<Self, ShmError> {
        let got = Mapping::size_of(&fd).map_err(ShmError::Map)?;
        if got != SIZE {
            return Err(ShmError::Size {
                expected: SIZE,
                got,
            });
        }
        let board = Self {
            map: Mapping::map(fd, got).map_err(ShmError::Map)?,
        };
        let h = board.header();
        let version = h.version.load(Ordering::Relaxed);
        if h.magic.load(Ordering::Acquire) != MAGIC || version != crate::PROTOCOL_VERSION {
            return Err(ShmError::Foreign(version));
        }
        Ok(board)
    }

    pub fn header(&self) -> &BoardHeader {
        // SAFETY: the mapping is page-aligned and SIZE long (checked); the header is atomics.
        unsafe { self.map.at::<BoardHeader>(0) }
    }

    pub fn active(&self) -> &Bits {
        &self.header().active
    }

    pub fn lane(&self, bit: u32) -> Option<&Lane> {
        (bit < BOARD_BITS).then(|| {
            // SAFETY: in bounds (bit < BOARD_BITS), 64-byte aligned (the header and lanes are
            // 64-byte multiples), made of atomics.
            unsafe {
                self.map
                    .at::<Lane>(LANES_AT + bit as usize * size_of::<Lane>())
            }
        })
    }

    pub fn bell(&self, bell: u32) -> Option<&Doorbell> {
        (bell < BOARD_BELLS).then(|| {
            // SAFETY: as in `lane`, for the bells after the lanes.
            unsafe {
                &self
                    .map
                    .at::<Bell>(BELLS_AT + bell as usize * size_of::<Bell>())
                    .doorbell
            }
        })
    }

    /// Rings every bell in `bells`.
    pub fn ring(&self, bells: u128) {
        let mut rest = bells;
        while rest != 0 {
            let b = rest.trailing_zeros();
            rest &= rest - 1;
            if let Some(bell) = self.bell(b) {
                bell.ring();
            }
        }
    }

    /// Sets (`active`) or clears `bit`; if that changed it, rings the agents whose queues it
    /// preempts.
    pub fn announce(&self, bit: u32, active: bool) {
        let changed = if active {
            self.active().set(bit)
        } else {
            self.active().clear(bit)
        };
        if changed && let Some(lane) = self.lane(bit) {
            self.ring(lane.wakes.load());
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.map.fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bits_of_both_words_set_and_clear_on_their_own() {
        let b = Bits::default();
        b.set(3);
        b.set(100);
        assert_eq!(b.load(), Bits::mask(3) | Bits::mask(100));
        assert!(b.is_set(100) && !b.is_set(4));
        b.clear(3);
        assert_eq!(b.load(), Bits::mask(100));
        b.store(u128::MAX);
        assert_eq!(b.load(), u128::MAX);
    }

    #[test]
    fn a_board_opens_from_its_fd_and_an_announcement_rings_the_listed_bells() {
        let a = std::sync::Arc::new(Board::create().unwrap());
        let b = Board::open(a.fd().try_clone_to_owned().unwrap()).unwrap();
        b.lane(7)
            .unwrap()
            .wakes
            .store(Bits::mask(2) | Bits::mask(90));
        let (seen2, seen90, seen3) = (
            a.bell(2).unwrap().value(),
            a.bell(90).unwrap().value(),
            a.bell(3).unwrap().value(),
        );
        let waiter = {
            let a = a.clone();
            std::thread::spawn(move || {
                a.bell(90)
                    .unwrap()
                    .wait(seen90, Duration::ZERO, Duration::from_secs(10))
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        b.announce(7, true);
        assert!(a.active().is_set(7));
        assert_eq!(waiter.join().unwrap(), seen90 + 1, "woken by the ring");
        assert_eq!(a.bell(2).unwrap().value(), seen2 + 1);
        assert_eq!(a.bell(3).unwrap().value(), seen3, "not listed, not rung");
        b.announce(7, false);
        assert!(!a.active().is_set(7));
        assert!(a.lane(BOARD_BITS).is_none() && a.bell(BOARD_BELLS).is_none());
    }

    #[test]
    fn a_foreign_file_is_not_a_board() {
        let seg = crate::shm::Segment::create(2).unwrap();
        assert!(Board::open(seg.fd().try_clone_to_owned().unwrap()).is_err());
    }
}
