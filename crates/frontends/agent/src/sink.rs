//! Where the process's queues report. Ready/Idle go into the queue's slot, flip the queue's bit
//! on the board (ringing the agents of the queues it preempts), and ring the daemon unless it
//! said it needs no doorbell for the queue, or none at once (then the queue's completion watcher
//! rings, off the application's thread: a ring is a system call while the daemon sleeps);
//! admission retries and hook work go over the socket; without a daemon everything goes to the
//! local scheduler.

use crate::{Inner, Mode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use xpreempt_core::QueueId;
use xpreempt_core::sched::QueueReport;
use xpreempt_core::xqueue::threaded::{EventSink, ReportSink};
use xpreempt_ipc::board::Board;
use xpreempt_ipc::frame;
use xpreempt_ipc::msg::ClientMsg;
use xpreempt_ipc::shm::{Doorbell, Quiet, encode_report};

/// The agent, held weakly, and its mirror of whether the scheduler wants work reports (read on
/// every submission, so it stays one atomic load).
struct Sink(Weak<Inner>, Arc<AtomicBool>);

pub(crate) fn sink(inner: &Arc<Inner>) -> EventSink {
    Arc::new(Sink(Arc::downgrade(inner), Arc::clone(&inner.wants_work)))
}

/// Refreshes the mirror from whoever schedules now (the daemon's segment, or the local
/// scheduler); the control thread calls it on every turn.
pub(crate) fn mirror_wants_work(inner: &Inner) {
    let wants = match &*inner.mode.read().unwrap_or_else(|p| p.into_inner()) {
        Mode::Remote(conn) => conn.segment.header().wants_work.load(Ordering::Relaxed) != 0,
        Mode::Local => inner.local_sink.wants_work(),
    };
    inner.wants_work.store(wants, Ordering::Relaxed);
}

/// Stores a report word unless a newer one is already there: reports race between the
/// submitting thread, the completion watcher and the control thread.
pub(crate) fn store_newest(word: &AtomicU64, report: u64) -> bool {
    let mut cur = word.load(Ordering::SeqCst);
    loop {
        if cur >> 32 >= report >> 32 && cur != 0 {
            return false;
        }
        match word.compare_exchange_weak(cur, report, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

/// Publishes a queue's Ready/Idle (remote: into its slot, ringing the daemon).
pub(crate) fn publish(inner: &Inner, mode: &Mode, queue: QueueId, report: QueueReport) {
    let Some(word) = encode_report(report) else {
        return;
    };
    let Some(latest) = inner.reports.get(queue.0 as usize) else {
        return;
    };
    store_newest(latest, word);
    match mode {
        Mode::Remote(conn) if !inner.is_local_slot(queue) => {
            let Some(slot) = conn.segment.slot(queue.0) else {
                return;
            };
            let board = conn
                .board
                .as_ref()
                .map(|(b, _)| b)
                .zip(bit_of(inner, queue));
            // Set before the daemon can see the Ready: a suspension it lifts on this bit must
            // not find the bit clear while the queue has work.
            if let Some((b, bit)) = board
                && is_active(word)
            {
                b.announce(bit, true);
            }
            let stored = store_newest(&slot.report, word);
            if let Some((b, bit)) = board {
                show_on_board(b, bit, &slot.report);
            }
            if stored && let Some(owed) = inner.rings_owed.get(queue.0 as usize) {
                ring_daemon(&conn.segment.header().to_daemon, slot.quiet(), owed);
            }
        }
        _ => inner.local_sink.report(queue, report),
    }
}

/// Rings the daemon for a report just stored, as the slot's `quiet` says: not at all, at once,
/// or (a report the board has acted on already) later, when the queue's watcher flushes.
pub(crate) fn ring_daemon(bell: &Doorbell, quiet: Quiet, owed: &AtomicBool) {
    match quiet {
        Quiet::Alone => {}
        Quiet::Late => owed.store(true, Ordering::SeqCst),
        Quiet::Loud => {
            owed.store(false, Ordering::SeqCst);
            bell.ring();
        }
    }
}

/// Pays a ring of the daemon that `ring_daemon` put off for `queue`, if any.
pub(crate) fn pay_owed_ring(inner: &Inner, mode: &Mode, queue: usize) {
    let Some(owed) = inner.rings_owed.get(queue) else {
        return;
    };
    if owed.swap(false, Ordering::SeqCst)
        && let Mode::Remote(conn) = mode
    {
        conn.segment.header().to_daemon.ring();
    }
}

/// Whether a report word says the queue has work.
pub(crate) fn is_active(word: u64) -> bool {
    word & (1 << 31) != 0 && word >> 32 != 0
}

pub(crate) fn bit_of(inner: &Inner, queue: QueueId) -> Option<u32> {
    inner
        .bits
        .get(queue.0 as usize)
        .map(|b| b.load(Ordering::SeqCst))
        .and_then(|b| b.checked_sub(1))
}

/// Makes the queue's bit say what its newest report says. Reports race between threads (the
/// submitter's Ready, the watcher's Idle), so after flipping the bit it looks again: whoever
/// stored the newest report leaves the bit matching it.
fn show_on_board(board: &Board, bit: u32, report: &AtomicU64) {
    loop {
        let word = report.load(Ordering::SeqCst);
        board.announce(bit, is_active(word));
        if report.load(Ordering::SeqCst) == word {
            return;
        }
    }
}

impl Sink {
    /// Connected: `remote` on the queue's board bit and report word, where it has a bit.
    /// Unconnected: `local` on the local scheduler's sink.
    fn on_board(
        &self,
        queue: QueueId,
        local: impl FnOnce(&dyn ReportSink, QueueId),
        remote: impl FnOnce(&Board, u32, &AtomicU64),
    ) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        let mode = inner.mode.read().unwrap_or_else(|p| p.into_inner());
        match &*mode {
            Mode::Remote(conn) if !inner.is_local_slot(queue) => {
                if let Some(bit) = bit_of(&inner, queue)
                    && let Some((board, _)) = &conn.board
                    && let Some(slot) = conn.segment.slot(queue.0)
                {
                    remote(board, bit, &slot.report);
                }
            }
            _ => local(&*inner.local_sink, queue),
        }
    }
}

impl ReportSink for Sink {
    fn report(&self, queue: QueueId, report: QueueReport) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        let mode = inner.mode.read().unwrap_or_else(|p| p.into_inner());
        match report {
            QueueReport::Ready { .. } | QueueReport::Idle { .. } => {
                publish(&inner, &mode, queue, report)
            }
            QueueReport::Retry
            | QueueReport::Submitted { .. }
            | QueueReport::Completed { .. }
            | QueueReport::Inherit { .. } => {
                match &*mode {
                    Mode::Remote(conn) if !inner.is_local_slot(queue) => {
                        let remote = inner
                            .lock_queues()
                            .get(queue.0 as usize)
                            .and_then(|e| e.as_ref())
                            .and_then(|e| e.remote);
                        let Some(remote) = remote else { return };
                        let msg = match report {
                            QueueReport::Retry => ClientMsg::Retry { queue: remote },
                            QueueReport::Submitted { kind, seq } => ClientMsg::Work {
                                queue: remote,
                                work: xpreempt_core::sched::Work::Submitted { kind, seq },
                            },
                            QueueReport::Completed { upto } => ClientMsg::Work {
                                queue: remote,
                                work: xpreempt_core::sched::Work::Completed { upto },
                            },
                            QueueReport::Inherit { priority } => ClientMsg::Inherit {
                                queue: remote,
                                priority,
                            },
                            _ => return,
                        };
                        let mut s = conn.stream.lock().unwrap_or_else(|p| p.into_inner());
                        if let Err(e) = frame::write(&mut *s, &msg) {
                            // A write cut short leaves the stream mid-frame: not used again.
                            conn.broken.store(true, Ordering::SeqCst);
                            tracing::debug!(%e, "report to the daemon lost; the control thread gives the connection up");
                        }
                    }
                    _ => inner.local_sink.report(queue, report),
                }
            }
        }
    }

    fn wants_work(&self) -> bool {
        self.1.load(Ordering::Relaxed)
    }

    /// The fast path: an idle queue with a board bit shows it has work before its first launch,
    /// so the queues it preempts stop while the launch goes on (locally: the local scheduler's
    /// own fast path).
    fn submitting(&self, queue: QueueId) {
        self.on_board(
            queue,
            |s, q| s.submitting(q),
            |board, bit, report| {
                if !is_active(report.load(Ordering::SeqCst)) {
                    board.announce(bit, true);
                }
            },
        );
    }

    /// The announced submission failed: the bit goes back to what the queue's report says.
    fn submit_failed(&self, queue: QueueId) {
        self.on_board(queue, |s, q| s.submit_failed(q), show_on_board);
    }

    /// Connected, with the board carrying the queue's reports ([`Quiet::Late`]), an Idle is a
    /// report word and a board bit (the agents it rings spin while it preempts them, and the
    /// daemon's ring waits for the watcher): the waiter reports it, and the queues it frees
    /// resume in their own processes at once.
    fn idle_from_waiter(&self, queue: QueueId) -> bool {
        let Some(inner) = self.0.upgrade() else {
            return false;
        };
        match &*inner.mode.read().unwrap_or_else(|p| p.into_inner()) {
            Mode::Remote(_) if inner.is_local_slot(queue) => false,
            Mode::Remote(conn) => conn
                .segment
                .slot(queue.0)
                .is_some_and(|s| s.quiet() == Quiet::Late),
            Mode::Local => false,
        }
    }

    fn flush(&self, queue: QueueId) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        if inner
            .rings_owed
            .get(queue.0 as usize)
            .is_some_and(|owed| owed.load(Ordering::Relaxed))
        {
            let mode = inner.mode.read().unwrap_or_else(|p| p.into_inner());
            pay_owed_ring(&inner, &mode, queue.0 as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_the_board_acted_on_leaves_its_ring_of_the_daemon_owed() {
        let bell = Doorbell::new();
        let owed = AtomicBool::new(false);
        ring_daemon(&bell, Quiet::Late, &owed);
        ring_daemon(&bell, Quiet::Late, &owed);
        assert_eq!(bell.value(), 0, "rang on the application's thread");
        assert!(owed.load(Ordering::SeqCst));
        // A loud report rings at once, and its ring carries what was owed.
        ring_daemon(&bell, Quiet::Loud, &owed);
        assert_eq!(bell.value(), 1);
        assert!(!owed.load(Ordering::SeqCst));
        ring_daemon(&bell, Quiet::Alone, &owed);
        assert_eq!(bell.value(), 1);
        assert!(!owed.load(Ordering::SeqCst));
    }
}
