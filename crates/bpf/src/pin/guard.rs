//! What makes the state directory safe to trust: who owns it, who may write it, and one writer
//! at a time.
//!
//! The default directory sits in `/tmp`, where anyone may create `xpreempt-$UID` first and
//! then feed this user's scheduler a policy of their choosing. So an existing directory is
//! used only if it is a real directory (not a symbolic link), owned by this user and writable
//! by nobody else; a missing one is created with mode 0700. Once that holds, nobody else can
//! replace it or anything in it (`/tmp` is sticky), so checking before use is not a race.

use super::{PinError, io};
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use thiserror::Error;

/// Why an existing state directory is not used.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum UnsafeDir {
    #[error("it is a symbolic link")]
    Symlink,
    #[error("it is not a directory")]
    NotDirectory,
    #[error("it belongs to uid {owner}, not to you (uid {me})")]
    Owner { owner: u32, me: u32 },
    #[error("others may write to it (mode {mode:03o}; it must not be group- or world-writable)")]
    Writable { mode: u32 },
}

/// The effective uid: the owner of every file this process creates.
pub(super) fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and has no preconditions.
    unsafe { libc::geteuid() }
}

/// Checks `root`; with `create`, makes it (mode 0700) if it is missing. Returns whether it
/// exists now.
pub(super) fn check_root(root: &Path, create: bool) -> Result<bool, PinError> {
    let refuse = |why| PinError::Unsafe {
        path: root.to_path_buf(),
        why,
    };
    match std::fs::symlink_metadata(root) {
        Ok(m) => {
            if m.file_type().is_symlink() {
                return Err(refuse(UnsafeDir::Symlink));
            }
            if !m.is_dir() {
                return Err(refuse(UnsafeDir::NotDirectory));
            }
            let me = euid();
            if m.uid() != me {
                return Err(refuse(UnsafeDir::Owner { owner: m.uid(), me }));
            }
            if m.mode() & 0o022 != 0 {
                return Err(refuse(UnsafeDir::Writable {
                    mode: m.mode() & 0o7777,
                }));
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !create {
                return Ok(false);
            }
            if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(io("create", parent))?;
            }
            match DirBuilder::new().mode(0o700).create(root) {
                Ok(()) => {}
                // Someone made it between the two calls: it gets the same checks as any other.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io("create", root)(e)),
            }
            check_root(root, false)
        }
        Err(e) => Err(io("inspect", root)(e)),
    }
}

/// An advisory lock on the directory's lock file, held until dropped. Writers take it
/// exclusively around every read-modify-write so that concurrent CLI calls (separate
/// processes) and threads (separate open files) never lose each other's updates; readers of
/// several files take it shared so that they see one installation, not half of two.
pub(super) struct DirLock {
    _file: File,
}

impl DirLock {
    pub(super) fn take(root: &Path, exclusive: bool) -> Result<Self, PinError> {
        let path = root.join("lock");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(io("open", &path))?;
        let op = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        };
        loop {
            // SAFETY: the descriptor is open for the duration of the call; flock has no other
            // preconditions. The lock goes away when `file` is closed.
            if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
                return Ok(Self { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(io("lock", &path)(e));
            }
        }
    }
}

/// Writes `bytes` to a fresh temporary file beside `path` and renames it over `path`, so that a
/// reader (who takes no lock) sees the old or the new file, never half of one.
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), PinError> {
    // Unique per process and per call: threads of one process never share a temporary file.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(io("write", &tmp)(e));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io("replace", path)(e)
    })
}
