//! `libxpreempt.so`: what an application calls to change its own scheduling, request by request
//! — raise its priority before a latency-critical request and lower it after, or hand the
//! scheduler a deadline. Declared in `include/xpreempt.h`.
//!
//! Each call is one round trip to `xpreemptd` on a connection kept open between calls (tens of
//! µs, not on the launch path). The change applies to every queue of this process, at once.
//! Nothing here panics across the C boundary: a failure returns -1 and
//! [`xpreempt_last_error`] says why.

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use xpreempt_ipc::msg::Target;
use xpreempt_ipc::operator::{Operator, OperatorError};
use xpreempt_types::Hints;

/// Scheduling hints; a zero (or, for `latency_critical`, a negative) field is unset.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct XpreemptHints {
    pub deadline_ns: u64,
    pub utilization_share: f64,
    pub timeslice_ns: u64,
    pub latency_critical: c_int,
}

static CONNECTION: Mutex<Option<Operator>> = Mutex::new(None);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn remember(message: String) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs `f` on the cached connection, connecting (again) if needed; a connection that failed
/// is dropped so that the next call reconnects to a restarted daemon.
fn with_daemon(f: impl Fn(&mut Operator) -> Result<u32, OperatorError>) -> c_int {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut conn = CONNECTION.lock().unwrap_or_else(|p| p.into_inner());
        for attempt in 0..2 {
            if conn.is_none() {
                // Inside an application: a stopped or overloaded daemon fails the call at once
                // (-1, "did not answer within 100 ms") instead of holding the caller.
                *conn = Some(Operator::connect_within(
                    &xpreempt_ipc::default_socket(),
                    xpreempt_ipc::msg::Role::Operator,
                    "libxpreempt",
                    xpreempt_ipc::operator::APPLICATION_TIMEOUT,
                )?);
            }
            let Some(op) = conn.as_mut() else { continue };
            match f(op) {
                Ok(n) => return Ok(n),
                // The daemon's answer: nothing wrong with the connection.
                Err(e @ OperatorError::Refused(_)) => return Err(e),
                Err(e) if attempt == 1 => return Err(e),
                Err(_) => *conn = None,
            }
        }
        Err(OperatorError::Unexpected)
    }));
    match outcome {
        Ok(Ok(n)) => n.min(c_int::MAX as u32) as c_int,
        Ok(Err(e)) => {
            remember(chain(&e));
            -1
        }
        Err(_) => {
            remember("internal error in libxpreempt (a bug; please report it)".into());
            -1
        }
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn me() -> Target {
    Target::Process(std::process::id())
}

/// Sets the logical priority of every queue of this process (larger runs first). Returns how
/// many queues changed, or -1.
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_set_priority(priority: c_int) -> c_int {
    with_daemon(|op| op.set_priority(me(), priority))
}

/// Replaces the hints of every queue of this process. Returns how many changed, or -1.
///
/// # Safety
/// `hints` is null or points to a readable `struct xpreempt_hints`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xpreempt_set_hints(hints: *const XpreemptHints) -> c_int {
    // SAFETY: the caller promises a null or valid pointer; a copy is taken at once.
    let Some(h) = (unsafe { hints.as_ref() }).copied() else {
        remember("xpreempt_set_hints: hints is NULL".into());
        return -1;
    };
    let hints = Hints {
        deadline_ns: (h.deadline_ns != 0).then_some(h.deadline_ns),
        utilization_share: (h.utilization_share != 0.0).then_some(h.utilization_share),
        timeslice_ns: (h.timeslice_ns != 0).then_some(h.timeslice_ns),
        latency_critical: (h.latency_critical >= 0).then_some(h.latency_critical != 0),
    };
    if let Err(e) = hints.validate() {
        remember(format!("xpreempt_set_hints: {e}"));
        return -1;
    }
    with_daemon(|op| op.set_hints(me(), hints))
}

/// Why the last call on this thread returned -1 (valid until the next failing call).
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
