//! Lv2 of `CudaQueue`: block-level preemption through the guard flag.
//!
//! `deactivate` sets the queue's flag from the highest-priority control stream; guarded blocks
//! that start afterwards exit at once, and the completion watermark freezes (a kernel whose blocks
//! were skipped is not complete, even though its CUDA event fires). The flag is only set when no
//! unguarded command follows a guarded kernel in the in-flight window (a memcpy behind a stopped
//! kernel would otherwise run before the kernel's remaining blocks); otherwise that suspension
//! drains like Lv1.
//!
//! `reactivate` clears the flag and relaunches the stopped kernels (finished blocks skip
//! themselves). It may fail part-way; the queue then stays `Flagged` and remembers how far it
//! got (`Relaunch`), so that a retry relaunches exactly what is missing: nothing twice, nothing
//! skipped, and the watermark stays frozen until every stopped kernel is running again. The pure
//! bookkeeping (`Flight`, `flag_is_safe`, `relaunch_stopped`) is `xpreempt_hal::lv2`, shared with
//! the shim's Lv2.
//!
//! The flag lives in device memory, or, as an experiment (`CudaQueueConfig::host_flag`), in
//! pinned host memory that guarded blocks read across the bus ([`Flag`]): a stop is then a store
//! with no driver call, and the clears stay on the control stream.

use crate::driver::DeviceBuffer;
use crate::error::{CudaError, Result, cu};
use crate::kernel::Kernel;
use crate::queue::{CudaQueue, Inner, Stop};
use cudarc::driver::sys;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
pub(crate) use xpreempt_hal::lv2::Relaunch;
use xpreempt_hal::lv2::{flag_is_safe, relaunch_stopped};
use xpreempt_types::{Launched, Seq};

impl CudaQueue {
    /// Deactivate; the caller checked the level.
    ///
    /// The flag's set is the first driver call: in one process the stop races the
    /// latency-critical queue's launch for the driver, and whatever comes before the set delays
    /// the stop on the GPU. The window is reaped (a driver query per sync event) only when it is
    /// not safe to flag as it stands; a completed kernel left in it is relaunched at the resume,
    /// where its finished blocks skip themselves.
    pub(crate) fn lv2_deactivate(&self) -> Result<()> {
        self.bind()?;
        let mut g = self.lock();
        if g.stop == Stop::Flagged {
            return Ok(()); // already stopped (a reactivate has not finished yet)
        }
        let mut flag = flag_is_safe(g.flight.slots());
        if !flag {
            self.reap(&mut g);
            flag = flag_is_safe(g.flight.slots());
        }
        if !flag {
            // Nothing changes if this fails.
            self.record_stop(&mut g)?;
            g.stop = Stop::Draining;
            return Ok(());
        }
        match &self.flag {
            // Every clear has landed, so none can overwrite the store.
            Flag::Host(h) if h.clears_done() == g.clears_issued => h.set(),
            // The control stream is FIFO: this set lands after any earlier clear.
            _ => self.write_flag(1)?,
        }
        g.stop = Stop::Flagged;
        g.relaunch = Relaunch::default();
        g.stop_recorded = false;
        // Nothing is launched on the stream while flagged, so the stop event covers the same
        // work whenever it is recorded; `settled` and the clear record it if this does not (a
        // host flag's stop leaves it to them, and makes no driver call).
        if let Flag::Device(_) = self.flag
            && let Err(e) = self.record_stop(&mut g)
        {
            tracing::warn!(%e, "no stop event after the flag; recorded later");
        }
        Ok(())
    }

    /// Writes the flag on the control stream.
    fn write_flag(&self, value: u32) -> Result<()> {
        match &self.flag {
            Flag::Device(buf) => {
                let word = self.flag_values.word(if value == 0 { 1 } else { 0 })?;
                // SAFETY: a 4-byte copy from a pinned word into the 4-byte flag, both owned by
                // this queue and freed only after Drop synchronized the control stream.
                cu!(cuMemcpyHtoDAsync_v2(buf.ptr, word.cast(), 4, self.control))
            }
            // SAFETY: the control stream and the host flag's mapping are this queue's; the
            // mapping is freed only after Drop synchronized the control stream.
            Flag::Host(h) => cu!(cuStreamWriteValue32_v2(
                self.control,
                h.flag_ptr(),
                value,
                0
            )),
        }
    }

    /// Records the stop event behind everything launched on the queue's stream.
    pub(crate) fn record_stop(&self, g: &mut Inner) -> Result<()> {
        // SAFETY: `stop_event` and the stream are this queue's, alive until Drop; the caller
        // holds the lock.
        cu!(cuEventRecord(g.stop_event, g.stream))?;
        g.stop_recorded = true;
        Ok(())
    }

    pub(crate) fn lv2_reactivate(&self, log: &mut [Launched<Kernel>]) -> Result<()> {
        self.bind()?;
        let mut g = self.lock();
        match g.stop {
            Stop::Draining | Stop::Running => {
                g.stop = Stop::Running;
                return Ok(());
            }
            Stop::Interrupted => return Err(CudaError::ReactivateAfterInterrupt),
            Stop::Flagged => {}
        }
        if !g.relaunch.cleared {
            self.clear_flag(&mut g)?;
        }
        // Any error below leaves the queue Flagged (watermark frozen) with `relaunch.next` at
        // the first entry not dealt with.
        let mut next = g.relaunch.next;
        let walked = relaunch_stopped(
            log,
            &mut next,
            |k: &Kernel| k.guard.is_some(),
            |seq, k| self.relaunch_one(&mut g, seq, k),
        );
        g.relaunch.next = next;
        walked?;
        if let Some(last) = log.last() {
            let tail = last.seq + 1;
            if g.sync.back().map(|&(m, _)| m) != Some(tail) && tail > g.completed {
                // Best effort: the kernels run already; synchronize records on demand.
                if let Err(e) = self.record(&mut g, tail) {
                    tracing::warn!(%e, "no sync event after the relaunch; completion shows later");
                }
            }
        }
        g.stop = Stop::Running;
        g.relaunch = Relaunch::default();
        Ok(())
    }

    /// Clears the flag on the control stream once every stopped block has exited (stop_event),
    /// so that a later deactivate's set (same stream, FIFO) can never be overtaken by this clear;
    /// the queue stream waits for the clear before the relaunch. Repeating it is harmless.
    fn clear_flag(&self, g: &mut Inner) -> Result<()> {
        if !g.stop_recorded {
            self.record_stop(g)?;
        }
        // SAFETY: the control stream and `stop_event` are this queue's, alive until Drop.
        cu!(cuStreamWaitEvent(self.control, g.stop_event, 0))?;
        self.write_flag(0)?;
        if let Flag::Host(h) = &self.flag {
            // Counted before it is written: a failed write leaves the count ahead, and stops go
            // through the control stream until a later clear's count lands.
            g.clears_issued = g.clears_issued.wrapping_add(1);
            // SAFETY: as in `write_flag`.
            cu!(cuStreamWriteValue32_v2(
                self.control,
                h.clears_ptr(),
                g.clears_issued,
                0
            ))?;
        }
        // SAFETY: this queue's event and control stream; the lock is held, so no other record
        // of `clear_event` interleaves.
        cu!(cuEventRecord(g.clear_event, self.control))?;
        // SAFETY: this queue's stream and event.
        cu!(cuStreamWaitEvent(g.stream, g.clear_event, 0))?;
        // Events recorded before the stop prove nothing now.
        while let Some((_, ev)) = g.sync.pop_front() {
            g.free_events.push(ev);
        }
        g.sync_resets += 1;
        g.flight.clear();
        g.relaunch = Relaunch {
            cleared: true,
            next: g.completed,
        };
        Ok(())
    }

    /// Relaunches one stopped kernel (`Some`) or notes an entry that was not stopped (`None`).
    /// Fails only before anything was handed to the hardware.
    fn relaunch_one(&self, g: &mut Inner, seq: Seq, kernel: Option<&mut Kernel>) -> Result<()> {
        let Some(k) = kernel else {
            g.flight.push(seq, None);
            return Ok(());
        };
        let ev = self.take_event(g)?;
        let slot = match self.launch_kernel(g, k) {
            Ok(slot) => slot,
            Err(e) => {
                g.free_events.push(ev);
                return Err(e);
            }
        };
        g.flight.push(seq, slot);
        Self::record_taken(g, ev, seq + 1);
        Ok(())
    }
}

/// Where Lv2's flag lives.
pub(crate) enum Flag {
    /// Device memory, set and cleared on the control stream.
    Device(DeviceBuffer),
    /// Pinned host memory mapped into the device (`CudaQueueConfig::host_flag`).
    Host(HostFlag),
}

impl Flag {
    /// A host flag if asked for and the control stream can write host memory; else (or then, on
    /// failure, said once per queue) a device flag.
    pub(crate) fn new(host: bool, control: sys::CUstream) -> Result<Self> {
        if host {
            match HostFlag::new(control) {
                Ok(h) => return Ok(Self::Host(h)),
                Err(e) => {
                    tracing::warn!(%e, "no host flag; this queue's flag stays in device memory")
                }
            }
        }
        Ok(Self::Device(DeviceBuffer::zeroed(4)?))
    }

    /// The address guarded kernels read.
    pub(crate) fn ptr(&self) -> u64 {
        match self {
            Self::Device(buf) => buf.ptr,
            Self::Host(h) => h.flag_ptr(),
        }
    }
}

/// Two words of pinned host memory mapped into the device: the flag guarded blocks read, and how
/// many clears the control stream has made. The queue stores the flag itself only once every
/// clear it issued has landed; otherwise a clear still on its way would overwrite the store.
pub(crate) struct HostFlag {
    words: NonNull<AtomicU32>,
    device_ptr: u64,
}

// SAFETY: the host side touches the words only through atomics, and the allocation is owned and
// freed once, in Drop.
unsafe impl Send for HostFlag {}
// SAFETY: as above: `&HostFlag` only does atomic loads and stores.
unsafe impl Sync for HostFlag {}

impl HostFlag {
    /// Allocates the words (the caller bound the context) and checks that `control` can write
    /// them: stream memory operations may be unsupported.
    fn new(control: sys::CUstream) -> Result<Self> {
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: `host` is a live local; DEVICEMAP asks for pinned memory the device can address.
        cu!(cuMemHostAlloc(&mut host, 8, sys::CU_MEMHOSTALLOC_DEVICEMAP))?;
        let Some(words) = NonNull::new(host.cast::<AtomicU32>()) else {
            return Err(CudaError::Driver {
                call: "cuMemHostAlloc",
                code: sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            });
        };
        // SAFETY: a fresh, page-aligned allocation of 8 bytes that nothing else references yet:
        // room for two AtomicU32.
        unsafe {
            words.as_ptr().write(AtomicU32::new(0));
            words.as_ptr().add(1).write(AtomicU32::new(0));
        }
        let mut flag = Self {
            words,
            device_ptr: 0,
        };
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `dptr` is a live local; `host` is the DEVICEMAP allocation above (freed by
        // `flag`'s Drop should this fail).
        cu!(cuMemHostGetDevicePointer_v2(&mut dptr, host, 0))?;
        flag.device_ptr = dptr;
        // SAFETY: the caller's control stream; the word is this allocation's second.
        cu!(cuStreamWriteValue32_v2(control, flag.clears_ptr(), 0, 0))?;
        // SAFETY: the caller's control stream.
        cu!(cuStreamSynchronize(control))?;
        Ok(flag)
    }

    fn word(&self, i: usize) -> &AtomicU32 {
        // SAFETY: `i` < 2; both words were initialized in `new` and live until Drop, which
        // `&self` excludes.
        unsafe { &*self.words.as_ptr().add(i) }
    }

    fn flag_ptr(&self) -> u64 {
        self.device_ptr
    }

    fn clears_ptr(&self) -> u64 {
        self.device_ptr + 4
    }

    /// Stops guarded blocks that start from now on (the store reaches the bus at once).
    fn set(&self) {
        self.word(0).store(1, Ordering::SeqCst);
    }

    /// How many clears the control stream has made (wrapping).
    fn clears_done(&self) -> u32 {
        self.word(1).load(Ordering::Acquire)
    }
}

impl Drop for HostFlag {
    fn drop(&mut self) {
        // SAFETY: frees the allocation `new` made, once. The queue's Drop synchronized its
        // streams first, so no kernel or control-stream write still uses it.
        let _ = unsafe { sys::cuMemFreeHost(self.words.as_ptr().cast()) };
    }
}
