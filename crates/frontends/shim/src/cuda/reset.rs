//! Context teardown (`cuCtxDestroy`, `cuDevicePrimaryCtxRelease`, `cuDevicePrimaryCtxReset`)
//! reached through a pointer that cuGetProcAddress handed out but that is none of libcuda's
//! exports, so no wrapper of the shim's stands for it: the shim hands out a trampoline instead,
//! which retires the queues (as the exported wrappers do) and then calls the driver's own
//! pointer. Without it the queues would keep events of a destroyed context, and their
//! completion watchers would crash inside libcuda.

use super::driver::{CUresult, ERROR_NOT_INITIALIZED};
use super::{launch, streams};
use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The entry points (by the name the caller asks cuGetProcAddress for) that tear a context down.
const TEARDOWN: [&[u8]; 3] = [
    b"cuCtxDestroy",
    b"cuDevicePrimaryCtxRelease",
    b"cuDevicePrimaryCtxReset",
];

/// The driver's pointer behind each trampoline (0: free). Each takes one argument (a context or
/// a device).
static SLOTS: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];

type Teardown = unsafe extern "C" fn(usize) -> CUresult;

macro_rules! trampolines {
    ($($i:literal $name:ident),*) => {
        $(
            unsafe extern "C" fn $name(a: usize) -> CUresult {
                let real = SLOTS[$i].load(Ordering::Acquire);
                if real == 0 {
                    return ERROR_NOT_INITIALIZED;
                }
                let _ = std::panic::catch_unwind(streams::forget_all);
                // SAFETY: the driver's pointer for a one-argument teardown entry point.
                let r = unsafe { std::mem::transmute::<usize, Teardown>(real)(a) };
                let _ = std::panic::catch_unwind(launch::forget_layouts);
                r
            }
        )*
        const TRAMPOLINES: [Teardown; 8] = [$($name),*];
    };
}

trampolines!(0 t0, 1 t1, 2 t2, 3 t3, 4 t4, 5 t5, 6 t6, 7 t7);

/// The trampoline around `real`, if `symbol` is a teardown entry point (and a slot is free).
pub fn trampoline(symbol: &CStr, real: usize) -> Option<usize> {
    if real == 0 || !TEARDOWN.contains(&symbol.to_bytes()) {
        return None;
    }
    for (slot, t) in SLOTS.iter().zip(TRAMPOLINES) {
        match slot.compare_exchange(0, real, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(t as usize),
            Err(held) if held == real => return Some(t as usize),
            Err(_) => {}
        }
    }
    shim_log!(
        "no trampoline left for {}: its context teardown passes unwrapped",
        symbol.to_string_lossy()
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_teardown_names_get_a_trampoline_and_one_per_pointer() {
        assert_eq!(trampoline(c"cuLaunchKernel", 0x1000), None);
        let a = trampoline(c"cuDevicePrimaryCtxReset", 0x2000).expect("a trampoline");
        assert_eq!(trampoline(c"cuDevicePrimaryCtxReset", 0x2000), Some(a));
        let b = trampoline(c"cuCtxDestroy", 0x3000).expect("another");
        assert_ne!(a, b);
        assert_eq!(trampoline(c"cuCtxDestroy", 0), None);
    }
}
