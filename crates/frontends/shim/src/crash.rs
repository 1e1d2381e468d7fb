//! `XPREEMPT_SHIM_BACKTRACE=1`: a fatal signal in the process prints the faulting thread's
//! stack (glibc's `backtrace_symbols_fd`, no allocation) to stderr before the process dies as it
//! would have, so that a crash inside or beside the shim can be placed without a debugger.

use std::sync::Once;

extern "C" fn on_fatal(sig: libc::c_int) {
    let mut frames = [std::ptr::null_mut::<libc::c_void>(); 64];
    // SAFETY: `frames` holds 64 pointers; both calls are async-signal-safe once libgcc is loaded
    // (`install` loads it by taking one backtrace up front).
    unsafe {
        let n = libc::backtrace(frames.as_mut_ptr(), frames.len() as libc::c_int);
        let msg = b"xpreempt-shim: fatal signal, stack:\n";
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::backtrace_symbols_fd(frames.as_ptr(), n, 2);
        let at_fork = crate::cuda::fork_gate::threads_at_last_fork();
        if !at_fork.is_empty() {
            let msg = b"xpreempt-shim: the other threads at the last fork (tid name state):\n";
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::write(2, at_fork.as_ptr().cast(), at_fork.len());
        }
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

pub fn install() {
    static ONCE: Once = Once::new();
    if std::env::var_os("XPREEMPT_SHIM_BACKTRACE").is_none() {
        return;
    }
    ONCE.call_once(|| {
        let mut warm = [std::ptr::null_mut::<libc::c_void>(); 1];
        // SAFETY: plain libc calls with valid arguments.
        unsafe {
            libc::backtrace(warm.as_mut_ptr(), 1);
            for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT, libc::SIGILL] {
                libc::signal(sig, on_fatal as *const () as libc::sighandler_t);
            }
        }
    });
}
