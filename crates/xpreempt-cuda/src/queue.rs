//! `CudaQueue`: the HAL over one CUstream. Lv1 progressive launching with event sync points,
//! Lv2 block-level preemption through the guard flag, Lv3 through the channel-group timeslice.
//!
//! Lv2 ordering rule: the flag is only set when no unguarded command follows a guarded kernel in
//! the in-flight window (a memcpy behind a stopped kernel would otherwise run before the kernel's
//! remaining blocks). Otherwise that suspension drains like Lv1. While stopped, the completion
//! watermark is frozen: a kernel whose blocks were skipped is not complete, even though its CUDA
//! event has fired.

use crate::cu;
use crate::driver::{Device, DeviceBuffer, PinnedWords};
use crate::error::{CudaError, Result};
use crate::kernel::{Kernel, MAX_ARGS};
use crate::timeslice::Timeslice;
use cudarc::driver::sys;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};
use xpreempt_core::command::{Command, Launched, Op, Seq};
use xpreempt_core::{HalError, HwQueue, Level};

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
enum Stop {
    Running,
    /// Flag set; completion frozen at the value it had.
    Flagged,
    /// Not safe (or nothing) to flag: the window drains as at Lv1.
    Draining,
    /// Lv3: this context's timeslice is at the minimum.
    Interrupted,
}

struct Inner {
    stream: sys::CUstream,
    streams: Vec<(i32, sys::CUstream)>,
    free_events: Vec<sys::CUevent>,
    /// (watermark the event proves, event), oldest first.
    sync: VecDeque<(Seq, sys::CUevent)>,
    completed: Seq,
    launched: Seq,
    /// Launched, not known complete: (seq, completion slot of a guarded kernel).
    flight: VecDeque<(Seq, Option<u32>)>,
    stop: Stop,
    stop_event: sys::CUevent,
    /// Recorded on the control stream after the flag is cleared; the queue stream waits on it.
    clear_event: sys::CUevent,
    move_event: sys::CUevent,
    next_slot: u32,
    epoch: u32,
}

// SAFETY: CUDA handles are usable from any thread with the context current; access is locked.
unsafe impl Send for Inner {}

pub struct CudaQueue {
    device: Arc<Device>,
    cfg: CudaQueueConfig,
    level: Level,
    inner: Mutex<Inner>,
    control: sys::CUstream,
    flag: DeviceBuffer,
    flag_values: PinnedWords,
    done: DeviceBuffer,
    lv3: Option<Timeslice>,
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
        let mut free_events = Vec::with_capacity(cfg.slots as usize * 2);
        for _ in 0..cfg.slots * 2 {
            free_events.push(new_event()?);
        }
        let lv3 = if cfg.level >= Level::Lv3 {
            match Timeslice::probe() {
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
            sync: VecDeque::with_capacity(cfg.slots as usize * 2),
            completed: 0,
            launched: 0,
            flight: VecDeque::with_capacity(cfg.slots as usize * 2),
            stop: Stop::Running,
            stop_event: new_event()?,
            clear_event: new_event()?,
            move_event: new_event()?,
            next_slot: 0,
            epoch: 0,
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

    /// The Lv3 control of this process's context, when the shim is loaded and the driver tested.
    pub fn timeslice(&self) -> Option<&Timeslice> {
        self.lv3.as_ref()
    }

    /// Makes the device's context current on this thread, once per thread.
    fn bind(&self) -> Result<()> {
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

    fn lock(&self) -> MutexGuard<'_, Inner> {
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

    fn take_event(g: &mut Inner) -> Result<sys::CUevent> {
        match g.free_events.pop() {
            Some(e) => Ok(e),
            None => new_event(),
        }
    }

    fn record(g: &mut Inner, watermark: Seq) -> Result<()> {
        let ev = Self::take_event(g)?;
        cu!(cuEventRecord(ev, g.stream))?;
        g.sync.push_back((watermark, ev));
        Ok(())
    }

    fn reap(&self, g: &mut Inner) {
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
        while g.flight.front().is_some_and(|&(s, _)| s < done) {
            g.flight.pop_front();
        }
    }

    /// Launches; returns the completion slot of a guarded kernel.
    fn launch_kernel(&self, g: &mut Inner, k: &mut Kernel) -> Result<Option<u32>> {
        let mut guard_vals: [u64; 3] = [0; 3];
        if let Some(units) = k.guard {
            if units.0 > self.cfg.max_units {
                return Err(CudaError::Other(format!(
                    "guarded kernel needs {} completion words, the queue has {}",
                    units.0, self.cfg.max_units
                )));
            }
            let (slot, epoch) = match k.slot {
                Some(se) => se,
                None => {
                    let slot = g.next_slot;
                    // A slot still held by an unfinished (or stopped) kernel must not be reused:
                    // its relaunch would take the new epoch's marks for its own.
                    if g.flight.iter().any(|&(_, s)| s == Some(slot)) {
                        return Err(CudaError::Other(format!(
                            "all {} completion slots are in use; give the queue more slots than its threshold",
                            self.cfg.slots
                        )));
                    }
                    g.next_slot = (g.next_slot + 1) % self.cfg.slots;
                    g.epoch = g.epoch.wrapping_add(1).max(1);
                    k.slot = Some((slot, g.epoch));
                    (slot, g.epoch)
                }
            };
            let done = self.done.ptr + slot as u64 * self.cfg.max_units as u64 * 4;
            guard_vals = [self.flag.ptr, done, epoch as u64];
        }
        let mut ptrs: [*mut c_void; MAX_ARGS + 3] = [std::ptr::null_mut(); MAX_ARGS + 3];
        let mut n = 0;
        if k.guard.is_some() {
            for v in guard_vals.iter_mut() {
                ptrs[n] = (v as *mut u64).cast();
                n += 1;
            }
        }
        for v in k.args[..k.nargs].iter_mut() {
            ptrs[n] = (v as *mut u64).cast();
            n += 1;
        }
        cu!(cuLaunchKernel(
            k.func,
            k.grid[0],
            k.grid[1],
            k.grid[2],
            k.block[0],
            k.block[1],
            k.block[2],
            k.shared_mem,
            g.stream,
            ptrs.as_mut_ptr(),
            std::ptr::null_mut()
        ))?;
        Ok(k.slot.filter(|_| k.guard.is_some()).map(|(slot, _)| slot))
    }

    /// Launches one command; returns the completion slot of a guarded kernel.
    fn launch_op(&self, g: &mut Inner, cmd: &mut Command<Kernel>) -> Result<Option<u32>> {
        match &mut cmd.op {
            Op::Kernel(k) => self.launch_kernel(g, k),
            Op::Memcpy {
                dst, src, bytes, ..
            } => {
                cu!(cuMemcpyAsync(*dst, *src, *bytes as usize, g.stream))?;
                Ok(None)
            }
            Op::Memset { dst, value, bytes } => {
                cu!(cuMemsetD8Async(*dst, *value, *bytes as usize, g.stream))?;
                Ok(None)
            }
            Op::Barrier => Ok(None), // a stream is in order already
            Op::HostCallback(_) => {
                let Op::HostCallback(f) = std::mem::replace(&mut cmd.op, Op::Barrier) else {
                    unreachable!()
                };
                let data = Box::into_raw(Box::new(f));
                if let Err(e) = cu!(cuLaunchHostFunc(
                    g.stream,
                    Some(host_trampoline),
                    data.cast()
                )) {
                    // SAFETY: the driver did not take it; reclaim the box leaked above.
                    drop(unsafe { Box::from_raw(data) });
                    return Err(e);
                }
                Ok(None)
            }
            Op::EventRecord(_) | Op::EventWait(_) => Err(CudaError::Other(
                "cross-queue events are not supported by the CUDA backend yet".into(),
            )),
        }
    }
}

unsafe extern "C" fn host_trampoline(data: *mut c_void) {
    // SAFETY: `data` is the Box leaked in launch_op, called exactly once by the driver.
    let f = unsafe { Box::from_raw(data.cast::<xpreempt_core::command::HostFn>()) };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        tracing::error!("host callback panicked");
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
        let slot = self.launch_op(&mut g, command)?;
        g.launched = seq + 1;
        g.flight.push_back((seq, slot));
        if sync_point {
            Self::record(&mut g, seq + 1)?;
        }
        Ok(())
    }

    fn record_sync(&self) -> Result<(), HalError> {
        self.bind()?;
        let mut g = self.lock();
        let tail = g.launched;
        if g.sync.back().map(|&(m, _)| m) != Some(tail) && g.completed < tail {
            Self::record(&mut g, tail)?;
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
                    return Err(HalError::Backend(format!(
                        "synchronize({upto}) beyond the last launch ({})",
                        g.launched
                    )));
                }
                match g.sync.iter().find(|&&(m, _)| m >= upto) {
                    Some(&(_, ev)) => ev,
                    None => {
                        let tail = g.launched;
                        Self::record(&mut g, tail)?;
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
        if self.level < Level::Lv2 {
            return Err(self.unsupported("deactivate", Level::Lv2));
        }
        self.bind()?;
        let mut g = self.lock();
        self.reap(&mut g);
        // Safe to flag only if no unguarded command follows a guarded one in the window.
        let mut seen_guarded = false;
        let mut safe = true;
        for &(_, slot) in g.flight.iter() {
            if slot.is_some() {
                seen_guarded = true;
            } else if seen_guarded {
                safe = false;
                break;
            }
        }
        if seen_guarded && safe {
            // The control stream is FIFO: this set lands after any earlier clear.
            cu!(cuMemcpyHtoDAsync_v2(
                self.flag.ptr,
                self.flag_values.word(0).cast(),
                4,
                self.control
            ))?;
            g.stop = Stop::Flagged;
        } else {
            g.stop = Stop::Draining;
        }
        cu!(cuEventRecord(g.stop_event, g.stream))?;
        Ok(())
    }

    fn reactivate(&self, log: &mut [Launched<Kernel>]) -> Result<(), HalError> {
        self.bind()?;
        let mut g = self.lock();
        match g.stop {
            Stop::Draining | Stop::Running => {
                g.stop = Stop::Running;
                return Ok(());
            }
            Stop::Interrupted => {
                return Err(HalError::Refused("reactivate after interrupt".into()));
            }
            Stop::Flagged => {}
        }
        let stream = g.stream;
        // Clear on the control stream once every stopped block has exited (stop_event), so that a
        // later deactivate's set (same stream, FIFO) can never be overtaken by this clear; the
        // queue stream waits for the clear before the relaunch.
        cu!(cuStreamWaitEvent(self.control, g.stop_event, 0))?;
        cu!(cuMemcpyHtoDAsync_v2(
            self.flag.ptr,
            self.flag_values.word(1).cast(),
            4,
            self.control
        ))?;
        cu!(cuEventRecord(g.clear_event, self.control))?;
        cu!(cuStreamWaitEvent(stream, g.clear_event, 0))?;
        // Events recorded before the stop prove nothing now.
        while let Some((_, ev)) = g.sync.pop_front() {
            g.free_events.push(ev);
        }
        g.flight.clear();
        g.stop = Stop::Running;
        let done = g.completed;
        for entry in log.iter_mut().filter(|e| e.seq >= done) {
            if let Op::Kernel(k) = &mut entry.command.op
                && k.guard.is_some()
            {
                if let Err(e) = self.launch_kernel(&mut g, k) {
                    // Keep it stopped so nothing is lost; the caller may retry.
                    g.stop = Stop::Flagged;
                    return Err(e.into());
                }
                g.flight.push_back((entry.seq, k.slot.map(|(s, _)| s)));
                Self::record(&mut g, entry.seq + 1)?;
            } else {
                // Unguarded commands before the first guarded kernel ran to completion.
                g.flight.push_back((entry.seq, None));
            }
        }
        if let Some(last) = log.last() {
            let tail = last.seq + 1;
            if g.sync.back().map(|&(m, _)| m) != Some(tail) && tail > done {
                Self::record(&mut g, tail)?;
            }
        }
        Ok(())
    }

    fn interrupt(&self) -> Result<(), HalError> {
        let Some(ts) = &self.lv3 else {
            return Err(self.unsupported("interrupt", Level::Lv3));
        };
        ts.lower()?;
        self.lock().stop = Stop::Interrupted;
        Ok(())
    }

    fn restore(&self, _log: &mut [Launched<Kernel>]) -> Result<(), HalError> {
        let Some(ts) = &self.lv3 else {
            return Err(self.unsupported("restore", Level::Lv3));
        };
        ts.restore()?;
        self.lock().stop = Stop::Running;
        Ok(())
    }
}

impl Drop for CudaQueue {
    fn drop(&mut self) {
        let g = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
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
