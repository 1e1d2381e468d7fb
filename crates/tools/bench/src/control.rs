//! A few shared words between the LC and BE sides of a benchmark, in one process or two
//! (a file in /dev/shm mapped by both).
//!
//! This is the benchmark's own controller, not xpreempt's scheduler: scenarios that suspend the
//! BE side through `lc_active` measure the preemption mechanism alone (`xpreempt bench lcbe`
//! labels them so).

use std::sync::atomic::{AtomicU32, AtomicU64};

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
