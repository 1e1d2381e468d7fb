//! Run-time compilation of the guard header and the benchmark kernels with NVRTC.

use crate::cu;
use crate::driver::Device;
use crate::error::{CudaError, Result};
use cudarc::driver::sys;
use std::ffi::CString;

/// The guard header that guarded kernels include (also shipped as a file).
pub const GUARD_HEADER: &str = include_str!("xpreempt_guard.cuh");
/// The benchmark and test kernels.
pub const KERNELS: &str = include_str!("kernels.cu");

/// Whether libnvrtc can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles `source` (the guard header is prepended) to PTX for the device's architecture.
pub fn compile(source: &str, guarded: bool, arch: &'static str) -> Result<String> {
    if !nvrtc_present() {
        return Err(CudaError::Nvrtc(
            "libnvrtc not found (add the CUDA lib64 folder to LD_LIBRARY_PATH)".into(),
        ));
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
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(full, opts)
        .map_err(|e| CudaError::Nvrtc(format!("{e:?}")))?;
    Ok(ptx.to_src())
}

/// A loaded module with its kernels.
pub struct Module {
    module: sys::CUmodule,
}

unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Module {
    pub fn load_ptx(device: &Device, ptx: &str) -> Result<Self> {
        device.bind()?;
        let image = CString::new(ptx).map_err(|e| CudaError::Other(e.to_string()))?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        cu!(cuModuleLoadData(&mut module, image.as_ptr().cast()))?;
        Ok(Self { module })
    }

    pub fn function(&self, name: &str) -> Result<sys::CUfunction> {
        let cname = CString::new(name).map_err(|e| CudaError::Other(e.to_string()))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        cu!(cuModuleGetFunction(&mut f, self.module, cname.as_ptr()))?;
        Ok(f)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: unloads what load_ptx loaded.
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

unsafe impl Send for BenchKernels {}
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
