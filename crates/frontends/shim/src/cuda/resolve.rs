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
        let w = wanted.then(|| wrapper(n)).flatten();
        if crate::log::log_level() >= 2 && n.to_bytes().starts_with(b"cu") {
            shim_log!(
                "dlsym {}: {found:p}{}",
                n.to_string_lossy(),
                if w.is_some() { ", wrapped" } else { "" }
            );
        }
        w.map_or(found, |w| w as *mut c_void)
    })
    .unwrap_or(found)
}

/// What dladdr says of `addr`: the nearest exported symbol at or below it, and how far below.
fn nearest_export(addr: usize) -> Option<(&'static CStr, usize)> {
    // SAFETY: dladdr with a zeroed out-struct; the name it gives lives as long as libcuda.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr as *const c_void, &mut info) == 0 || info.dli_sname.is_null() {
            return None;
        }
        Some((
            CStr::from_ptr(info.dli_sname),
            addr.wrapping_sub(info.dli_saddr as usize),
        ))
    }
}

/// The suffixes of libcuda's versioned and per-thread variants of an entry point.
const VARIANTS: [&str; 9] = [
    "", "_v2", "_v3", "_ptsz", "_ptds", "_v2_ptsz", "_v2_ptds", "_v3_ptsz", "_v3_ptds",
];

/// The shim's wrapper for the libcuda export that is exactly at `got`, and that export's name.
fn export_wrapper(got: usize) -> Option<(&'static CStr, usize)> {
    let (name, 0) = nearest_export(got)? else {
        return None;
    };
    if !is_libcuda(name, got) {
        return None;
    }
    Some((name, wrapper(name)?))
}

/// Whether the shim wraps some variant of `symbol` (a pointer it found no wrapper for then
/// passes the shim by: the CUDA 13.0 runtime asks for `cuDevicePrimaryCtxReset` at version 7000
/// and gets libcuda's first version, which the shim once lacked, so its device resets were
/// never seen).
fn wraps_a_variant(symbol: &CStr) -> bool {
    VARIANTS.iter().any(|suffix| {
        std::ffi::CString::new([symbol.to_bytes(), suffix.as_bytes()].concat())
            .is_ok_and(|n| wrapper(&n).is_some())
    })
}

/// Replaces the function pointer libcuda handed out for `symbol` with the shim's wrapper of
/// the export that is exactly there. With `XPREEMPT_SHIM_LOG=2` every request is logged (symbol,
/// version, flags, the export the pointer is, the wrapper that replaced it); with 1 only the
/// requests for a name the shim wraps in another variant than the one handed out ("MISSED":
/// those calls pass the shim by).
///
/// # Safety
/// `symbol` is NUL-terminated; `pfn` is the out-pointer the caller gave cuGetProcAddress.
unsafe fn swap_in_wrapper(symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64) {
    if pfn.is_null() || symbol.is_null() || !streams::enabled() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the driver wrote a function pointer there; the name is the caller's.
        let (got, sym) = unsafe { (*pfn as usize, CStr::from_ptr(symbol)) };
        if got == 0 {
            return;
        }
        let found = export_wrapper(got);
        let level = crate::log::log_level();
        let missed = level >= 1 && found.is_none() && wraps_a_variant(sym);
        if level >= 2 || missed {
            let at = match nearest_export(got) {
                Some((n, 0)) => n.to_string_lossy().into_owned(),
                Some((n, off)) => format!("{}+{off:#x}", n.to_string_lossy()),
                None => "no export".into(),
            };
            let what = match found {
                Some((n, _)) => format!("wrapper {}", n.to_string_lossy()),
                None if missed => "MISSED: the shim wraps this name, not this pointer".into(),
                None => "not wrapped".into(),
            };
            shim_log!(
                "cuGetProcAddress {} v{version} flags {flags:#x}: {got:#x} ({at}): {what}",
                sym.to_string_lossy()
            );
        }
        let Some((_, w)) = found else { return };
        // SAFETY: the caller's out-pointer.
        unsafe { *pfn = w as *mut c_void };
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
        unsafe { swap_in_wrapper(symbol, pfn, version, flags) };
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
        unsafe { swap_in_wrapper(symbol, pfn, version, flags) };
    }
    r
}

type GetExportTable = unsafe extern "C" fn(*mut *const c_void, *const [u8; 16]) -> CUresult;

/// libcuda's private tables of entry points (the CUDA runtime asks for several): passed
/// through, and with `XPREEMPT_SHIM_LOG=2` logged, so that a runtime call that reaches the driver
/// through one of them (and so past every wrapper) can be told apart.
///
/// # Safety
/// As libcuda's `cuGetExportTable`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    id: *const [u8; 16],
) -> CUresult {
    let addr = real::symbol(c"cuGetExportTable");
    if addr == 0 {
        return super::driver::ERROR_NOT_INITIALIZED;
    }
    // SAFETY: libcuda's cuGetExportTable has this signature.
    let r = unsafe { std::mem::transmute::<usize, GetExportTable>(addr)(table, id) };
    if crate::log::log_level() >= 2 && !id.is_null() {
        let _ = std::panic::catch_unwind(|| {
            // SAFETY: the caller's 16-byte id; the table pointer the driver just wrote.
            let (uuid, t) = unsafe {
                (
                    *id,
                    if table.is_null() {
                        std::ptr::null()
                    } else {
                        *table
                    },
                )
            };
            let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
            shim_log!("cuGetExportTable {hex}: {r} table {t:p}");
        });
    }
    r
}
