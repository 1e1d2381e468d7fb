//! Keeps a queue's completion watcher off the CPU of the thread that launches on the queue
//! (`CudaQueue`'s, under the shim and the benchmarks alike).
//!
//! The launching thread wakes the watcher when its queue gets work, and Linux tends to place a
//! woken thread on the waker's CPU; the watcher's short naps then preempt the launching thread
//! until the load balancer separates them. On the H100 machine this showed as bursts of slow
//! latency-critical requests lasting several milliseconds. So the watcher looks where it runs
//! whenever it synchronizes, and moves away when it shares the launcher's CPU.

#![allow(unsafe_code)] // sched_getcpu / sched_{get,set}affinity

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, Ordering};

/// Whether the calling thread is one of xpreempt's own (completion watchers, scheduler, agent
/// and test threads are all named `xpreempt-…`); learnt once per thread.
pub fn is_xpreempt_thread() -> bool {
    thread_local! {
        static OWN: Cell<Option<bool>> = const { Cell::new(None) };
    }
    OWN.with(|o| {
        *o.get().get_or_insert_with(|| {
            std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("xpreempt-"))
        })
    })
}

/// The CPUs the process may use, read once.
fn allowed() -> Option<&'static libc::cpu_set_t> {
    static SET: OnceLock<Option<libc::cpu_set_t>> = OnceLock::new();
    SET.get_or_init(|| {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; the call fills it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a live cpu_set_t of the size passed.
        let r = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
        (r == 0).then_some(set)
    })
    .as_ref()
}

/// The CPU the calling thread runs on (-1 if unknown).
fn current_cpu() -> i32 {
    // SAFETY: no arguments; glibc answers from the thread's rseq area.
    unsafe { libc::sched_getcpu() }
}

/// On the launching thread: remembers where it runs.
pub fn note_launcher(cpu: &AtomicI32) {
    cpu.store(current_cpu(), Ordering::Relaxed);
}

/// On the watcher: if it runs where the launcher last ran, it may run anywhere else the process
/// may (one system call, on the watcher's side). The application's own threads never move.
pub fn step_aside(launcher: &AtomicI32) {
    if !is_xpreempt_thread() {
        return;
    }
    let theirs = launcher.load(Ordering::Relaxed);
    if theirs < 0 || theirs != current_cpu() {
        return;
    }
    let Some(base) = allowed() else { return };
    let mut set = *base;
    // SAFETY: `theirs` is a CPU number the kernel gave, below CPU_SETSIZE.
    unsafe { libc::CPU_CLR(theirs as usize, &mut set) };
    // SAFETY: plain reads of a cpu_set_t.
    if unsafe { libc::CPU_COUNT(&set) } == 0 {
        return; // a single-CPU process: nowhere to go
    }
    // SAFETY: `set` is a live cpu_set_t of the size passed; 0 is the calling thread.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watcher_on_the_launchers_cpu_moves_and_one_elsewhere_stays() {
        let Some(base) = allowed() else { return };
        // SAFETY: reading a cpu_set_t.
        if unsafe { libc::CPU_COUNT(base) } < 2 {
            return; // nothing to show on one CPU
        }
        let launcher = AtomicI32::new(-1);
        std::thread::Builder::new()
            .name("xpreempt-test".into())
            .spawn(move || {
                note_launcher(&launcher);
                let here = launcher.load(Ordering::Relaxed);
                assert!(here >= 0);
                step_aside(&launcher);
                for _ in 0..100 {
                    assert_ne!(current_cpu(), here, "still on the launcher's CPU");
                    std::thread::yield_now();
                }
                // Elsewhere: nothing changes (the affinity stays as set).
                launcher.store(-1, Ordering::Relaxed);
                step_aside(&launcher);
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
