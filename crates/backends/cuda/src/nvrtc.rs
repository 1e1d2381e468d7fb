//! Run-time compilation of the guard header and the benchmark kernels with NVRTC.

use crate::driver::Device;
use crate::error::{CudaError, Result, cu};
use cudarc::driver::sys;
use std::ffi::CString;

/// The guard header that guarded kernels include (also shipped as a file).
pub const GUARD_HEADER: &str = include_str!("xpreempt_guard.cuh");
/// The benchmark and test kernels.
pub const KERNELS: &str = include_str!("kernels.cu");

/// Whether libnvrtc can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only dlopens libnvrtc (no NVRTC call); a missing library is the `false` answer.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles `source` (the guard header is prepended) to PTX for the device's architecture.
pub fn compile(source: &str, guarded: bool, arch: &'static str) -> Result<String> {
    if !nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    let mut full = String::with_capacity(GUARD_HEADER.len() + source.len() + 64);
    if !guarded {
        full.push_str("#define XP_NO_GUARD 1\n");
    }
    full.push_str(GUARD_HEADER.trim_start_matches("#pragma once"));
    full.push('\n');
    full.push_str(source);
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        name: Some(
            if guarded {
                "xp_guarded.cu"
            } else {
                "xp_plain.cu"
            }
            .into(),
        ),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(full, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => CudaError::NvrtcCompileLog {
            log: log.to_string_lossy().into_owned(),
        },
        other => CudaError::Nvrtc(other),
    })?;
    Ok(ptx.to_src())
}

/// A loaded module with its kernels.
pub struct Module {
    module: sys::CUmodule,
}

// SAFETY: a CUmodule is a context-wide handle any thread may use; `Module` owns it and unloads
// it once, in Drop.
unsafe impl Send for Module {}
// SAFETY: `&Module` only looks functions up, which the driver allows from several threads.
unsafe impl Sync for Module {}

impl Module {
    pub fn load_ptx(device: &Device, ptx: &str) -> Result<Self> {
        device.bind()?;
        let image = CString::new(ptx).map_err(CudaError::PtxNul)?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `module` is a live local; `image` is a NUL-terminated PTX text that outlives
        // the (synchronous) load; the device's context is current.
        cu!(cuModuleLoadData(&mut module, image.as_ptr().cast()))?;
        Ok(Self { module })
    }

    /// The function `name`: valid while this module is loaded.
    pub fn function(&self, name: &str) -> Result<sys::CUfunction> {
        let cname = CString::new(name).map_err(|source| CudaError::KernelNameNul {
            name: name.into(),
            source,
        })?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: `f` is a live local, `self.module` is loaded, `cname` is NUL-terminated and
        // outlives the call.
        cu!(cuModuleGetFunction(&mut f, self.module, cname.as_ptr()))?;
        Ok(f)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: unloads what load_ptx loaded, once. Functions taken from it dangle afterwards:
        // `BenchKernels` keeps its modules for as long as it hands out their functions.
        let _ = unsafe { sys::cuModuleUnload(self.module) };
    }
}

/// The benchmark kernels, guarded and plain.
pub struct BenchKernels {
    _guarded: Module,
    _plain: Module,
    pub spin_guarded: sys::CUfunction,
    pub spin_plain: sys::CUfunction,
    pub persistent_guarded: sys::CUfunction,
    pub persistent_plain: sys::CUfunction,
    pub progress: sys::CUfunction,
    pub stamp: sys::CUfunction,
}

// SAFETY: the functions are handles into the two modules held alongside (Send, above), usable
// from any thread; nothing here is mutated after `build`.
unsafe impl Send for BenchKernels {}
// SAFETY: as above: shared references only read the handles.
unsafe impl Sync for BenchKernels {}

impl BenchKernels {
    pub fn build(device: &Device) -> Result<Self> {
        let arch = device.compute_arch()?;
        let guarded = Module::load_ptx(device, &compile(KERNELS, true, arch)?)?;
        let plain = Module::load_ptx(device, &compile(KERNELS, false, arch)?)?;
        Ok(Self {
            spin_guarded: guarded.function("xp_spin")?,
            spin_plain: plain.function("xp_spin")?,
            persistent_guarded: guarded.function("xp_persistent")?,
            persistent_plain: plain.function("xp_persistent")?,
            progress: plain.function("xp_progress")?,
            stamp: plain.function("xp_stamp")?,
            _guarded: guarded,
            _plain: plain,
        })
    }
}
