//! Loading the driver, devices and their primary contexts.
//!
//! Nothing here touches libcuda before [`driver_present`] said it can be loaded, so every binary
//! that links this crate runs (and reports "no CUDA") on a machine without a GPU.

use crate::cu;
use crate::error::{CudaError, Result};
use cudarc::driver::sys;
use std::ffi::c_int;
use std::sync::OnceLock;

/// Whether libcuda can be loaded. Cached.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the library.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Initialises the driver once; fails cleanly without one.
pub fn init() -> Result<()> {
    static INIT: OnceLock<Result<(), String>> = OnceLock::new();
    let r = INIT.get_or_init(|| {
        if !driver_present() {
            return Err(CudaError::NoDriver.to_string());
        }
        cu!(cuInit(0)).map_err(|e| e.to_string())
    });
    match r {
        Ok(()) => Ok(()),
        Err(_) if !driver_present() => Err(CudaError::NoDriver),
        Err(e) => Err(CudaError::Other(e.clone())),
    }
}

pub fn device_count() -> Result<i32> {
    init()?;
    let mut n: c_int = 0;
    cu!(cuDeviceGetCount(&mut n))?;
    Ok(n)
}

/// Driver version as CUDA encodes it (13000 = 13.0).
pub fn driver_version() -> Result<i32> {
    init()?;
    let mut v: c_int = 0;
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

// SAFETY: CUcontext handles may be used from any thread once made current there.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl Device {
    pub fn open(ordinal: i32) -> Result<Self> {
        let n = device_count()?;
        if ordinal < 0 || ordinal >= n {
            return Err(CudaError::NoDevice(ordinal, n));
        }
        let mut dev: sys::CUdevice = 0;
        cu!(cuDeviceGet(&mut dev, ordinal))?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        cu!(cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
        cu!(cuCtxSetCurrent(ctx))?;
        let mut name = [0 as std::ffi::c_char; 128];
        cu!(cuDeviceGetName(name.as_mut_ptr(), 128, dev))?;
        // SAFETY: the driver wrote a NUL-terminated string into the buffer.
        let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
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
        cu!(cuCtxSetCurrent(self.ctx))
    }

    /// `(least, greatest)` stream priority; CUDA's greatest is the smallest number.
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.bind()?;
        let (mut least, mut greatest): (c_int, c_int) = (0, 0);
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
        cu!(cuCtxSynchronize())
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: releases the retain taken in `open`.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32> {
    let mut v: c_int = 0;
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
        cu!(cuMemAlloc_v2(&mut ptr, bytes.max(4)))?;
        cu!(cuMemsetD8_v2(ptr, 0, bytes.max(4)))?;
        Ok(Self { ptr, bytes })
    }

    pub fn read_u32(&self) -> Result<Vec<u32>> {
        let mut v = vec![0u32; self.bytes / 4];
        cu!(cuMemcpyDtoH_v2(
            v.as_mut_ptr().cast(),
            self.ptr,
            v.len() * 4
        ))?;
        Ok(v)
    }

    pub fn zero(&self) -> Result<()> {
        cu!(cuMemsetD8_v2(self.ptr, 0, self.bytes))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: frees what `zeroed` allocated.
        let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// Pinned host memory holding `n` u32 values, readable by the copy engine.
#[derive(Debug)]
pub struct PinnedWords {
    pub(crate) ptr: *mut u32,
    pub(crate) len: usize,
}

unsafe impl Send for PinnedWords {}
unsafe impl Sync for PinnedWords {}

impl PinnedWords {
    pub fn new(values: &[u32]) -> Result<Self> {
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        cu!(cuMemHostAlloc(&mut p, values.len() * 4, 0))?;
        let ptr = p.cast::<u32>();
        // SAFETY: fresh allocation of the right size.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), ptr, values.len()) };
        Ok(Self {
            ptr,
            len: values.len(),
        })
    }

    pub fn word(&self, i: usize) -> *const u32 {
        assert!(i < self.len);
        // SAFETY: in bounds.
        unsafe { self.ptr.add(i) }
    }
}

impl Drop for PinnedWords {
    fn drop(&mut self) {
        // SAFETY: frees what `new` allocated.
        let _ = unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
    }
}
