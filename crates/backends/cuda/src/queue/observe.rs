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
//! or opens a marker of its own. While a stream capture is in progress in the process the
//! watcher records nothing (`capture.rs`): its event would be captured with the application's
//! work.
//!
//! A marker submitted while the queue is suspended stays in the pending buffer until the
//! resume, but the launch it stands for is already on the GPU: at Lv3 the process is then
//! interrupted at once ("held") and restored when the marker leaves the buffer.

use super::{CudaQueue, backend, capture};
use crate::entry::{self, Handle, SUCCESS};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use xpreempt_hal::HalError;
use xpreempt_types::Seq;

/// A pass-through queue's view of its stream's real launches.
#[derive(Default)]
pub struct Observer {
    real_launches: AtomicU64,
    armed: AtomicBool,
    held: AtomicBool,
}

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

    /// Waits until marker `upto - 1` has completed: everything launched on the stream so far.
    pub(crate) fn synchronize(&self, hal: &CudaQueue, upto: Seq) -> Result<(), HalError> {
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
            if !self.wait_for_stream(hal)? {
                // A capture is in progress: nothing may be recorded until it ends.
                hal.nap();
                continue;
            }
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
    fn until_launches_rest(&self, hal: &CudaQueue) {
        let mut seen = self.real_launches.load(Ordering::SeqCst);
        while !hal.is_gone() {
            hal.nap();
            let now = self.real_launches.load(Ordering::SeqCst);
            if now == seen {
                return;
            }
            seen = now;
        }
    }

    /// Records an event after the stream's latest work and waits for it; false, with nothing
    /// recorded, while a stream capture is in progress (`capture.rs`). A per-thread stream's own
    /// thread records it behind each of its calls (`CudaQueue::owner_marked`): this thread would
    /// record on a stream of its own.
    fn wait_for_stream(&self, hal: &CudaQueue) -> Result<bool, HalError> {
        let ev = {
            let mut g = hal.lock();
            if g.retired {
                return Ok(true);
            }
            if hal.owner_only() {
                let mark = *hal.owner_mark.lock().unwrap_or_else(|p| p.into_inner());
                let Some(ev) = mark else {
                    return Ok(true);
                };
                hal.begin_poll();
                drop(g);
                let _ctx = hal.enter();
                let r = poll(hal, ev as Handle);
                hal.end_poll();
                return r.map(|()| true);
            }
            if capture::in_progress() {
                return Ok(false);
            }
            let _ctx = hal.enter();
            let ev = match g.free.pop() {
                Some(ev) => ev,
                None => entry::new_event(hal.drv).map_err(|e| backend("cuEventCreate", e))?,
            };
            match hal.drv.event_record(ev, hal.stream) {
                SUCCESS => {}
                e => {
                    g.free.push(ev);
                    return Err(backend("cuEventRecord", e));
                }
            }
            // Counted under the lock, as in `CudaQueue::synchronize`: `retire` waits for it.
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
        r.map(|()| true)
    }
}

impl CudaQueue {
    /// The marker waits in the pending buffer (the queue is suspended) while its launch runs:
    /// interrupt the process until the marker leaves the buffer. `still_pending` is asked after
    /// the interrupt, so a resume that raced with it restores at once.
    pub fn hold(&self, still_pending: impl Fn() -> bool) {
        let (Some(o), Some(lv3)) = (&self.observer, &self.lv3) else {
            return;
        };
        if o.held.swap(true, Ordering::SeqCst) {
            return;
        }
        if lv3.interrupt().is_err() {
            o.held.store(false, Ordering::SeqCst);
            return;
        }
        if !still_pending() {
            self.release_hold();
        }
    }

    /// The marker left the pending buffer (or the queue is going away): the process is
    /// restored if a held marker interrupted it.
    pub fn release_hold(&self) {
        if let Some(o) = &self.observer
            && o.held.swap(false, Ordering::SeqCst)
        {
            self.restore_timeslice();
        }
    }
}

/// Waits until `ev` has completed (or the queue is gone).
fn poll(hal: &CudaQueue, ev: Handle) -> Result<(), HalError> {
    loop {
        if hal.is_gone() {
            return Ok(());
        }
        match hal.drv.event_query(ev) {
            entry::ERROR_NOT_READY => hal.nap(),
            SUCCESS => return Ok(()),
            e => return Err(backend("cuEventQuery", e)),
        }
    }
}
