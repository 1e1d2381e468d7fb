//! Which of an application's kernels are guard-built (`xpreempt_guard.cuh`), so that Lv2 may
//! fill in their guard parameters and stop them.
//!
//! The application opts in per kernel: `XP_GUARD_MARK(name)` defines a device global named
//! `xpreempt_guard_<name>` (4 bytes) beside the kernel, which takes `XP_GUARD_PARAMS` first and
//! is launched with the placeholders `XP_GUARD_NONE`. A launched handle is a guarded kernel when
//! both hold:
//!
//! - its module (`cuFuncGetName` + `cuFuncGetModule` + `cuModuleGetGlobal`) or, for a `CUkernel`
//!   of a library, its library (`cuKernelGetName` + `cuKernelGetLibrary` + `cuLibraryGetGlobal`)
//!   has the marker global of its name, 4 bytes long;
//! - its first three parameters have the guard's layout (8-byte flag pointer at 0, 8-byte
//!   completion pointer at 8, 4-byte epoch at 16), from `cuFuncGetParamInfo`.
//!
//! Why a marker global: it is found from the handle the application launches, through calls the
//! driver answers from the loaded image (no device memory is read, nothing is launched), it
//! works for modules, libraries and the runtime's lazy loading alike, and a kernel without it
//! is never touched, whatever its parameters look like. The layout check keeps a marker that
//! names the wrong kernel (or an old build) from having its arguments overwritten.
//!
//! The answer is cached per handle, like the parameter layouts, and forgotten with them when a
//! module or library is unloaded or a context torn down (the driver may reuse a handle).

use super::driver::{self, Handle, SUCCESS};
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char};
use std::sync::Mutex;

/// The prefix of a marker global; the kernel's name follows.
pub const MARKER_PREFIX: &str = "xpreempt_guard_";
/// The marker's size in bytes (an `unsigned`).
const MARKER_BYTES: usize = 4;
/// (offset, size) of `XP_GUARD_PARAMS`: flag pointer, completion pointer, epoch.
pub const GUARD_LAYOUT: [(usize, usize); 3] = [(0, 8), (8, 8), (16, 4)];

static GUARDED: Mutex<Option<HashMap<usize, bool>>> = Mutex::new(None);

/// Whether a kernel's parameters start with `XP_GUARD_PARAMS`.
pub fn has_guard_layout(layout: &[(usize, usize)]) -> bool {
    layout.get(..3) == Some(&GUARD_LAYOUT[..])
}

/// The marker's name for kernel `name`.
pub fn marker_name(name: &CStr) -> Option<CString> {
    let mut v = MARKER_PREFIX.as_bytes().to_vec();
    v.extend_from_slice(name.to_bytes());
    CString::new(v).ok()
}

/// Forgets every answer (with the layouts: after an unload or a context teardown).
pub fn forget() {
    if let Some(m) = GUARDED.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        m.clear();
    }
}

/// Whether `f` (a CUfunction or CUkernel, as launched) is a guarded kernel; `layout` is its
/// parameter layout, if known. Asked the driver once per handle.
pub fn recognized(f: Handle, layout: Option<&[(usize, usize)]>) -> bool {
    let mut g = GUARDED.lock().unwrap_or_else(|p| p.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(&known) = map.get(&(f as usize)) {
        return known;
    }
    let guarded = layout.is_some_and(has_guard_layout) && has_marker(f);
    if guarded && crate::log::log_enabled() {
        shim_log!("kernel {f:?} is guard-built: Lv2 fills in its guard parameters");
    }
    map.insert(f as usize, guarded);
    guarded
}

/// The marker global of `f`'s name, in its module or its library.
fn has_marker(f: Handle) -> bool {
    type NameFn = fn(*mut *const c_char, Handle) -> u32;
    type OwnerFn = fn(*mut Handle, Handle) -> u32;
    type GlobalFn = fn(*mut u64, *mut usize, Handle, *const c_char) -> u32;
    let ways: [(NameFn, OwnerFn, GlobalFn); 2] = [
        (
            driver::cuFuncGetName,
            driver::cuFuncGetModule,
            driver::cuModuleGetGlobal_v2,
        ),
        (
            driver::cuKernelGetName,
            driver::cuKernelGetLibrary,
            driver::cuLibraryGetGlobal,
        ),
    ];
    for (name_of, owner_of, global) in ways {
        let mut name: *const c_char = std::ptr::null();
        if name_of(&mut name, f) != SUCCESS || name.is_null() {
            continue;
        }
        // SAFETY: the driver returned a NUL-terminated name that lives as long as the module.
        let Some(marker) = marker_name(unsafe { CStr::from_ptr(name) }) else {
            continue;
        };
        let mut owner: Handle = std::ptr::null_mut();
        if owner_of(&mut owner, f) != SUCCESS || owner.is_null() {
            continue;
        }
        let (mut ptr, mut bytes) = (0u64, 0usize);
        if global(&mut ptr, &mut bytes, owner, marker.as_ptr()) == SUCCESS && bytes == MARKER_BYTES
        {
            return true;
        }
    }
    false
}

/// How many launches of guard-built kernels got their guard parameters filled in (Lv2).
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_shim_cuda_guarded() -> u64 {
    xpreempt_cuda::queue::guarded_launches()
}

/// How many times a stopped guarded kernel was launched again after a resume.
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_shim_cuda_relaunched() -> u64 {
    xpreempt_cuda::queue::relaunches()
}

/// How many suspensions set the flag before they took the stream's lock (a stop ahead).
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_shim_cuda_stopped_ahead() -> u64 {
    xpreempt_cuda::queue::stops_ahead()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_layout_is_the_headers_three_parameters_first() {
        assert!(has_guard_layout(&[(0, 8), (8, 8), (16, 4)]));
        assert!(has_guard_layout(&[(0, 8), (8, 8), (16, 4), (24, 8)]));
        assert!(!has_guard_layout(&[(0, 8), (8, 8)]), "too few parameters");
        assert!(!has_guard_layout(&[(0, 8), (8, 8), (16, 8), (24, 8)]));
        assert!(!has_guard_layout(&[(0, 4), (8, 8), (16, 4)]));
        assert!(!has_guard_layout(&[]));
    }

    #[test]
    fn the_marker_is_named_after_the_kernel() {
        assert_eq!(
            marker_name(c"scale").unwrap().as_bytes(),
            b"xpreempt_guard_scale"
        );
    }
}
