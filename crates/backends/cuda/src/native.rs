//! Plain CUDA streams, events and host-mapped words for work that runs beside the HAL: the native
//! baselines, latency probes and calibration of `xpreempt-bench`. Each type owns its driver
//! handle and keeps its device's context alive, so that callers never touch raw handles.
//!
//! Launches here bypass every preemption level: a guarded kernel is refused (only a `CudaQueue`
//! fills in the guard's parameters).

use crate::driver::Device;
use crate::error::{CudaError, Result, cu};
use crate::kernel::Kernel;
use cudarc::driver::sys;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A CUDA event, destroyed on drop.
pub struct Event {
    raw: sys::CUevent,
    _device: Arc<Device>,
}

// SAFETY: an event is a context-wide driver handle that any thread may record, query or wait on
// (the driver locks internally); `Event` owns it and destroys it once, in Drop, and the `Arc`
// keeps its context retained until then.
unsafe impl Send for Event {}
// SAFETY: as above: `&Event` only passes the handle to thread-safe driver calls.
unsafe impl Sync for Event {}

impl Event {
    /// An event for completion and ordering only (cheaper to record than a timed one).
    pub fn new(device: &Arc<Device>) -> Result<Self> {
        Self::create(device, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    }

    /// An event that can be timed against another with [`Event::elapsed_us`].
    pub fn timed(device: &Arc<Device>) -> Result<Self> {
        Self::create(device, sys::CUevent_flags::CU_EVENT_DEFAULT as u32)
    }

    fn create(device: &Arc<Device>, flags: u32) -> Result<Self> {
        device.bind()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a live local; the device's context is current.
        cu!(cuEventCreate(&mut raw, flags))?;
        Ok(Self {
            raw,
            _device: device.clone(),
        })
    }

    /// Blocks until the work before the last record has completed.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: `self.raw` lives until Drop.
        cu!(cuEventSynchronize(self.raw))
    }

    /// Whether the work before the last record has completed, without blocking.
    pub fn is_complete(&self) -> Result<bool> {
        // SAFETY: `self.raw` lives until Drop.
        match unsafe { sys::cuEventQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            code => Err(CudaError::Driver {
                call: "cuEventQuery",
                code,
            }),
        }
    }

    /// Time from `start` to this event, both recorded and complete, in µs.
    pub fn elapsed_us(&self, start: &Event) -> Result<f64> {
        let mut ms = 0f32;
        // SAFETY: `ms` is a live local; both events live until their Drop.
        cu!(cuEventElapsedTime_v2(&mut ms, start.raw, self.raw))?;
        Ok(f64::from(ms) * 1000.0)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: destroys the event `create` made, once; the driver defers the release of an
        // event still pending on a stream until it completes.
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}

/// A new non-blocking stream of `device` at CUDA priority `priority`; the caller destroys it.
pub(crate) fn create_stream(device: &Device, priority: i32) -> Result<sys::CUstream> {
    device.bind()?;
    let mut raw: sys::CUstream = std::ptr::null_mut();
    // SAFETY: `raw` is a live local; the device's context is current (bound above).
    cu!(cuStreamCreateWithPriority(
        &mut raw,
        sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
        priority
    ))?;
    Ok(raw)
}

/// A non-blocking CUDA stream of a given priority, synchronized and destroyed on drop.
pub struct Stream {
    raw: sys::CUstream,
    done: Event,
    device: Arc<Device>,
}

// SAFETY: a stream is a context-wide driver handle; the driver serializes launches and records
// on it from any thread. `Stream` owns it and destroys it once, in Drop; `device` keeps the
// context retained until then.
unsafe impl Send for Stream {}
// SAFETY: as above: `&Stream` only passes the handle to thread-safe driver calls.
unsafe impl Sync for Stream {}

impl Stream {
    /// A stream of CUDA priority `priority` (smaller runs first; see
    /// [`Device::stream_priority_range`]).
    pub fn new(device: &Arc<Device>, priority: i32) -> Result<Self> {
        let done = Event::new(device)?;
        let raw = create_stream(device, priority)?;
        Ok(Self {
            raw,
            done,
            device: device.clone(),
        })
    }

    /// Launches an unguarded kernel; a guarded one is refused.
    pub fn launch(&self, k: &Kernel) -> Result<()> {
        if k.guard.is_some() {
            return Err(CudaError::GuardedOnPlainStream);
        }
        self.device.bind()?;
        // SAFETY: `self.raw` is live and its context current; the kernel is unguarded, so it
        // has no leading parameters, and `Kernel`'s contract covers its own.
        unsafe { crate::kernel::launch_on(self.raw, k, &mut []) }
    }

    /// Records `event` after everything launched so far.
    pub fn record(&self, event: &Event) -> Result<()> {
        // SAFETY: both handles live until their Drop.
        cu!(cuEventRecord(event.raw, self.raw))
    }

    /// Waits for everything launched so far.
    pub fn sync(&self) -> Result<()> {
        self.record(&self.done)?;
        self.done.synchronize()
    }

    /// Times the work `f` launches on this stream with a pair of events, in µs.
    pub fn time_us<E: From<CudaError>>(
        &self,
        f: impl FnOnce(&Self) -> Result<(), E>,
    ) -> Result<f64, E> {
        let (a, b) = (Event::timed(&self.device)?, Event::timed(&self.device)?);
        self.record(&a)?;
        f(self)?;
        self.record(&b)?;
        b.synchronize()?;
        Ok(b.elapsed_us(&a)?)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: waits for the stream's work (kernels may point at memory their owners free
        // after this), then destroys the stream `new` made, once.
        unsafe {
            let _ = sys::cuStreamSynchronize(self.raw);
            let _ = sys::cuStreamDestroy_v2(self.raw);
        }
    }
}

/// One u64 in pinned host memory that kernels read and write through [`HostWord::device_ptr`]
/// while the host polls it: progress counters that need no copy.
pub struct HostWord {
    word: NonNull<AtomicU64>,
    device_ptr: u64,
    device: Arc<Device>,
}

// SAFETY: the host side touches the word only through `AtomicU64`, so host threads never race;
// the allocation is owned and freed once, in Drop.
unsafe impl Send for HostWord {}
// SAFETY: as above: `&HostWord` only does atomic loads and stores.
unsafe impl Sync for HostWord {}

impl HostWord {
    /// A zeroed word mapped into the device's address space.
    pub fn new(device: &Arc<Device>) -> Result<Self> {
        device.bind()?;
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: `host` is a live local; DEVICEMAP asks for pinned memory the device can address.
        cu!(cuMemHostAlloc(&mut host, 8, sys::CU_MEMHOSTALLOC_DEVICEMAP))?;
        let Some(word) = NonNull::new(host.cast::<AtomicU64>()) else {
            return Err(CudaError::Driver {
                call: "cuMemHostAlloc",
                code: sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            });
        };
        // SAFETY: a fresh, page-aligned (so 8-byte aligned) allocation of 8 bytes that nothing
        // else references yet: a valid place for an AtomicU64.
        unsafe { word.as_ptr().write(AtomicU64::new(0)) };
        let mut w = Self {
            word,
            device_ptr: 0,
            device: device.clone(),
        };
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `dptr` is a live local; `host` is the DEVICEMAP allocation above (freed by
        // `w`'s Drop should this fail).
        cu!(cuMemHostGetDevicePointer_v2(&mut dptr, host, 0))?;
        w.device_ptr = dptr;
        Ok(w)
    }

    /// The word's address for kernels; valid while `self` lives.
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }

    /// The word as last written by a kernel or the host.
    pub fn load(&self) -> u64 {
        self.atomic().load(Ordering::Acquire)
    }

    pub fn store(&self, value: u64) {
        self.atomic().store(value, Ordering::Release);
    }

    fn atomic(&self) -> &AtomicU64 {
        // SAFETY: initialized in `new`, aligned, and alive until Drop, which `&self` excludes.
        unsafe { self.word.as_ref() }
    }
}

impl Drop for HostWord {
    fn drop(&mut self) {
        // Kernels still writing the word must finish before the memory goes back to the host
        // allocator; which stream they run on is not known here, so wait for the context.
        if let Err(e) = self.device.synchronize() {
            tracing::warn!(%e, "freeing a host-mapped word without synchronizing");
        }
        // SAFETY: frees the allocation `new` made, once, after the context's work finished.
        let _ = unsafe { sys::cuMemFreeHost(self.word.as_ptr().cast()) };
    }
}
