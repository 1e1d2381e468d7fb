//! The shim's own log: one line per event on stderr through `write(2)`, so that it works in any
//! state of the host process (no lock, no allocation failure, no panic on a closed stderr).

use std::sync::atomic::{AtomicU32, Ordering};

/// XPREEMPT_SHIM_LOG, read once (u32::MAX: not read yet).
static LOG_LEVEL: AtomicU32 = AtomicU32::new(u32::MAX);

/// XPREEMPT_SHIM_LOG: unset = quiet, 1 = channel groups, controls, context teardowns and missed
/// cuGetProcAddress wrappers, 2 = also every RM_ALLOC/FREE and every cuGetProcAddress request.
pub fn log_level() -> u32 {
    let l = LOG_LEVEL.load(Ordering::Relaxed);
    if l != u32::MAX {
        return l;
    }
    let l = std::env::var("XPREEMPT_SHIM_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    LOG_LEVEL.store(l, Ordering::Relaxed);
    l
}

pub fn log_enabled() -> bool {
    log_level() >= 1
}

/// Turns the log on in a unit test that needs what it gates (the exit report's call names).
#[cfg(test)]
pub fn enable_for_test() {
    LOG_LEVEL.store(log_level().max(1), Ordering::Relaxed);
}

/// Writes one line to stderr with `write(2)`: no lock, no panic on a closed or full stderr.
pub fn log_line(args: std::fmt::Arguments<'_>) {
    let mut line = String::with_capacity(160);
    if std::fmt::write(&mut line, format_args!("xpreempt-shim: {args}\n")).is_err() {
        return;
    }
    let mut b = line.as_bytes();
    while !b.is_empty() {
        // SAFETY: writing a live byte buffer to fd 2.
        let n = unsafe { libc::write(2, b.as_ptr().cast(), b.len()) };
        if n <= 0 {
            return;
        }
        b = &b[n as usize..];
    }
}

macro_rules! shim_log {
    ($($t:tt)*) => { $crate::log::log_line(format_args!($($t)*)) };
}
