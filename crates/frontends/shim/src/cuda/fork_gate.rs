//! Keeps the shim's own threads (completion watchers, the scheduler's and the agent's threads,
//! chaos) out of libcuda while the application forks.
//!
//! A child gets libcuda's memory as it was at the fork, locks included, and only the forking
//! thread. An application keeps its own threads out of CUDA around a fork (natively its child
//! would hang the same way), but the shim's threads call libcuda at any moment: a child that
//! leaves with `exit()` runs CUDA's exit handlers and could wait forever on a lock that a
//! watcher held when the fork happened. So the fork waits until none of them is inside libcuda
//! (or setting the process's timeslice through the RM interposer), and they wait until the fork
//! is done.
//!
//! Nothing else is held across the fork. Until build a3f9de6 the forking thread also took the RM
//! interposer's registry here, so a libcuda thread whose RM call ended during the fork waited
//! for it inside that call, and the child inherited libcuda half-way through the call. That is
//! one way to the hang seen under random suspensions, where a child that leaves with `exit()`
//! now and then spins in libcuda's ELF destructor (`bench/results/2026-11-23-h100-session5.md`);
//! whether it is the way has yet to be measured on a GPU. A forked child now leaves the registry
//! alone instead (`crate::rm`). What every thread was doing at the fork is kept for the crash
//! handler (`XPREEMPT_SHIM_BACKTRACE=1`, then SIGABRT), which also prints the code addresses on
//! the stack.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

static FORKING: AtomicBool = AtomicBool::new(false);
/// The shim's threads inside libcuda now.
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// A thread stuck inside libcuda (waiting on a lock the forking thread holds, say) must not
/// hang the application's fork for good.
const PATIENCE: Duration = Duration::from_millis(100);
/// `tid comm state` of every other thread at the last fork, for the crash handler (taken only
/// when it is installed).
static AT_FORK: Snapshot = Snapshot::new();

thread_local! {
    /// Nesting depth of `enter` on this thread.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Held by one of the shim's threads while it is inside libcuda.
pub struct Inside(bool);

/// Enters libcuda: on the shim's own threads, waits while a fork is under way and keeps the
/// next one waiting until the returned guard is dropped. Free on the application's threads.
pub fn enter() -> Inside {
    if !xpreempt_hal::placement::is_xpreempt_thread() {
        return Inside(false);
    }
    if DEPTH.with(|d| d.replace(d.get() + 1)) > 0 {
        return Inside(true);
    }
    loop {
        INSIDE.fetch_add(1, SeqCst);
        if !FORKING.load(SeqCst) {
            return Inside(true);
        }
        INSIDE.fetch_sub(1, SeqCst);
        while FORKING.load(SeqCst) {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        if self.0 && DEPTH.with(|d| d.replace(d.get() - 1)) == 1 {
            INSIDE.fetch_sub(1, SeqCst);
        }
    }
}

/// `pthread_atfork` prepare handler.
pub extern "C" fn before_fork() {
    FORKING.store(true, SeqCst);
    let since = Instant::now();
    while INSIDE.load(SeqCst) > 0 {
        if since.elapsed() > PATIENCE {
            shim_log!("fork: one of the shim's threads stayed inside libcuda; forking anyway");
            break;
        }
        std::thread::yield_now();
    }
    if crate::crash::installed() {
        AT_FORK.set(&other_threads());
    }
}

/// The process's other threads: (tid, name, state letter of /proc's stat).
fn other_threads() -> Vec<(u32, String, u8)> {
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() } as u32;
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&tid| tid != me)
        .filter_map(|tid| {
            let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
            // `tid (comm) S …`: the name may hold spaces and parentheses; the state follows the last `)`.
            let (head, tail) = stat.rsplit_once(')')?;
            let name = head.split_once('(')?.1.to_string();
            let state = *tail.trim_start().as_bytes().first()?;
            Some((tid, name, state))
        })
        .collect()
}

/// The snapshot as text, for the crash handler (no allocation to read it).
pub fn threads_at_last_fork() -> &'static [u8] {
    AT_FORK.get()
}

/// A fixed buffer written by the forking thread only (forks are serialized by the gate's flag
/// in practice; a torn read costs a garbled diagnostic, nothing else).
struct Snapshot {
    len: AtomicUsize,
    text: std::cell::UnsafeCell<[u8; 1024]>,
}

// SAFETY: see the type's comment: one writer at a time, readers tolerate a torn copy.
unsafe impl Sync for Snapshot {}

impl Snapshot {
    const fn new() -> Self {
        Self {
            len: AtomicUsize::new(0),
            text: std::cell::UnsafeCell::new([0; 1024]),
        }
    }

    fn set(&self, threads: &[(u32, String, u8)]) {
        let mut text = String::new();
        for (tid, name, state) in threads {
            text.push_str(&format!("{tid} {name} {}\n", *state as char));
        }
        let n = text.len().min(1024);
        self.len.store(0, SeqCst);
        // SAFETY: the buffer is 1024 bytes and `n` ≤ 1024; see the type's comment on races.
        unsafe { (&mut *self.text.get())[..n].copy_from_slice(&text.as_bytes()[..n]) };
        self.len.store(n, SeqCst);
    }

    fn get(&self) -> &[u8] {
        let n = self.len.load(SeqCst);
        // SAFETY: `n` ≤ 1024 bytes of the buffer.
        unsafe { &(&*self.text.get())[..n] }
    }
}

/// `pthread_atfork` handler in the parent and (with the rest of the child's) in the child.
pub extern "C" fn after_fork() {
    FORKING.store(false, SeqCst);
}

/// Serializes the tests that fork-prepare (they share the process's registry).
#[cfg(test)]
pub(crate) static FORK_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn a_fork_waits_for_the_shims_threads_to_leave_the_driver_and_holds_them_off() {
        let _serial = FORK_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let entered = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let inside_now = Arc::new(AtomicBool::new(false));
        let worker = {
            let (entered, stop, inside_now) = (entered.clone(), stop.clone(), inside_now.clone());
            std::thread::Builder::new()
                .name("xpreempt-test".into())
                .spawn(move || {
                    while !stop.load(SeqCst) {
                        let _g = enter();
                        let _nested = enter();
                        inside_now.store(true, SeqCst);
                        entered.fetch_add(1, SeqCst);
                        std::thread::sleep(Duration::from_micros(200));
                        inside_now.store(false, SeqCst);
                    }
                })
                .expect("spawn")
        };
        while entered.load(SeqCst) < 3 {
            std::thread::yield_now();
        }
        for _ in 0..20 {
            before_fork();
            // The "fork": nobody of the shim's is inside, and nobody gets in.
            assert!(
                !inside_now.load(SeqCst),
                "a shim thread was inside at the fork"
            );
            let n = entered.load(SeqCst);
            std::thread::sleep(Duration::from_millis(2));
            assert_eq!(
                entered.load(SeqCst),
                n,
                "a shim thread entered during the fork"
            );
            after_fork();
            let n = entered.load(SeqCst);
            while entered.load(SeqCst) == n {
                std::thread::yield_now();
            }
        }
        stop.store(true, SeqCst);
        worker.join().expect("join");
        // The application's own threads never wait.
        FORKING.store(true, SeqCst);
        drop(enter());
        after_fork();
    }

    #[test]
    fn the_fork_snapshot_names_the_other_threads_and_their_states() {
        let _serial = FORK_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let stop = Arc::new(AtomicBool::new(false));
        let sleeper = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("some (thread) x".into())
                .spawn(move || {
                    while !stop.load(SeqCst) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                })
                .expect("spawn")
        };
        std::thread::sleep(Duration::from_millis(5));
        AT_FORK.set(&other_threads());
        let text = String::from_utf8(threads_at_last_fork().to_vec()).expect("utf8");
        let line = text
            .lines()
            .find(|l| l.contains("some (thread) x"))
            .unwrap_or_else(|| panic!("no line for the thread in {text:?}"));
        let state = line.rsplit(' ').next().expect("state");
        assert!(["S", "R"].contains(&state), "{line}");
        stop.store(true, SeqCst);
        sleeper.join().expect("join");
    }
}
