//! The fast path in the daemon: a board per user ([`xpreempt_ipc::board`]), a bit for each of
//! that user's queues and a bell for each agent, and, after every decision on a device, what
//! the agents need to act before the daemon hears of a change:
//! - each queue's `preempted_by` bits: the queues of its user above it in the policy's order
//!   ([`xpreempt_core::policy::Policy::preemption_rank`]), whose agents then ring its agent;
//! - each command's `lift` bits: a suspension the policy's order explains entirely (every rival
//!   is above it, has a bit, shares the board and still answers) ends when those bits clear;
//! - `quiet`: a queue alone on its device needs no doorbell at all; one above every other queue
//!   of its device, all of them on its board, needs none at once (its bit stops and restarts
//!   them; the daemon only confirms), and its agent rings off the application's thread.
//!
//! Queues of clients the watchdog silenced, of other users, or beyond the board's bits are
//! left out: they are decided through the daemon alone, as without the fast path.

use super::State;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use xpreempt_core::{Nanos, QueueId};
use xpreempt_ipc::board::{BOARD_BELLS, BOARD_BITS, Bits, Board};
use xpreempt_ipc::shm::Quiet;

/// An agent's place on its user's board.
#[derive(Clone)]
pub struct Seat {
    pub uid: u32,
    pub bell: u32,
    pub board: Arc<Board>,
}

struct UserBoard {
    board: Arc<Board>,
    bits: Vec<Option<QueueId>>,
    bells: Vec<Option<u64>>,
    /// Each lane's `wakes` as last written.
    wakes: Vec<u128>,
}

/// Every user's board.
#[derive(Default)]
pub struct Boards {
    by_uid: BTreeMap<u32, UserBoard>,
}

impl Boards {
    /// A bell for a new agent of `uid` on that user's board (made with its first agent); `None`
    /// when the board is full or cannot be made.
    pub fn seat(&mut self, uid: u32, client: u64) -> Option<Seat> {
        let user = match self.by_uid.entry(uid) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => match Board::create() {
                Ok(board) => e.insert(UserBoard {
                    board: Arc::new(board),
                    bits: vec![None; BOARD_BITS as usize],
                    bells: vec![None; BOARD_BELLS as usize],
                    wakes: vec![0; BOARD_BITS as usize],
                }),
                Err(err) => {
                    tracing::warn!(uid, %err, "no fast-path board; this user's queues go through the daemon alone");
                    return None;
                }
            },
        };
        let bell = user.bells.iter().position(Option::is_none)? as u32;
        user.bells[bell as usize] = Some(client);
        Some(Seat {
            uid,
            bell,
            board: user.board.clone(),
        })
    }

    pub fn unseat(&mut self, seat: &Seat) {
        if let Some(user) = self.by_uid.get_mut(&seat.uid) {
            user.bells[seat.bell as usize] = None;
            // The user's last agent is gone: its board goes too, so that users who come and go
            // leave no descriptor or mapping behind.
            if user.bells.iter().all(Option::is_none) && user.bits.iter().all(Option::is_none) {
                self.by_uid.remove(&seat.uid);
            }
        }
    }

    /// A bit for a new queue of a seated agent.
    pub fn take_bit(&mut self, seat: &Seat, queue: QueueId) -> Option<u32> {
        let user = self.by_uid.get_mut(&seat.uid)?;
        let bit = user.bits.iter().position(Option::is_none)? as u32;
        user.bits[bit as usize] = Some(queue);
        // A bit left set by an earlier owner would stop queues for nothing.
        user.board.active().clear(bit);
        Some(bit)
    }

    /// The queue is gone: its bit is cleared on the board, and whoever it preempted is rung to
    /// look again.
    pub fn release_bit(&mut self, uid: u32, bit: u32) {
        let Some(user) = self.by_uid.get_mut(&uid) else {
            return;
        };
        user.bits[bit as usize] = None;
        let wakes = std::mem::take(&mut user.wakes[bit as usize]);
        if let Some(lane) = user.board.lane(bit) {
            lane.wakes.store(0);
        }
        user.board.active().clear(bit);
        user.board.ring(wakes);
    }

    fn set_wakes(&mut self, uid: u32, bit: u32, wakes: u128) {
        let Some(user) = self.by_uid.get_mut(&uid) else {
            return;
        };
        if user.wakes[bit as usize] != wakes {
            user.wakes[bit as usize] = wakes;
            if let Some(lane) = user.board.lane(bit) {
                lane.wakes.store(wakes);
            }
        }
    }
}

/// One queue of a device as the fast path sees it.
struct Seen {
    id: QueueId,
    client: u64,
    /// The user and bell of its agent, if seated and answering.
    seat: Option<(u32, u32)>,
    bit: Option<u32>,
    rank: i64,
    active: bool,
}

/// Which of `s`'s reports must ring the daemon at once. `seen` is every queue of its device,
/// `ranked` whether the policy's order alone decides there (no hooks).
fn quiet(s: &Seen, seen: &[Seen], ranked: bool) -> Quiet {
    let user = |x: &Seen| x.seat.map(|(uid, _)| uid);
    if !ranked {
        Quiet::Loud
    } else if seen.len() == 1 {
        Quiet::Alone
    } else if s.bit.is_some()
        && seen
            .iter()
            .all(|w| w.id == s.id || (w.rank < s.rank && w.bit.is_some() && user(w) == user(s)))
    {
        Quiet::Late
    } else {
        Quiet::Loud
    }
}

impl State {
    /// Brings the fast path's words of `device` in line with the last decision, writes the
    /// commands the decision changed, and rings the agents concerned.
    pub(super) fn refresh(&mut self, device: u32) {
        let Some(d) = self.devices.get_mut(&device) else {
            return;
        };
        if let Some(t) = self.trace.as_mut() {
            let now = self.epoch.elapsed().as_nanos() as Nanos;
            t.observe(device, now, &d.scheduler().snapshot(now));
        }
        let ranks = d.scheduler().preemption_ranks();
        let on_device = d.queues().count();
        let rank_of: BTreeMap<QueueId, (i64, bool)> = ranks
            .iter()
            .flatten()
            .map(|r| (r.id, (r.rank, r.active)))
            .collect();
        let seen: Vec<Seen> = d
            .queues()
            .filter_map(|(id, _)| {
                let e = self.queues.get(&id)?;
                let c = self.clients.get(&e.client)?;
                let (rank, active) = rank_of.get(&id).copied().unwrap_or((0, false));
                let seat = c
                    .seat
                    .as_ref()
                    .filter(|_| !c.silenced && ranks.is_some())
                    .map(|s| (s.uid, s.bell));
                Some(Seen {
                    id,
                    client: e.client,
                    seat,
                    bit: e.bit.filter(|_| seat.is_some()),
                    rank,
                    active,
                })
            })
            .collect();
        let ranked = ranks.is_some() && !d.scheduler().wants_work() && seen.len() == on_device;
        // Per user, the seated queues by rank, highest first.
        let mut by_user: BTreeMap<u32, Vec<&Seen>> = BTreeMap::new();
        for s in seen.iter().filter(|s| s.seat.is_some()) {
            by_user
                .entry(s.seat.map_or(0, |x| x.0))
                .or_default()
                .push(s);
        }
        for v in by_user.values_mut() {
            v.sort_by_key(|s| std::cmp::Reverse(s.rank));
        }
        let above = |s: &Seen| -> u128 {
            let Some((uid, _)) = s.seat else { return 0 };
            by_user[&uid]
                .iter()
                .take_while(|x| x.rank > s.rank)
                .filter_map(|x| x.bit)
                .fold(0, |m, b| m | Bits::mask(b))
        };
        let mut ring = BTreeSet::new();
        let mut wakes: BTreeMap<(u32, u32), u128> = BTreeMap::new();
        for s in &seen {
            let preempted_by = above(s);
            if let Some((uid, bell)) = s.seat {
                for x in by_user[&uid].iter().take_while(|x| x.rank > s.rank) {
                    if let Some(b) = x.bit {
                        *wakes.entry((uid, b)).or_default() |= Bits::mask(bell);
                    }
                }
            }
            let Some(e) = self.queues.get_mut(&s.id) else {
                continue;
            };
            let Some(seg) = self.clients.get(&s.client).and_then(|c| c.segment.clone()) else {
                continue;
            };
            let Some(slot) = seg.slot(e.slot) else {
                continue;
            };
            if e.preempted_by != preempted_by {
                e.preempted_by = preempted_by;
                slot.preempted_by.store(preempted_by);
                ring.insert(s.client);
            }
            let quiet = quiet(s, &seen, ranked);
            if e.quiet != quiet {
                e.quiet = quiet;
                slot.set_quiet(quiet);
            }
            let Some(q) = d.queue_mut(s.id) else { continue };
            // A suspension ends by itself when every rival for the device is above this queue
            // and will clear its bit (rivals: others with work that rank at least as high).
            let lift = if q.is_suspended() && s.seat.is_some() {
                let rivals: Vec<&Seen> = seen
                    .iter()
                    .filter(|w| w.id != s.id && w.active && w.rank >= s.rank)
                    .collect();
                let explained = !rivals.is_empty()
                    && rivals.iter().all(|w| {
                        w.rank > s.rank
                            && w.bit.is_some()
                            && w.seat.map(|x| x.0) == s.seat.map(|x| x.0)
                    });
                explained.then(|| {
                    rivals
                        .iter()
                        .filter_map(|w| w.bit)
                        .fold(0, |m, b| m | Bits::mask(b))
                })
            } else {
                None
            };
            if q.flush(lift) {
                ring.insert(s.client);
            }
        }
        for s in &seen {
            if let (Some((uid, _)), Some(bit)) = (s.seat, s.bit) {
                let w = wakes.get(&(uid, bit)).copied().unwrap_or(0);
                self.boards.set_wakes(uid, bit, w);
            }
        }
        for c in ring {
            self.ring_agent(c);
        }
    }

    /// Wakes a client's agent where it waits: its bell on the board, or its segment.
    pub(super) fn ring_agent(&self, client: u64) {
        let Some(c) = self.clients.get(&client) else {
            return;
        };
        match (&c.seat, &c.segment) {
            (Some(seat), _) => {
                if let Some(bell) = seat.board.bell(seat.bell) {
                    bell.ring();
                }
            }
            (None, Some(seg)) => seg.header().to_agent.ring(),
            (None, None) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(id: u32, uid: Option<u32>, rank: i64) -> Seen {
        Seen {
            id: QueueId(id),
            client: u64::from(id),
            seat: uid.map(|u| (u, id)),
            bit: uid.map(|_| id),
            rank,
            active: false,
        }
    }

    #[test]
    fn a_users_board_goes_with_its_last_agent() {
        let mut boards = Boards::default();
        let first = boards.seat(7, 1).unwrap();
        let second = boards.seat(7, 2).unwrap();
        boards.unseat(&first);
        assert_eq!(boards.by_uid.len(), 1, "one agent is still seated");
        boards.unseat(&second);
        assert!(boards.by_uid.is_empty());
    }

    #[test]
    fn a_queue_above_every_queue_of_its_board_may_ring_late() {
        let device = [
            seen(1, Some(7), 1),
            seen(2, Some(7), 0),
            seen(3, Some(7), 0),
        ];
        assert_eq!(quiet(&device[0], &device, true), Quiet::Late);
        assert_eq!(quiet(&device[1], &device, true), Quiet::Loud);
        assert_eq!(quiet(&device[0], &device, false), Quiet::Loud, "hooks");
        assert_eq!(quiet(&device[0], &device[..1], true), Quiet::Alone);
    }

    #[test]
    fn a_queue_below_it_off_its_board_needs_the_daemon_at_once() {
        for other in [
            seen(2, Some(8), 0), // another user's board
            seen(2, None, 0),    // silenced, or no seat
            seen(2, Some(7), 1), // as high: the daemon decides between them
        ] {
            let device = [seen(1, Some(7), 1), other];
            assert_eq!(quiet(&device[0], &device, true), Quiet::Loud);
        }
    }
}
