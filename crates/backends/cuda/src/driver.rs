//! Loading the driver, devices and their primary contexts.
//!
//! Nothing here touches libcuda before [`driver_present`] said it can be loaded, so every binary
//! that links this crate runs (and reports "no CUDA") on a machine without a GPU.

use crate::error::{CudaError, Result, cu};
use cudarc::driver::sys;
use std::ffi::c_int;
use std::sync::OnceLock;

/// Whether libcuda can be loaded. Cached.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only dlopens libcuda (no driver call); a missing library is the `false` answer.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Initialises the driver once; fails cleanly without one.
pub fn init() -> Result<()> {
    // The driver's answer is kept, not its message: every caller gets the same typed error.
    static INIT: OnceLock<Result<(), sys::CUresult>> = OnceLock::new();
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    // SAFETY: libcuda is loaded (checked above); cuInit takes no pointers.
    let r = INIT.get_or_init(|| match unsafe { sys::cuInit(0) } {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        code => Err(code),
    });
    r.map_err(|code| CudaError::Driver {
        call: "cuInit",
        code,
    })
}

pub fn device_count() -> Result<i32> {
    init()?;
    let mut n: c_int = 0;
    // SAFETY: `n` is a live local the driver writes one int into.
    cu!(cuDeviceGetCount(&mut n))?;
    Ok(n)
}

/// Driver version as CUDA encodes it (13000 = 13.0).
pub fn driver_version() -> Result<i32> {
    init()?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a live local the driver writes one int into.
    cu!(cuDriverGetVersion(&mut v))?;
    Ok(v)
}

/// One GPU and its primary context (shared with every other user of the runtime API in this
/// process). One backend instance per device; several devices work side by side.
#[derive(Debug)]
pub struct Device {
    pub ordinal: i32,
    pub(crate) dev: sys::CUdevice,
    pub(crate) ctx: sys::CUcontext,
    pub name: String,
    pub sm_count: i32,
    pub mps_enabled: bool,
}

// SAFETY: a CUdevice is a plain ordinal and a CUcontext a process-wide handle that the driver
// lets any thread make current; `Device` never mutates either after `open`, and the primary
// context retain it holds is released once, in Drop.
unsafe impl Send for Device {}
// SAFETY: as above: shared references only read the handles and pass them to thread-safe driver
// calls.
unsafe impl Sync for Device {}

impl Device {
    pub fn open(ordinal: i32) -> Result<Self> {
        let n = device_count()?;
        if ordinal < 0 || ordinal >= n {
            return Err(CudaError::NoDevice(ordinal, n));
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: `dev` is a live local; `ordinal` was checked against the device count.
        cu!(cuDeviceGet(&mut dev, ordinal))?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a live local; `dev` came from cuDeviceGet. The retain is released in
        // Drop (a failure below drops nothing, so it leaks one retain of the primary context,
        // which the driver frees at exit).
        cu!(cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
        // SAFETY: `ctx` is the primary context just retained.
        cu!(cuCtxSetCurrent(ctx))?;
        let mut name = [0 as std::ffi::c_char; 128];
        // SAFETY: the buffer holds 128 chars, the length passed; the driver NUL-terminates.
        cu!(cuDeviceGetName(name.as_mut_ptr(), 128, dev))?;
        let name = std::ffi::CStr::from_bytes_until_nul(&name.map(|c| c as u8))
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        let sm_count = attribute(
            dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?;
        let mps_enabled = attribute(
            dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED,
        )
        .unwrap_or(0)
            != 0;
        Ok(Self {
            ordinal,
            dev,
            ctx,
            name,
            sm_count,
            mps_enabled,
        })
    }

    /// Makes this device's context current on the calling thread (cheap; do it on every thread
    /// that uses the device).
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `self.ctx` is retained until Drop.
        cu!(cuCtxSetCurrent(self.ctx))
    }

    /// `(least, greatest)` stream priority; CUDA's greatest is the smallest number.
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.bind()?;
        let (mut least, mut greatest): (c_int, c_int) = (0, 0);
        // SAFETY: two live locals; the context is current (bind above).
        cu!(cuCtxGetStreamPriorityRange(&mut least, &mut greatest))?;
        Ok((least, greatest))
    }

    /// NVRTC's `--gpu-architecture` for this device, e.g. `compute_90`.
    pub fn compute_arch(&self) -> Result<&'static str> {
        let major = attribute(
            self.dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        )?;
        let minor = attribute(
            self.dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        )?;
        Ok(match (major, minor) {
            (7, 0) => "compute_70",
            (7, 5) => "compute_75",
            (8, 0) => "compute_80",
            (8, 6) => "compute_86",
            (8, 9) => "compute_89",
            (9, _) => "compute_90",
            (10, _) => "compute_100",
            (12, _) => "compute_120",
            _ => "compute_80",
        })
    }

    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: no arguments; the context is current (bind above).
        cu!(cuCtxSynchronize())
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: releases the one retain `open` took; nothing uses `self.dev` afterwards.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: `v` is a live local; `dev` came from cuDeviceGet.
    cu!(cuDeviceGetAttribute(&mut v, attr, dev))?;
    Ok(v)
}

/// Device memory, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
}

impl DeviceBuffer {
    /// Zeroed device memory.
    pub fn zeroed(bytes: usize) -> Result<Self> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a live local; the caller bound a context.
        cu!(cuMemAlloc_v2(&mut ptr, bytes.max(4)))?;
        let buf = Self { ptr, bytes };
        // SAFETY: `ptr` is the allocation just made, at least `bytes.max(4)` long (freed by
        // `buf`'s Drop if this fails).
        cu!(cuMemsetD8_v2(ptr, 0, bytes.max(4)))?;
        Ok(buf)
    }

    pub fn read_u32(&self) -> Result<Vec<u32>> {
        let mut v = vec![0u32; self.bytes / 4];
        // SAFETY: the host vector holds `v.len() * 4` bytes, no more than the allocation's
        // `bytes`; the copy is synchronous, so `v` outlives it.
        cu!(cuMemcpyDtoH_v2(
            v.as_mut_ptr().cast(),
            self.ptr,
            v.len() * 4
        ))?;
        Ok(v)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: frees the allocation `zeroed` made, once. Work still using it is the owner's
        // to finish first (a CudaQueue synchronizes its streams before its buffers drop).
        let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}
