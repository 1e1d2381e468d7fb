//! `CudaQueue`: the HAL over one CUstream. Lv1 progressive launching with event sync points
//! (here), Lv2 block-level preemption through the guard flag (`lv2.rs`), Lv3 through the
//! process-wide channel-group timeslice (`lv3.rs`).
//!
//! Exactly-once rule of `launch`: an `Err` means nothing was handed to the hardware. Whatever can
//! fail (taking a sync event, a completion slot) happens before the launch; after it, failures
//! are logged and a later `record_sync`/`synchronize` covers the completion.

use crate::driver::{Device, DeviceBuffer};
use crate::error::{CudaError, Result, cu};
use crate::flight::{Flight, flag_is_safe, is_clean};
use crate::kernel::Kernel;
use crate::lv2::Relaunch;
use crate::lv3::ProcessLv3;
use crate::placement;
use crate::stop_gate::{Closed, StopGate};
use cudarc::driver::sys;
use std::collections::VecDeque;
use std::sync::atomic::AtomicI32;
use std::sync::{Arc, Mutex, MutexGuard};
use xpreempt_hal::{HalError, HwQueue};
use xpreempt_types::{Command, Launched, Level, Op, Seq};

/// Settings of one CUDA queue.
#[derive(Clone, Debug)]
pub struct CudaQueueConfig {
    /// Highest level this queue may use (capped by what works here).
    pub level: Level,
    /// CUDA stream priority (smaller = higher; see `Device::stream_priority_range`).
    pub stream_priority: i32,
    /// Completion-array slots: at least the queue's threshold + 1.
    pub slots: u32,
    /// Most completion words (blocks or items) one guarded launch may use.
    pub max_units: u32,
    /// The process's Lv3 control, where Lv3 is available (a queue at `level` Lv3 without it
    /// uses Lv2/Lv1).
    pub lv3: Option<ProcessLv3>,
}

impl Default for CudaQueueConfig {
    fn default() -> Self {
        Self {
            level: Level::Lv2,
            stream_priority: 0,
            slots: 64,
            max_units: 1 << 18,
            lv3: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Running,
    /// Flag set; completion frozen at the value it had. Stays so until a reactivate has
    /// relaunched every stopped kernel.
    Flagged,
    /// Not safe (or nothing) to flag: the window drains as at Lv1.
    Draining,
    /// Lv3: this queue holds one count of the process's interrupted timeslice.
    Interrupted,
}

/// Sync events beyond one per command of the window (record_sync, synchronize).
const EVENT_MARGIN: usize = 8;

/// Sync events a queue creates up front. The XQueue's window is below `slots` commands, each
/// sync event proves a distinct watermark inside it, and reaping returns them: steady state never
/// creates an event on the launch path.
pub(crate) fn event_pool_size(slots: u32) -> usize {
    slots as usize + EVENT_MARGIN
}

pub(crate) struct Inner {
    pub(crate) stream: sys::CUstream,
    streams: Vec<(i32, sys::CUstream)>,
    pub(crate) free_events: Vec<sys::CUevent>,
    /// (watermark the event proves, event), oldest first; watermarks strictly increase.
    pub(crate) sync: VecDeque<(Seq, sys::CUevent)>,
    pub(crate) completed: Seq,
    launched: Seq,
    pub(crate) flight: Flight,
    pub(crate) stop: Stop,
    /// Progress of a reactivate while `stop` is `Flagged`.
    pub(crate) relaunch: Relaunch,
    pub(crate) stop_event: sys::CUevent,
    /// `stop_event` was recorded for the current stop (it may come after the flag's set).
    pub(crate) stop_recorded: bool,
    /// Recorded on the control stream after the flag is cleared; the queue stream waits on it.
    pub(crate) clear_event: sys::CUevent,
    move_event: sys::CUevent,
    pub(crate) next_slot: u32,
    pub(crate) epoch: u32,
    /// Counts resets of `sync` (a reactivate drops events recorded before the stop), so that a
    /// wait that began before one does not retire work with what its event proved then.
    pub(crate) sync_resets: u64,
    /// The pool ran dry once (warned).
    pool_warned: bool,
}

// SAFETY: the streams and events are driver handles that any thread may use once the context
// is current there (every entry point binds it first); `Inner` owns them, and only ever moves
// between threads inside `CudaQueue`'s mutex.
unsafe impl Send for Inner {}

pub struct CudaQueue {
    device: Arc<Device>,
    pub(crate) cfg: CudaQueueConfig,
    pub(crate) level: Level,
    inner: Mutex<Inner>,
    pub(crate) control: sys::CUstream,
    pub(crate) flag: DeviceBuffer,
    /// Open while a stop ahead may set the flag without the lock (`lv2.rs`).
    pub(crate) gate: StopGate,
    pub(crate) done: DeviceBuffer,
    lv3: Option<ProcessLv3>,
    /// Where the application's thread last launched (`crate::placement`).
    launcher_cpu: AtomicI32,
}

// SAFETY: the mutable state sits in a Mutex (`Inner`, Send above) or in the atomic gate; the rest
// is set in `new` and only read afterwards: the control stream handle (the driver serializes work
// on a stream; a stop ahead issues on it without the mutex, ordered by the gate), the device
// buffers (owned, freed once in Drop after the streams are synchronized).
unsafe impl Send for CudaQueue {}
// SAFETY: as above: `&CudaQueue` mutates nothing outside the mutex and the gate.
unsafe impl Sync for CudaQueue {}

fn new_event() -> Result<sys::CUevent> {
    let mut ev: sys::CUevent = std::ptr::null_mut();
    // SAFETY: `ev` is a live local; the caller bound the queue's context.
    cu!(cuEventCreate(
        &mut ev,
        sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
    ))?;
    Ok(ev)
}

fn new_stream(priority: i32) -> Result<sys::CUstream> {
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: `s` is a live local; the caller bound the queue's context.
    cu!(cuStreamCreateWithPriority(
        &mut s,
        sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
        priority
    ))?;
    Ok(s)
}

impl CudaQueue {
    pub fn new(device: Arc<Device>, cfg: CudaQueueConfig) -> Result<Self> {
        device.bind()?;
        let (_, greatest) = device.stream_priority_range()?;
        let stream = new_stream(cfg.stream_priority)?;
        let control = new_stream(greatest)?;
        let pool = event_pool_size(cfg.slots);
        let mut free_events = Vec::with_capacity(pool);
        for _ in 0..pool {
            free_events.push(new_event()?);
        }
        let lv3 = if cfg.level >= Level::Lv3 {
            cfg.lv3.clone()
        } else {
            None
        };
        let level = match (&lv3, cfg.level) {
            (Some(_), _) => Level::Lv3,
            (None, l) => l.min(Level::Lv2),
        };
        let inner = Inner {
            stream,
            streams: vec![(cfg.stream_priority, stream)],
            free_events,
            sync: VecDeque::with_capacity(pool),
            completed: 0,
            launched: 0,
            flight: Flight::new(cfg.slots, pool),
            stop: Stop::Running,
            relaunch: Relaunch::default(),
            stop_event: new_event()?,
            stop_recorded: false,
            clear_event: new_event()?,
            move_event: new_event()?,
            next_slot: 0,
            epoch: 0,
            sync_resets: 0,
            pool_warned: false,
        };
        Ok(Self {
            flag: DeviceBuffer::zeroed(4)?,
            gate: StopGate::new(),
            done: DeviceBuffer::zeroed(cfg.slots as usize * cfg.max_units as usize * 4)?,
            device,
            level,
            cfg,
            inner: Mutex::new(inner),
            control,
            lv3,
            launcher_cpu: AtomicI32::new(-1),
        })
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Makes the device's context current on this thread, once per thread.
    pub(crate) fn bind(&self) -> Result<()> {
        thread_local! {
            static BOUND: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
        }
        let ctx = self.device.ctx as usize;
        if BOUND.with(|b| b.get()) != ctx {
            self.device.bind()?;
            BOUND.with(|b| b.set(ctx));
        }
        Ok(())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked; the state is still consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the queue to a stream of another CUDA priority, keeping its order: the new stream
    /// waits for everything launched on the old one. Off the hot path (scheduler remaps).
    pub fn set_stream_priority(&self, priority: i32) -> Result<()> {
        self.device.bind()?;
        let mut g = self.lock();
        let target = match g.streams.iter().find(|(p, _)| *p == priority) {
            Some(&(_, s)) => s,
            None => {
                let s = new_stream(priority)?;
                g.streams.push((priority, s));
                s
            }
        };
        if target == g.stream {
            return Ok(());
        }
        let ev = g.move_event;
        // SAFETY: the event and both streams are this queue's, alive until Drop; the lock is
        // held, so no other record of `move_event` interleaves.
        cu!(cuEventRecord(ev, g.stream))?;
        // SAFETY: as above.
        cu!(cuStreamWaitEvent(target, ev, 0))?;
        g.stream = target;
        Ok(())
    }

    /// A sync event from the pool. A dry pool first reaps; creating an event is the last resort
    /// (a window larger than the queue's slots) and is reported once.
    pub(crate) fn take_event(&self, g: &mut Inner) -> Result<sys::CUevent> {
        if let Some(e) = g.free_events.pop() {
            return Ok(e);
        }
        self.reap(g);
        if let Some(e) = g.free_events.pop() {
            return Ok(e);
        }
        if !g.pool_warned {
            g.pool_warned = true;
            tracing::warn!(
                slots = self.cfg.slots,
                "sync-event pool ran dry: the queue's window exceeds its slots; creating events"
            );
        }
        new_event()
    }

    /// Records a sync event proving `watermark` and returns it. An error means nothing was
    /// recorded.
    pub(crate) fn record(&self, g: &mut Inner, watermark: Seq) -> Result<sys::CUevent> {
        let ev = self.take_event(g)?;
        // SAFETY: `ev` came from this queue's pool and is not recorded elsewhere; `g.stream` is
        // the queue's live stream.
        if let Err(e) = cu!(cuEventRecord(ev, g.stream)) {
            g.free_events.push(ev);
            return Err(e);
        }
        g.sync.push_back((watermark, ev));
        Ok(ev)
    }

    /// Records an already taken event after a launch; never fails (the launch must not be
    /// reported as failed). Without the event, a later record_sync/synchronize covers it.
    pub(crate) fn record_taken(g: &mut Inner, ev: sys::CUevent, watermark: Seq) {
        // SAFETY: `ev` was taken from the pool by the caller; `g.stream` is live.
        match cu!(cuEventRecord(ev, g.stream)) {
            Ok(()) => g.sync.push_back((watermark, ev)),
            Err(e) => {
                g.free_events.push(ev);
                tracing::warn!(%e, watermark, "sync event not recorded after a launch; a later sync point covers it");
            }
        }
    }

    /// The completion watermark stays: the flag is up, or a stop ahead is raising it, and a
    /// stopped kernel's event fires with blocks skipped.
    pub(crate) fn frozen(&self, g: &Inner) -> bool {
        g.stop == Stop::Flagged || self.gate.is_raised()
    }

    pub(crate) fn reap(&self, g: &mut Inner) {
        if self.frozen(g) {
            return;
        }
        let mut passed = 0;
        for &(_, ev) in &g.sync {
            // SAFETY: `ev` is in `g.sync`, so it is a live event of this queue (destroyed only
            // in Drop); the lock is held.
            let r = unsafe { sys::cuEventQuery(ev) };
            if r != sys::CUresult::CUDA_SUCCESS {
                if r != sys::CUresult::CUDA_ERROR_NOT_READY {
                    tracing::error!(?r, "cuEventQuery failed");
                }
                break;
            }
            passed += 1;
        }
        // Looked at after the queries: a stop ahead raised since may have cut short what they
        // saw end; one raised later set its flag after they ended, so they ran whole.
        if passed == 0 || self.gate.is_raised() {
            return;
        }
        for (mark, ev) in g.sync.drain(..passed) {
            g.free_events.push(ev);
            g.completed = g.completed.max(mark);
        }
        let done = g.completed;
        g.flight.retire_below(done);
        self.settle(g);
    }

    /// Opens the gate exactly while a stop ahead may flag the window as it stands.
    pub(crate) fn settle(&self, g: &Inner) {
        self.gate.settle(
            self.level >= Level::Lv2 && g.stop == Stop::Running && flag_is_safe(g.flight.slots()),
        );
    }

    /// A wait on the event of `mark` (picked when `sync_resets` was `resets`) ended: everything
    /// up to `mark` completed, and so did every older sync event, which goes back to the pool
    /// without a query. Not while flagged: a stopped kernel's event fires with blocks skipped.
    fn reached(&self, g: &mut Inner, mark: Seq, resets: u64) {
        if self.frozen(g) || g.sync_resets != resets {
            return;
        }
        g.completed = g.completed.max(mark);
        xpreempt_hal::sync_events::retire_reached(&mut g.sync, &mut g.free_events, mark);
        let done = g.completed;
        g.flight.retire_below(done);
        self.settle(g);
    }
}

impl HwQueue for CudaQueue {
    type Payload = Kernel;

    fn max_level(&self) -> Level {
        self.level
    }

    fn launch(
        &self,
        seq: Seq,
        command: &mut Command<Kernel>,
        sync_point: bool,
    ) -> Result<(), HalError> {
        self.launch_inner(seq, command, sync_point)
            .map_err(|e| e.into_hal("launch"))
    }

    fn record_sync(&self) -> Result<(), HalError> {
        self.bind().map_err(|e| e.into_hal("record_sync"))?;
        let mut g = self.lock();
        let tail = g.launched;
        if g.sync.back().map(|&(m, _)| m) != Some(tail) && g.completed < tail {
            self.record(&mut g, tail)
                .map_err(|e| e.into_hal("record_sync"))?;
        }
        Ok(())
    }

    /// What `synchronize` has seen complete: no driver call here, since the XQueue calls this
    /// under its own lock, which every submission takes.
    fn completed(&self) -> Seq {
        self.lock().completed
    }

    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        self.synchronize_inner(upto)
            .map_err(|e| e.into_hal("synchronize"))
    }

    fn settled(&self) -> bool {
        let mut g = self.lock();
        match g.stop {
            Stop::Flagged | Stop::Draining => {
                if !g.stop_recorded && (self.bind().is_err() || self.record_stop(&mut g).is_err()) {
                    return false;
                }
                // SAFETY: `stop_event` lives until Drop; the lock is held.
                unsafe { sys::cuEventQuery(g.stop_event) == sys::CUresult::CUDA_SUCCESS }
            }
            Stop::Running | Stop::Interrupted => true,
        }
    }

    fn stop_ahead(&self) -> bool {
        self.level >= Level::Lv2 && self.lv2_stop_ahead()
    }

    fn deactivate(&self) -> Result<(), HalError> {
        if self.level < Level::Lv2 {
            return Err(self.unsupported("deactivate", Level::Lv2));
        }
        self.lv2_deactivate().map_err(|e| e.into_hal("deactivate"))
    }

    fn reactivate(&self, log: &mut [Launched<Kernel>]) -> Result<(), HalError> {
        self.lv2_reactivate(log)
            .map_err(|e| e.into_hal("reactivate"))
    }

    fn interrupt(&self) -> Result<(), HalError> {
        let Some(lv3) = &self.lv3 else {
            return Err(self.unsupported("interrupt", Level::Lv3));
        };
        let mut g = self.lock();
        if g.stop == Stop::Interrupted {
            return Ok(()); // this queue already holds its count
        }
        if self.gate.close() == Closed::Ahead {
            return Err(CudaError::StopAheadPending.into_hal("interrupt"));
        }
        if let Err(e) = lv3.interrupt() {
            self.settle(&g);
            return Err(e.into_hal("interrupt"));
        }
        g.stop = Stop::Interrupted;
        Ok(())
    }

    fn restore(&self, _log: &mut [Launched<Kernel>]) -> Result<(), HalError> {
        let Some(lv3) = &self.lv3 else {
            return Err(self.unsupported("restore", Level::Lv3));
        };
        let mut g = self.lock();
        if g.stop != Stop::Interrupted {
            return Ok(()); // nothing of this queue to give back
        }
        lv3.restore().map_err(|e| e.into_hal("restore"))?;
        g.stop = Stop::Running;
        self.settle(&g);
        Ok(())
    }
}

impl CudaQueue {
    fn launch_inner(
        &self,
        seq: Seq,
        command: &mut Command<Kernel>,
        sync_point: bool,
    ) -> Result<()> {
        self.bind()?;
        let mut g = self.lock();
        // Everything that can fail comes first: once the command is on the stream, an `Err`
        // would make the XQueue launch it a second time.
        let ev = if sync_point {
            Some(self.take_event(&mut g)?)
        } else {
            None
        };
        let guarded = matches!(&command.op, Op::Kernel(k) if k.guard.is_some());
        let stoppable_after = guarded
            && self.level >= Level::Lv2
            && g.stop == Stop::Running
            && is_clean(g.flight.slots());
        let launched = if self.gate.before_launch(guarded, stoppable_after) {
            self.launch_op(&mut g, command)
        } else {
            Err(CudaError::Stopping)
        };
        let slot = match launched {
            Ok(slot) => slot,
            Err(e) => {
                if let Some(ev) = ev {
                    g.free_events.push(ev);
                }
                self.settle(&g);
                return Err(e);
            }
        };
        g.launched = seq + 1;
        if !placement::is_xpreempt_thread() {
            placement::note_launcher(&self.launcher_cpu);
        }
        g.flight.push(seq, slot);
        if let Some(ev) = ev {
            Self::record_taken(&mut g, ev, seq + 1);
        }
        // The window with this command in it is what `stoppable_after` judged: no second walk
        // of it on the launch path. (A reap inside the launch only retired its oldest entries,
        // which never makes a safe window unsafe.)
        self.gate.settle(stoppable_after);
        Ok(())
    }

    fn synchronize_inner(&self, upto: Seq) -> Result<()> {
        self.bind()?;
        placement::step_aside(&self.launcher_cpu);
        loop {
            let (mark, ev, resets) = {
                let mut g = self.lock();
                if g.completed >= upto {
                    return Ok(());
                }
                if self.frozen(&g) {
                    // Stopped work completes only after reactivate; the caller polls again.
                    return Ok(());
                }
                if upto > g.launched {
                    return Err(CudaError::SyncBeyondLaunch {
                        upto,
                        launched: g.launched,
                    });
                }
                let (mark, ev) = match g.sync.iter().find(|&&(m, _)| m >= upto) {
                    Some(&found) => found,
                    None => {
                        let tail = g.launched;
                        (tail, self.record(&mut g, tail)?)
                    }
                };
                (mark, ev, g.sync_resets)
            };
            // SAFETY: `ev` is a pool event of this queue, destroyed only in Drop (which cannot
            // run while `&self` is borrowed); waiting without the lock is what lets completion
            // and other launches go on meanwhile. A concurrent reap may put the event back in the
            // pool and a later record reuse it, which only makes this wait end later.
            cu!(cuEventSynchronize(ev))?;
            self.reached(&mut self.lock(), mark, resets);
        }
    }
}

impl Drop for CudaQueue {
    fn drop(&mut self) {
        let g = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        if g.stop == Stop::Interrupted
            && let Some(lv3) = &self.lv3
            && let Err(e) = lv3.restore()
        {
            tracing::warn!(%e, "dropping an interrupted queue: Lv3 restore failed");
        }
        // SAFETY: every handle here was created by this queue and is destroyed once; each stream
        // is synchronized before it is destroyed, so no work still uses the events, the flag or
        // the completion array (freed after this, with the fields).
        unsafe {
            for &(_, s) in &g.streams {
                let _ = sys::cuStreamSynchronize(s);
                let _ = sys::cuStreamDestroy_v2(s);
            }
            let _ = sys::cuStreamSynchronize(self.control);
            let _ = sys::cuStreamDestroy_v2(self.control);
            for &(_, e) in &g.sync {
                let _ = sys::cuEventDestroy_v2(e);
            }
            for &e in g
                .free_events
                .iter()
                .chain([&g.stop_event, &g.clear_event, &g.move_event])
            {
                let _ = sys::cuEventDestroy_v2(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_pool_covers_the_window() {
        // The XQueue's window is below `slots` commands, one sync event each at most.
        for slots in [1, 12, 20, 64] {
            assert!(event_pool_size(slots) >= slots as usize + 2);
        }
    }
}
