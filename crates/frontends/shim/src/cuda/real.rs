//! The real libcuda: the shim's own handle on `libcuda.so.1` and glibc's real `dlsym`, so that
//! nothing the shim calls goes through its own interposers.

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
static LIBCUDA: AtomicUsize = AtomicUsize::new(0);

/// glibc's `dlsym`, found by version (the unversioned name would find the shim's own).
pub fn dlsym_fn() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p == 0 {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            // SAFETY: dlvsym with NUL-terminated names; RTLD_NEXT from the shim skips the shim.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) }
                as usize;
            if p != 0 {
                break;
            }
        }
        if p == 0 {
            return None;
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: glibc's dlsym has this signature.
    Some(unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
}

/// The real `dlsym(handle, name)`.
///
/// # Safety
/// `name` is NUL-terminated; `handle` is what the caller would pass to dlsym.
pub unsafe fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    match dlsym_fn() {
        // SAFETY: forwarded.
        Some(f) => unsafe { f(handle, name) },
        None => std::ptr::null_mut(),
    }
}

/// The shim's handle on libcuda (loaded on first use; libcuda stays loaded for the process).
pub fn libcuda() -> Option<*mut c_void> {
    let mut h = LIBCUDA.load(Ordering::Acquire);
    if h == 0 {
        // SAFETY: dlopen of a library by soname.
        h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) }
            as usize;
        if h == 0 {
            return None;
        }
        LIBCUDA.store(h, Ordering::Release);
    }
    Some(h as *mut c_void)
}

/// Whether the process has libcuda loaded (without loading it).
pub fn libcuda_loaded() -> bool {
    if LIBCUDA.load(Ordering::Acquire) != 0 {
        return true;
    }
    // SAFETY: a no-load dlopen only looks; the reference it may take is dropped at once.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
    }
    true
}

/// libcuda's export `name`, or 0.
pub fn symbol(name: &CStr) -> usize {
    match libcuda() {
        // SAFETY: a live handle and a NUL-terminated name.
        Some(h) => unsafe { dlsym(h, name.as_ptr()) as usize },
        None => 0,
    }
}

/// A libcuda function resolved once and cached.
pub struct Real {
    pub name: &'static CStr,
    addr: AtomicUsize,
}

impl Real {
    pub const fn new(name: &'static CStr) -> Self {
        Self {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    /// The function's address (0 when libcuda lacks it).
    pub fn addr(&self) -> usize {
        let a = self.addr.load(Ordering::Relaxed);
        if a != 0 {
            return a;
        }
        let a = symbol(self.name);
        self.addr.store(a, Ordering::Relaxed);
        a
    }
}
