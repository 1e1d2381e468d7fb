//! Pass-through mode (`xpreempt run --pass-through`): the application's launches go straight to
//! the driver, untouched, and the stream's queue only observes, so the scheduler still hears
//! Ready when the stream gets work and Idle when its last work has completed. Preemption is Lv3
//! alone (the process's timeslice), since nothing is held back.
//!
//! A launch costs two atomic operations: a count of real launches, and a flag that says a marker
//! is open. Only a launch on a stream with no open marker submits one to the queue (the Ready).
//! The completion watcher, waiting for that marker, records an event after the stream's latest
//! work and waits for it; if more work was launched meanwhile it goes on (once the launches
//! rest), so the marker (and the Idle) completes only once everything launched has. The flag is cleared before the launch
//! count is read again: a launch racing with the end of a marker is either seen by the watcher
//! or opens a marker of its own.
//!
//! A marker submitted while the queue is suspended stays in the pending buffer until the
//! resume, but the launch it stands for is already on the GPU: at Lv3 the process is then
//! interrupted at once ("held") and restored when the marker leaves the buffer.

use super::driver::{self, CtxGuard, SUCCESS};
use super::stream::{Observer, StreamHal, backend, poll_nap};
use std::sync::atomic::Ordering;
use xpreempt_hal::HalError;
use xpreempt_types::Seq;

impl Observer {
    /// The application's launch went to the driver: whether the queue must hear of it now.
    pub fn note_real_launch(&self) -> bool {
        self.real_launches.fetch_add(1, Ordering::SeqCst);
        !self.armed.swap(true, Ordering::SeqCst)
    }

    /// The marker could not be submitted: the next launch tries again.
    pub fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    /// The marker waits in the pending buffer (the queue is suspended) while its launch runs:
    /// interrupt the process until the marker leaves the buffer. `still_pending` is asked after
    /// the interrupt, so a resume that raced with it restores at once.
    pub fn hold(&self, still_pending: impl Fn() -> bool) {
        if self.held.swap(true, Ordering::SeqCst) {
            return;
        }
        if super::lv3::interrupt().is_err() {
            self.held.store(false, Ordering::SeqCst);
            return;
        }
        if !still_pending() {
            self.release_hold();
        }
    }

    /// The marker left the pending buffer (or the queue is going away): the process is
    /// restored if a held marker interrupted it.
    pub fn release_hold(&self) {
        if self.held.swap(false, Ordering::SeqCst) {
            let _ = super::lv3::restore();
        }
    }

    /// Waits until marker `upto - 1` has completed: everything launched on the stream so far.
    pub fn synchronize(&self, hal: &StreamHal, upto: Seq) -> Result<(), HalError> {
        loop {
            {
                let g = hal.lock();
                if g.retired || g.completed >= upto {
                    return Ok(());
                }
                if upto > g.launched {
                    return Err(HalError::WouldBlock(
                        "synchronize beyond the launched markers",
                    ));
                }
            }
            let seen = self.real_launches.load(Ordering::SeqCst);
            self.wait_for_stream(hal)?;
            self.armed.store(false, Ordering::SeqCst);
            if self.real_launches.load(Ordering::SeqCst) != seen
                && !self.armed.swap(true, Ordering::SeqCst)
            {
                // Launched meanwhile and no new marker covers it: this one stays open.
                self.until_launches_rest(hal);
                continue;
            }
            let mut g = hal.lock();
            g.completed = g.completed.max(upto);
            return Ok(());
        }
    }

    /// Naps until the stream goes a while without launches: an event recorded between them
    /// would contend with them in the driver.
    fn until_launches_rest(&self, hal: &StreamHal) {
        let mut seen = self.real_launches.load(Ordering::SeqCst);
        while !hal.is_gone() {
            std::thread::sleep(poll_nap());
            let now = self.real_launches.load(Ordering::SeqCst);
            if now == seen {
                return;
            }
            seen = now;
        }
    }

    /// Records an event after the stream's latest work and waits for it. A per-thread stream's
    /// own thread records it behind each of its calls (`StreamHal::owner_marked`): this thread
    /// would record on a stream of its own.
    fn wait_for_stream(&self, hal: &StreamHal) -> Result<(), HalError> {
        let ev = {
            let mut g = hal.lock();
            if g.retired {
                return Ok(());
            }
            if hal.owner_only() {
                let mark = *hal.owner_mark.lock().unwrap_or_else(|p| p.into_inner());
                let Some(ev) = mark else {
                    return Ok(());
                };
                hal.begin_poll();
                drop(g);
                let _ctx = CtxGuard::enter(hal.ctx);
                let r = poll(hal, ev as driver::Handle);
                hal.end_poll();
                return r;
            }
            let _ctx = CtxGuard::enter(hal.ctx);
            let ev = match g.free.pop() {
                Some(ev) => ev,
                None => driver::new_event().map_err(|e| backend("cuEventCreate", e))?,
            };
            match driver::cuEventRecord(ev, hal.stream) {
                SUCCESS => {}
                e => {
                    g.free.push(ev);
                    return Err(backend("cuEventRecord", e));
                }
            }
            // Counted under the lock, as in `StreamHal::synchronize`: `retire` waits for it.
            hal.begin_poll();
            ev
        };
        let r = poll(hal, ev);
        hal.end_poll();
        let mut g = hal.lock();
        // A retired queue's context may be gone with its events: nothing may touch them again.
        if !g.retired {
            g.free.push(ev);
        }
        drop(g);
        r
    }
}

/// Waits until `ev` has completed (or the queue is gone).
fn poll(hal: &StreamHal, ev: driver::Handle) -> Result<(), HalError> {
    loop {
        if hal.is_gone() {
            return Ok(());
        }
        match driver::cuEventQuery(ev) {
            driver::ERROR_NOT_READY => std::thread::sleep(poll_nap()),
            SUCCESS => return Ok(()),
            e => return Err(backend("cuEventQuery", e)),
        }
    }
}
