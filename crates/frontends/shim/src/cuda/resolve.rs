//! How applications reach libcuda besides linking it: `dlsym` on a handle of libcuda, and
//! `cuGetProcAddress` (the CUDA runtime, cuBLAS, cuDNN and Triton get their entry points this
//! way). Both return the shim's export of the same name when the shim has one, so every version
//! and per-thread variant maps to its own wrapper. Limitation: `dlsym(RTLD_NEXT, …)` called
//! through the shim resolves from the shim's place in the link order, not the caller's.

use super::driver::{CUresult, SUCCESS};
use super::real;
use super::streams;
use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

static SHIM: AtomicUsize = AtomicUsize::new(0);

/// The shim's own handle (for looking up its exports by name).
fn shim_handle() -> Option<*mut c_void> {
    let mut h = SHIM.load(Ordering::Acquire);
    if h == 0 {
        // SAFETY: dladdr of a function of this object, then a no-load dlopen of its file.
        unsafe {
            let mut info: libc::Dl_info = std::mem::zeroed();
            if libc::dladdr(shim_handle as *const c_void, &mut info) == 0
                || info.dli_fname.is_null()
            {
                return None;
            }
            h = libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD) as usize;
        }
        if h == 0 {
            return None;
        }
        SHIM.store(h, Ordering::Release);
    }
    Some(h as *mut c_void)
}

/// The shim's wrapper for libcuda's export `name`, if it has one.
fn wrapper(name: &CStr) -> Option<usize> {
    if !name.to_bytes().starts_with(b"cu") {
        return None;
    }
    let shim = shim_handle()?;
    // SAFETY: a live handle and a NUL-terminated name.
    let w = unsafe { real::dlsym(shim, name.as_ptr()) } as usize;
    (w != 0).then_some(w)
}

/// Whether `addr` is libcuda's export `name` (and not something else of that name).
fn is_libcuda(name: &CStr, addr: usize) -> bool {
    addr != 0 && real::symbol(name) == addr
}

/// The interposed `dlsym`.
///
/// # Safety
/// As glibc's `dlsym`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: forwarded.
    let found = unsafe { real::dlsym(handle, name) };
    if found.is_null() || name.is_null() || !streams::enabled() || !real::libcuda_loaded() {
        return found;
    }
    std::panic::catch_unwind(|| {
        // SAFETY: dlsym's name is NUL-terminated.
        let n = unsafe { CStr::from_ptr(name) };
        let wanted = n.to_bytes() == b"cuGetProcAddress"
            || n.to_bytes() == b"cuGetProcAddress_v2"
            || is_libcuda(n, found as usize);
        match wanted.then(|| wrapper(n)).flatten() {
            Some(w) => w as *mut c_void,
            None => found,
        }
    })
    .unwrap_or(found)
}

/// The name of libcuda's export at `addr` (exactly there), if any.
fn export_name(addr: usize) -> Option<&'static CStr> {
    // SAFETY: dladdr with a zeroed out-struct; the name it gives lives as long as libcuda.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr as *const c_void, &mut info) == 0
            || info.dli_sname.is_null()
            || info.dli_saddr as usize != addr
        {
            return None;
        }
        Some(CStr::from_ptr(info.dli_sname))
    }
}

/// Replaces a function pointer libcuda handed out with the shim's wrapper of the same export.
///
/// # Safety
/// `pfn` is the out-pointer the caller gave cuGetProcAddress.
unsafe fn swap_in_wrapper(pfn: *mut *mut c_void) {
    if pfn.is_null() || !streams::enabled() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the driver wrote a function pointer there.
        let got = unsafe { *pfn } as usize;
        if let Some(name) = export_name(got)
            && is_libcuda(name, got)
            && let Some(w) = wrapper(name)
        {
            // SAFETY: the caller's out-pointer.
            unsafe { *pfn = w as *mut c_void };
        }
    });
}

type GetProcV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64, *mut i32) -> CUresult;
type GetProcV1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64) -> CUresult;

/// # Safety
/// As libcuda's `cuGetProcAddress_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    let addr = real::symbol(c"cuGetProcAddress_v2");
    if addr == 0 {
        return super::driver::ERROR_NOT_INITIALIZED;
    }
    // SAFETY: libcuda's cuGetProcAddress_v2 has this signature.
    let r = unsafe {
        std::mem::transmute::<usize, GetProcV2>(addr)(symbol, pfn, version, flags, status)
    };
    if r == SUCCESS {
        // SAFETY: the caller's out-pointer, just written by the driver.
        unsafe { swap_in_wrapper(pfn) };
    }
    r
}

/// # Safety
/// As libcuda's `cuGetProcAddress`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    let addr = real::symbol(c"cuGetProcAddress");
    if addr == 0 {
        return super::driver::ERROR_NOT_INITIALIZED;
    }
    // SAFETY: libcuda's cuGetProcAddress has this signature.
    let r = unsafe { std::mem::transmute::<usize, GetProcV1>(addr)(symbol, pfn, version, flags) };
    if r == SUCCESS {
        // SAFETY: as above.
        unsafe { swap_in_wrapper(pfn) };
    }
    r
}
