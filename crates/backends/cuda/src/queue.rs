//! `CudaQueue`: the HAL over one CUstream. Lv1 progressive launching with event sync points
//! (here), Lv2 block-level preemption through the guard flag (`lv2.rs`), Lv3 through the
//! process-wide channel-group timeslice (`lv3.rs`).
//!
//! Exactly-once rule of `launch`: an `Err` means nothing was handed to the hardware. Whatever can
//! fail (taking a sync event, a completion slot) happens before the launch; after it, failures
//! are logged and a later `record_sync`/`synchronize` covers the completion.

use crate::cu;
use crate::driver::{Device, DeviceBuffer, PinnedWords};
use crate::error::{CudaError, Result};
use crate::flight::Flight;
use crate::kernel::Kernel;
use crate::lv2::Relaunch;
use crate::lv3::Lv3Control;
use crate::timeslice::Timeslice;
use cudarc::driver::sys;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use xpreempt_hal::{HalError, HwQueue};
use xpreempt_types::{Command, Launched, Level, Seq};

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
}

impl CudaQueueConfig {
    /// The level from the sharing mode: same context or MPS client → Lv2 (guard + stream
    /// priorities); time-sliced against other processes → Lv3 (timeslice), falling back to Lv2.
    pub fn for_sharing(device: &Device, cross_process: bool) -> Self {
        let level = crate::mps::choose_level(crate::mps::detect(device), cross_process);
        Self {
            level,
            ..Self::default()
        }
    }
}

impl Default for CudaQueueConfig {
    fn default() -> Self {
        Self {
            level: Level::Lv2,
            stream_priority: 0,
            slots: 64,
            max_units: 1 << 18,
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
    /// Recorded on the control stream after the flag is cleared; the queue stream waits on it.
    pub(crate) clear_event: sys::CUevent,
    move_event: sys::CUevent,
    pub(crate) next_slot: u32,
    pub(crate) epoch: u32,
    /// The pool ran dry once (warned).
    pool_warned: bool,
}

// SAFETY: CUDA handles are usable from any thread with the context current; access is locked.
unsafe impl Send for Inner {}

pub struct CudaQueue {
    device: Arc<Device>,
    pub(crate) cfg: CudaQueueConfig,
    pub(crate) level: Level,
    inner: Mutex<Inner>,
    pub(crate) control: sys::CUstream,
    pub(crate) flag: DeviceBuffer,
    pub(crate) flag_values: PinnedWords,
    pub(crate) done: DeviceBuffer,
    lv3: Option<Arc<Lv3Control>>,
}

unsafe impl Send for CudaQueue {}
unsafe impl Sync for CudaQueue {}

fn new_event() -> Result<sys::CUevent> {
    let mut ev: sys::CUevent = std::ptr::null_mut();
    cu!(cuEventCreate(
        &mut ev,
        sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
    ))?;
    Ok(ev)
}

fn new_stream(priority: i32) -> Result<sys::CUstream> {
    let mut s: sys::CUstream = std::ptr::null_mut();
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
            match crate::lv3::shared() {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(%e, "Lv3 (channel-group timeslice) unavailable; this queue uses Lv2/Lv1");
                    None
                }
            }
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
            clear_event: new_event()?,
            move_event: new_event()?,
            next_slot: 0,
            epoch: 0,
            pool_warned: false,
        };
        Ok(Self {
            flag: DeviceBuffer::zeroed(4)?,
            flag_values: PinnedWords::new(&[1, 0])?,
            done: DeviceBuffer::zeroed(cfg.slots as usize * cfg.max_units as usize * 4)?,
            device,
            level,
            cfg,
            inner: Mutex::new(inner),
            control,
            lv3,
        })
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The timeslice control of this process, when the shim is loaded and the driver tested.
    pub fn timeslice(&self) -> Option<&Timeslice> {
        self.lv3.as_deref().map(Lv3Control::control)
    }

    /// The process-wide Lv3 state this queue takes part in.
    pub fn lv3(&self) -> Option<&Arc<Lv3Control>> {
        self.lv3.as_ref()
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
        cu!(cuEventRecord(ev, g.stream))?;
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

    /// Records a sync event proving `watermark`. An error means nothing was recorded.
    pub(crate) fn record(&self, g: &mut Inner, watermark: Seq) -> Result<()> {
        let ev = self.take_event(g)?;
        if let Err(e) = cu!(cuEventRecord(ev, g.stream)) {
            g.free_events.push(ev);
            return Err(e);
        }
        g.sync.push_back((watermark, ev));
        Ok(())
    }

    /// Records an already taken event after a launch; never fails (the launch must not be
    /// reported as failed). Without the event, a later record_sync/synchronize covers it.
    pub(crate) fn record_taken(g: &mut Inner, ev: sys::CUevent, watermark: Seq) {
        match cu!(cuEventRecord(ev, g.stream)) {
            Ok(()) => g.sync.push_back((watermark, ev)),
            Err(e) => {
                g.free_events.push(ev);
                tracing::warn!(%e, watermark, "sync event not recorded after a launch; a later sync point covers it");
            }
        }
    }

    pub(crate) fn reap(&self, g: &mut Inner) {
        if g.stop == Stop::Flagged {
            return;
        }
        while let Some(&(mark, ev)) = g.sync.front() {
            // SAFETY: a live event handle.
            let r = unsafe { sys::cuEventQuery(ev) };
            if r == sys::CUresult::CUDA_SUCCESS {
                g.sync.pop_front();
                g.free_events.push(ev);
                g.completed = g.completed.max(mark);
            } else {
                if r != sys::CUresult::CUDA_ERROR_NOT_READY {
                    tracing::error!(?r, "cuEventQuery failed");
                }
                break;
            }
        }
        let done = g.completed;
        g.flight.retire_below(done);
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
        self.bind()?;
        let mut g = self.lock();
        // Everything that can fail comes first: once the command is on the stream, an `Err`
        // would make the XQueue launch it a second time.
        let ev = if sync_point {
            Some(self.take_event(&mut g)?)
        } else {
            None
        };
        let slot = match self.launch_op(&mut g, command) {
            Ok(slot) => slot,
            Err(e) => {
                if let Some(ev) = ev {
                    g.free_events.push(ev);
                }
                return Err(e.into());
            }
        };
        g.launched = seq + 1;
        g.flight.push(seq, slot);
        if let Some(ev) = ev {
            Self::record_taken(&mut g, ev, seq + 1);
        }
        Ok(())
    }

    fn record_sync(&self) -> Result<(), HalError> {
        self.bind()?;
        let mut g = self.lock();
        let tail = g.launched;
        if g.sync.back().map(|&(m, _)| m) != Some(tail) && g.completed < tail {
            self.record(&mut g, tail)?;
        }
        Ok(())
    }

    fn completed(&self) -> Seq {
        let mut g = self.lock();
        self.reap(&mut g);
        g.completed
    }

    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        self.bind()?;
        loop {
            let ev = {
                let mut g = self.lock();
                self.reap(&mut g);
                if g.completed >= upto {
                    return Ok(());
                }
                if g.stop == Stop::Flagged {
                    // Stopped work completes only after reactivate; the caller polls again.
                    return Ok(());
                }
                if upto > g.launched {
                    return Err(HalError::refused(
                        "synchronize",
                        CudaError::SyncBeyondLaunch {
                            upto,
                            launched: g.launched,
                        },
                    ));
                }
                match g.sync.iter().find(|&&(m, _)| m >= upto) {
                    Some(&(_, ev)) => ev,
                    None => {
                        let tail = g.launched;
                        self.record(&mut g, tail)?;
                        g.sync.back().map(|&(_, e)| e).expect("just recorded")
                    }
                }
            };
            // SAFETY: live event; waiting without holding the lock.
            let r = unsafe { sys::cuEventSynchronize(ev) };
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(CudaError::Driver {
                    call: "cuEventSynchronize",
                    code: r,
                }
                .into());
            }
        }
    }

    fn settled(&self) -> bool {
        let g = self.lock();
        match g.stop {
            Stop::Flagged | Stop::Draining => {
                // SAFETY: live event handle.
                unsafe { sys::cuEventQuery(g.stop_event) == sys::CUresult::CUDA_SUCCESS }
            }
            Stop::Running | Stop::Interrupted => true,
        }
    }

    fn deactivate(&self) -> Result<(), HalError> {
        self.lv2_deactivate()
    }

    fn reactivate(&self, log: &mut [Launched<Kernel>]) -> Result<(), HalError> {
        self.lv2_reactivate(log)
    }

    fn interrupt(&self) -> Result<(), HalError> {
        let Some(lv3) = &self.lv3 else {
            return Err(self.unsupported("interrupt", Level::Lv3));
        };
        let mut g = self.lock();
        if g.stop == Stop::Interrupted {
            return Ok(()); // this queue already holds its count
        }
        lv3.interrupt()?;
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
        lv3.restore()?;
        g.stop = Stop::Running;
        Ok(())
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
        // SAFETY: handles created by this queue; waits for its work first.
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
