//! A few shared words between the LC and BE sides of a benchmark, in one process or two
//! (a file in /dev/shm mapped by both).
//!
//! This is the benchmark's own controller, not xpreempt's scheduler: scenarios that suspend the
//! BE side through `lc_active` measure the preemption mechanism alone (`xpreempt-bench lcbe`
//! labels them so).

use crate::{BenchError, Result};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[repr(C)]
#[derive(Default)]
pub struct Control {
    /// The LC side has a request in flight: the BE side must be suspended.
    pub lc_active: AtomicU32,
    /// 0 warm-up, 1 measuring, 2 done.
    pub phase: AtomicU32,
    /// The BE side is running (set once it has work in flight).
    pub be_ready: AtomicU32,
    /// The BE side is suspended (acknowledges lc_active).
    pub be_suspended: AtomicU32,
    pub suspends: AtomicU64,
}

impl Control {
    /// How long the BE side may take to start (a child process builds its kernels first).
    pub const BE_START_PATIENCE: Duration = Duration::from_secs(30);
    /// How long the BE side runs before measuring starts: its first kernels and the hardware
    /// queues reach their steady state.
    pub const BE_SETTLE: Duration = Duration::from_millis(200);

    /// Blocks until the BE side has work in flight, then lets it settle.
    pub fn wait_for_be(&self, patience: Duration) -> Result<()> {
        let t = Instant::now();
        while self.be_ready.load(Ordering::Acquire) == 0 {
            // A BE side that fails says so by ending the run (phase 2) before it started.
            if self.phase.load(Ordering::Acquire) == 2 {
                return Err(BenchError::BeGaveUp);
            }
            if t.elapsed() > patience {
                return Err(BenchError::TimedOut {
                    what: "the BE side did not start",
                    secs: patience.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Self::BE_SETTLE);
        Ok(())
    }

    /// A measuring window with no LC request loop (BE alone, a probe): waits for the BE side,
    /// then phase 1 while `during` runs, then phase 2 (also when the BE side never started, so
    /// that it stops if it starts late).
    pub fn window<T>(&self, during: impl FnOnce() -> T) -> Result<T> {
        let started = self.wait_for_be(Self::BE_START_PATIENCE);
        let r = started.map(|()| {
            self.phase.store(1, Ordering::Release);
            during()
        });
        self.phase.store(2, Ordering::Release);
        r
    }
}

pub struct SharedControl {
    ptr: *mut Control,
    _file: std::fs::File,
}

// SAFETY: the mapping is only reached through `&Control`, whose fields are all atomics, so any
// number of threads may share and use it; it is unmapped once, in Drop.
unsafe impl Send for SharedControl {}
// SAFETY: as above: `&SharedControl` hands out `&Control` only.
unsafe impl Sync for SharedControl {}

impl SharedControl {
    /// Creates (truncating) or opens the file and maps it.
    pub fn open(path: &std::path::Path, create: bool) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(create)
            .open(path)?;
        let len = size_of::<Control>();
        if create {
            file.set_len(len as u64)?;
        } else if file.metadata()?.len() < len as u64 {
            // Mapped past its end, the missing part would fault on first use.
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "control file shorter than the control block",
            ));
        }
        // SAFETY: a fresh shared mapping of `len` bytes of an open file at least that long
        // (checked above); no pointer is passed in, and the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            ptr: p.cast(),
            _file: file,
        })
    }
}

impl std::ops::Deref for SharedControl {
    type Target = Control;
    fn deref(&self) -> &Control {
        // SAFETY: the mapping is page-aligned, `size_of::<Control>()` long and lives until Drop;
        // `Control` is all atomics, for which any bit pattern (a zeroed new file included) is
        // valid, and the other process only ever touches it atomically too.
        unsafe { &*self.ptr }
    }
}

impl Drop for SharedControl {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `open` mapped, once; no `&Control` outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), size_of::<Control>()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::*;

    #[test]
    fn a_window_runs_between_phase_1_and_2_once_the_be_side_is_ready() {
        let ctl = Control::default();
        ctl.be_ready.store(1, Release);
        let phase = ctl.window(|| ctl.phase.load(Acquire)).expect("BE is ready");
        assert_eq!((phase, ctl.phase.load(Acquire)), (1, 2));
    }

    #[test]
    fn a_be_side_that_gave_up_or_never_came_is_an_error() {
        let ctl = Control::default();
        ctl.phase.store(2, Release);
        assert!(matches!(
            ctl.wait_for_be(Duration::from_secs(5)),
            Err(BenchError::BeGaveUp)
        ));
        let ctl = Control::default();
        assert!(matches!(
            ctl.wait_for_be(Duration::from_millis(20)),
            Err(BenchError::TimedOut { .. })
        ));
    }

    #[test]
    fn both_sides_see_one_control_block_through_the_file() {
        let path = std::env::temp_dir().join(format!("xpreempt-ctl-test-{}", std::process::id()));
        let a = SharedControl::open(&path, true).expect("create");
        let b = SharedControl::open(&path, false).expect("open");
        a.be_ready.store(1, Release);
        assert_eq!(b.be_ready.load(Acquire), 1);
        drop((a, b));
        let _ = std::fs::remove_file(&path);
    }
}
