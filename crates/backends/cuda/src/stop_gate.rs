//! Lv2's stop ahead ([`xpreempt_hal::HwQueue::stop_ahead`]): the flag set before the queue's lock.
//!
//! A Lv2 stop takes the queue's lock, and the queue launches under that lock: a stop that comes
//! while the best-effort queue is in a launch call (8–12 µs at p50 under MPS on an H100) waits
//! for the call to return. The driver does not make the flag's set wait for another thread's
//! launch (measured on an H100, driver 580.159.04), so a stop ahead sets the flag at once,
//! from any thread, whenever the window as the lock holder left it may be stopped.
//!
//! The gate is the one word both sides agree through:
//! - the lock holder keeps it open exactly while a flag would be safe: the queue runs, and its
//!   window holds (or is about to hold) a guarded kernel with no unguarded command behind one;
//! - a stop ahead raises an open gate, sets the flag, and marks it raised;
//! - while it is raised, the lock holder launches no unguarded command (it would run before the
//!   stopped kernels' remaining blocks) and keeps the completion watermark where it is (a stopped
//!   kernel's event fires with blocks skipped), until the deactivate that must follow takes the
//!   stop over and lowers it.
//!
//! "Raising" (the flag's set not yet issued) is told apart from "raised", so that a deactivate
//! never takes over, and a reactivate never clears, a flag whose set is still to come: the set
//! would land after the clear and stop a queue that believes it runs.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

const OPEN: u32 = 1;
const RAISING: u32 = 2;
const RAISED: u32 = 3;

/// What the lock holder found when it closed the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// Nobody stops ahead now: the lock holder stops the queue itself, if it wants to.
    ByHolder,
    /// A stop ahead set the flag: the deactivate takes it over.
    Ahead,
}

#[derive(Debug, Default)]
pub struct StopGate(AtomicU32);

impl StopGate {
    pub const fn new() -> Self {
        Self(AtomicU32::new(0))
    }

    /// Any thread: the stop ahead. If the gate is open, raises it and issues the flag's set
    /// with `set`. `Ok(true)`: raised; `Ok(false)`: closed, nothing done; `Err`: the set could
    /// not be issued and the gate is closed (the caller settles it again under its lock).
    pub fn raise_with<E>(&self, set: impl FnOnce() -> Result<(), E>) -> Result<bool, E> {
        if !self.try_raise() {
            return Ok(false);
        }
        match set() {
            Ok(()) => {
                self.raised();
                Ok(true)
            }
            Err(e) => {
                self.raise_failed();
                Err(e)
            }
        }
    }

    fn try_raise(&self) -> bool {
        self.0
            .compare_exchange(OPEN, RAISING, SeqCst, SeqCst)
            .is_ok()
    }

    /// The flag's set is issued.
    fn raised(&self) {
        self.0.store(RAISED, SeqCst);
    }

    /// The set could not be issued: closed; the lock holder opens it again if it may.
    fn raise_failed(&self) {
        self.0.store(0, SeqCst);
    }

    /// Whether a stop ahead is under way: the watermark stays, unguarded launches wait.
    pub fn is_raised(&self) -> bool {
        self.0.load(SeqCst) >= RAISING
    }

    /// Under the queue's lock, before a launch. `stoppable_after`: the queue runs and its window
    /// with this command in it may be flagged (so the gate may open before the launch call, and
    /// a stop that comes during the call does not wait for it). `guarded`: the command is a
    /// guarded kernel. `false`: the launch must not happen (raised, and the command cannot be
    /// stopped with the rest).
    pub fn before_launch(&self, guarded: bool, stoppable_after: bool) -> bool {
        if guarded {
            // Looked at first: the gate is open already on most launches of a busy queue.
            if stoppable_after && self.0.load(SeqCst) == 0 {
                let _ = self.0.compare_exchange(0, OPEN, SeqCst, SeqCst);
            }
            return true;
        }
        self.close_unless_raised()
    }

    /// Under the queue's lock, after its window or state changed: open exactly when `stoppable`.
    /// A raised gate stays raised.
    pub fn settle(&self, stoppable: bool) {
        let want = if stoppable { OPEN } else { 0 };
        let _ = self.0.fetch_update(SeqCst, SeqCst, |cur| {
            (cur < RAISING && cur != want).then_some(want)
        });
    }

    /// Under the queue's lock, before the holder stops (or interrupts) the queue itself: closes
    /// the gate, waiting out a raise whose set is being issued.
    pub fn close(&self) -> Closed {
        loop {
            match self.0.load(SeqCst) {
                RAISED => return Closed::Ahead,
                RAISING => std::thread::yield_now(),
                cur => {
                    if cur == 0 || self.0.compare_exchange(cur, 0, SeqCst, SeqCst).is_ok() {
                        return Closed::ByHolder;
                    }
                }
            }
        }
    }

    /// Under the queue's lock, once the deactivate took a stop ahead over: closed.
    pub fn lower(&self) {
        self.0.store(0, SeqCst);
    }

    /// Closes an open gate; `false` if it is raised (or being raised).
    fn close_unless_raised(&self) -> bool {
        match self.0.compare_exchange(OPEN, 0, SeqCst, SeqCst) {
            Ok(_) => true,
            Err(cur) => cur < RAISING,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn only_an_open_gate_is_raised() {
        let g = StopGate::new();
        assert!(!g.try_raise(), "closed");
        g.settle(true);
        assert!(g.try_raise());
        assert!(!g.try_raise(), "raised once");
        assert!(g.is_raised());
        g.settle(true);
        g.settle(false);
        assert!(g.is_raised(), "settling leaves a raise alone");
        g.raised();
        assert!(!g.before_launch(false, false), "an unguarded launch waits");
        assert!(
            g.before_launch(true, true),
            "a guarded kernel is stopped with the rest"
        );
        assert_eq!(g.close(), Closed::Ahead);
        g.lower();
        assert!(!g.is_raised() && !g.try_raise());
    }

    #[test]
    fn a_failed_raise_closes_and_the_holder_opens_again() {
        let g = StopGate::new();
        g.settle(true);
        assert!(g.try_raise());
        g.raise_failed();
        assert!(!g.is_raised() && !g.try_raise());
        assert_eq!(g.close(), Closed::ByHolder);
        g.settle(true);
        assert!(g.try_raise());
    }

    #[test]
    fn a_launch_opens_or_closes_the_gate_before_its_call() {
        let g = StopGate::new();
        assert!(g.before_launch(true, true));
        assert!(g.try_raise(), "a stop during the guarded launch goes ahead");
        let g = StopGate::new();
        g.settle(true);
        assert!(g.before_launch(false, false));
        assert!(!g.try_raise(), "closed before an unguarded launch");
        assert!(g.before_launch(true, false));
        assert!(
            !g.try_raise(),
            "a guarded kernel behind an unguarded one keeps it closed"
        );
    }

    /// The lock holder launches commands (guarded or not) and settles; another thread raises
    /// whenever it can, and the holder hands over as a deactivate would. Checked: no unguarded
    /// command is launched while raised, and a raise finds a window the flag may stop.
    #[test]
    fn no_unguarded_launch_passes_a_raise() {
        for round in 0..10u64 {
            let gate = Arc::new(StopGate::new());
            let stop = Arc::new(AtomicBool::new(false));
            let started = Arc::new(std::sync::Barrier::new(2));
            let raiser = {
                let (gate, stop, started) = (gate.clone(), stop.clone(), started.clone());
                std::thread::spawn(move || {
                    started.wait();
                    let mut raises = 0u32;
                    while !stop.load(SeqCst) {
                        if gate.try_raise() {
                            raises += 1;
                            gate.raised();
                        }
                        std::hint::spin_loop();
                    }
                    raises
                })
            };
            // The window: a guarded kernel (true) or an unguarded command (false).
            let mut window: Vec<bool> = Vec::new();
            let mut rng = round.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut takeovers = 0;
            started.wait();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while takeovers < 200 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "round {round}: {takeovers} raises in 30 s"
                );
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                if gate.is_raised() && gate.close() == Closed::Ahead {
                    // Completions may have emptied it since; nothing unguarded got behind.
                    let clean = !window.iter().skip_while(|g| !**g).any(|g| !g);
                    assert!(clean, "raised on {window:?}");
                    // The deactivate takes over; a resume relaunches, then the window drains.
                    takeovers += 1;
                    gate.lower();
                    window.clear();
                    gate.settle(false);
                    continue;
                }
                let guarded = rng % 3 != 0;
                let clean = !window.iter().skip_while(|g| !**g).any(|g| !g);
                if gate.before_launch(guarded, guarded && clean) {
                    assert!(
                        guarded || !gate.is_raised(),
                        "an unguarded command launched while raised"
                    );
                    window.push(guarded);
                }
                // Completions keep the window short, as a queue's threshold does.
                if (rng % 5 == 0 || window.len() > 4) && !window.is_empty() && !gate.is_raised() {
                    window.remove(0);
                }
                let clean = !window.iter().skip_while(|g| !**g).any(|g| !g);
                gate.settle(clean && window.contains(&true));
            }
            stop.store(true, SeqCst);
            let raises = raiser.join().expect("raiser");
            assert!(
                takeovers + 1 >= raises,
                "every raise but the last is taken over"
            );
        }
    }
}
