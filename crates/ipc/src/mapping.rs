//! A shared mapping of a sealed `memfd`, and the futex calls on words inside one: what the
//! per-client segment ([`crate::shm`]) and the per-user board ([`crate::board`]) are made of.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// A mapped memfd. Only atomics are ever read or written through it.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is only reached through atomics (see the users' layouts), which are shared
// between threads and processes by design; the pointer stays valid until Drop unmaps it.
unsafe impl Send for Mapping {}
// SAFETY: as above; every access through `&Mapping` is an atomic operation.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// A new, zeroed memfd of `len` bytes, sealed against resizing, mapped.
    pub fn create(name: &std::ffi::CStr, len: usize) -> io::Result<Self> {
        // SAFETY: the name is NUL-terminated; the flags are valid for memfd_create.
        let raw = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate and fcntl on a descriptor we own.
        let sized = unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } == 0
            && unsafe {
                libc::fcntl(
                    fd.as_raw_fd(),
                    libc::F_ADD_SEALS,
                    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
                )
            } == 0;
        if !sized {
            return Err(io::Error::last_os_error());
        }
        Self::map(fd, len)
    }

    /// The size of a received descriptor's file.
    pub fn size_of(fd: &OwnedFd) -> io::Result<usize> {
        // SAFETY: fstat into a zeroed buffer on a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st.st_size as usize)
    }

    pub fn map(fd: OwnedFd, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of `len` bytes of a file at least that long.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(Self { ptr, len, fd })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// A `T` at `offset`, which the caller checked: `offset + size_of::<T>() <= len`, aligned
    /// for `T`, and `T` made of atomics only (valid for any bit pattern).
    ///
    /// # Safety
    /// As above.
    pub unsafe fn at<T>(&self, offset: usize) -> &T {
        debug_assert!(offset + size_of::<T>() <= self.len);
        // SAFETY: the caller's contract.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<T>() }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a live, aligned u32 with a valid timespec; shared (not PRIVATE)
    // because the word lives in memory mapped by two processes. Any return is fine: callers
    // re-read the word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE of at most one waiter on a live, aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            1u32,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}
