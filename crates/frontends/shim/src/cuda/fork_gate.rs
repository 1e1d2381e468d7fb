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
//! The fork also waits for a shim thread that is ending (a completion watcher of a destroyed
//! stream) to be gone: see [`thread_ending`]. Nothing else is held across the fork (a forked
//! child leaves the RM interposer's registry alone instead, `crate::rm`). What every thread was
//! doing at the fork is kept for the crash handler (`XPREEMPT_SHIM_BACKTRACE=1`, then SIGABRT),
//! which also prints the code addresses on the stack.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

static FORKING: AtomicBool = AtomicBool::new(false);
/// The shim's threads inside libcuda now.
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// Thread ids of the shim's threads that are ending (0: a free slot); see [`thread_ending`].
static ENDING: [AtomicI32; 16] = [const { AtomicI32::new(0) }; 16];
/// A thread stuck inside libcuda (waiting on a lock the forking thread holds, say) must not
/// hang the application's fork for good.
const PATIENCE: Duration = Duration::from_millis(100);

thread_local! {
    /// Nesting depth of `enter` on this thread.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Held by one of the shim's threads while it is inside libcuda.
pub struct Inside(bool);

/// Enters libcuda: on the shim's own threads, waits while a fork is under way and keeps the
/// next one waiting until the returned guard is dropped. Free on the application's threads.
pub fn enter() -> Inside {
    if !xpreempt_cuda::placement::is_xpreempt_thread() {
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

/// On one of the shim's threads that is about to end (a completion watcher whose stream was
/// destroyed): its thread-local destructors, libcuda's among them, run next. A fork under way
/// finishes first, and a fork from now on waits until the thread is gone.
///
/// A child forked while a thread was in libcuda's destructor inherits libcuda half-way through
/// it. Measured: the `fork_after_init` children that hung in libcuda's ELF destructor were all
/// forked just after the program destroyed a stream, with that stream's watcher still alive.
pub fn thread_ending() {
    if !xpreempt_cuda::placement::is_xpreempt_thread() {
        return;
    }
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    forget_ended();
    loop {
        let Some(slot) = ENDING
            .iter()
            .find(|s| s.compare_exchange(0, me, SeqCst, SeqCst).is_ok())
        else {
            shim_log!("fork: too many of the shim's threads ending at once; not tracked");
            return;
        };
        if !FORKING.load(SeqCst) {
            return;
        }
        slot.store(0, SeqCst);
        while FORKING.load(SeqCst) {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

fn alive(tid: i32) -> bool {
    std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
}

/// Frees the slots of threads that are gone.
fn forget_ended() {
    for slot in &ENDING {
        let tid = slot.load(SeqCst);
        if tid != 0 && !alive(tid) {
            let _ = slot.compare_exchange(tid, 0, SeqCst, SeqCst);
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
    'ending: for slot in &ENDING {
        let tid = slot.load(SeqCst);
        while tid != 0 && alive(tid) {
            if since.elapsed() > PATIENCE {
                shim_log!("fork: one of the shim's threads is still ending; forking anyway");
                break 'ending;
            }
            std::thread::yield_now();
        }
    }
    forget_ended();
    if crate::crash::installed() {
        crate::crash::note_threads_at_fork(&other_threads());
    }
}

/// The process's other threads: (tid, name, state letter of /proc's stat, where it sleeps).
fn other_threads() -> Vec<(u32, String, u8, String)> {
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
            let wchan =
                std::fs::read_to_string(format!("/proc/self/task/{tid}/wchan")).unwrap_or_default();
            Some((tid, name, state, wchan))
        })
        .collect()
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
    fn a_fork_waits_until_an_ending_shim_thread_is_gone_and_holds_off_one_that_would_end() {
        let _serial = FORK_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::Builder::new()
            .name("xpreempt-test-ending".into())
            .spawn(move || {
                thread_ending();
                // SAFETY: gettid has no preconditions.
                tx.send(unsafe { libc::gettid() }).expect("send");
                // Stands for the thread's teardown after it said it ends.
                std::thread::sleep(Duration::from_millis(30));
            })
            .expect("spawn");
        let tid = rx.recv().expect("tid");
        let since = Instant::now();
        before_fork();
        assert!(
            !alive(tid),
            "the fork went on while the thread was still ending"
        );
        assert!(since.elapsed() >= Duration::from_millis(20));
        assert!(
            ENDING.iter().all(|s| s.load(SeqCst) != tid),
            "its slot was kept"
        );
        after_fork();
        t.join().expect("join");

        // A thread that comes to its end during a fork waits until the fork is done.
        FORKING.store(true, SeqCst);
        let done = Arc::new(AtomicBool::new(false));
        let t = {
            let done = done.clone();
            std::thread::Builder::new()
                .name("xpreempt-test-late".into())
                .spawn(move || {
                    thread_ending();
                    done.store(true, SeqCst);
                })
                .expect("spawn")
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!done.load(SeqCst), "a thread ended during the fork");
        after_fork();
        t.join().expect("join");
        assert!(done.load(SeqCst));
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
        crate::crash::note_threads_at_fork(&other_threads());
        let text = String::from_utf8(crate::crash::threads_at_last_fork().to_vec()).expect("utf8");
        let line = text
            .lines()
            .find(|l| l.contains("some (thread) x"))
            .unwrap_or_else(|| panic!("no line for the thread in {text:?}"));
        let state = line
            .split_once("some (thread) x ")
            .and_then(|(_, rest)| rest.split(' ').next())
            .expect("state");
        assert!(["S", "R"].contains(&state), "{line}");
        stop.store(true, SeqCst);
        sleeper.join().expect("join");
    }
}
