//! `XPREEMPT_SHIM_BACKTRACE=1`: a fatal signal in the process prints the faulting thread's
//! stack (glibc's `backtrace_symbols_fd`, no allocation) to stderr before the process dies as it
//! would have, so that a crash inside or beside the shim can be placed without a debugger.
//!
//! glibc's unwinder stops at the first frame without unwind tables (libcuda's), so the handler
//! also scans the raw stack: every word that points into an executable mapping is printed as
//! `path+file offset`, the likely return addresses of the callers above it (`addr2line` on the
//! machine that has the files turns them into functions).

use std::cell::UnsafeCell;
use std::sync::Once;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Whether the handler is in place (what only it reads, such as the threads at a fork, is
/// collected only then).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// How much of the stack above the interrupted stack pointer is scanned.
const SCAN_BYTES: usize = 64 * 1024;
const MAX_HITS: usize = 96;

/// /proc/self/maps, read in the handler (a dying process; one fatal signal at a time).
struct MapsBuf(UnsafeCell<[u8; 256 * 1024]>);
// SAFETY: used only by the fatal-signal handler, which resets itself before returning, so it
// does not run on two threads at once in practice; a torn read costs a garbled diagnostic.
unsafe impl Sync for MapsBuf {}
static MAPS: MapsBuf = MapsBuf(UnsafeCell::new([0; 256 * 1024]));

fn write_err(bytes: &[u8]) {
    // SAFETY: writing a valid buffer to stderr.
    unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

fn write_hex(mut v: u64) {
    let mut buf = [0u8; 18];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[(v & 0xf) as usize];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    i -= 2;
    buf[i] = b'0';
    buf[i + 1] = b'x';
    write_err(&buf[i..]);
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    let mut v = 0u64;
    if s.is_empty() {
        return None;
    }
    for &c in s {
        let d = (c as char).to_digit(16)?;
        v = v.checked_mul(16)? + u64::from(d);
    }
    Some(v)
}

/// One line of /proc/self/maps: start, end, executable, file offset, path.
fn parse_line(line: &[u8]) -> Option<(u64, u64, bool, u64, &[u8])> {
    let mut fields = line.split(|&c| c == b' ').filter(|f| !f.is_empty());
    let range = fields.next()?;
    let dash = range.iter().position(|&c| c == b'-')?;
    let (start, end) = (parse_hex(&range[..dash])?, parse_hex(&range[dash + 1..])?);
    let exec = fields.next()?.get(2) == Some(&b'x');
    let offset = parse_hex(fields.next()?)?;
    let path = fields.nth(2).unwrap_or(b"?");
    Some((start, end, exec, offset, path))
}

fn read_maps() -> &'static [u8] {
    // SAFETY: see `MapsBuf`; plain open/read/close on a static buffer of the size passed.
    unsafe {
        let buf = &mut *MAPS.0.get();
        let fd = libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY);
        if fd < 0 {
            return &[];
        }
        let mut n = 0usize;
        while n < buf.len() {
            let r = libc::read(fd, buf[n..].as_mut_ptr().cast(), buf.len() - n);
            if r <= 0 {
                break;
            }
            n += r as usize;
        }
        libc::close(fd);
        &buf[..n]
    }
}

fn scan_stack(sp: u64) {
    let maps = read_maps();
    let lines = || maps.split(|&c| c == b'\n').filter_map(parse_line);
    let Some((_, stack_end, ..)) = lines().find(|&(s, e, ..)| (s..e).contains(&sp)) else {
        return;
    };
    write_err(b"xpreempt-shim: code addresses on the stack (path+file offset):\n");
    let top = stack_end.min(sp.saturating_add(SCAN_BYTES as u64));
    let mut hits = 0;
    let mut at = sp & !7;
    while at + 8 <= top && hits < MAX_HITS {
        // SAFETY: `at` lies inside the mapping that holds the stack pointer, 8-byte aligned.
        let word = unsafe { std::ptr::read_volatile(at as *const u64) };
        if let Some((start, _, _, offset, path)) =
            lines().find(|&(s, e, exec, ..)| exec && (s..e).contains(&word))
        {
            write_err(b"  ");
            write_err(path);
            write_err(b"+");
            write_hex(word - start + offset);
            write_err(b"\n");
            hits += 1;
        }
        at += 8;
    }
}

extern "C" fn on_fatal(sig: libc::c_int, _info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let mut frames = [std::ptr::null_mut::<libc::c_void>(); 64];
    // SAFETY: `frames` holds 64 pointers; both calls are async-signal-safe once libgcc is loaded
    // (`install` loads it by taking one backtrace up front). `context` is the kernel's ucontext.
    unsafe {
        let n = libc::backtrace(frames.as_mut_ptr(), frames.len() as libc::c_int);
        write_err(b"xpreempt-shim: fatal signal, stack:\n");
        libc::backtrace_symbols_fd(frames.as_ptr(), n, 2);
        #[cfg(target_arch = "x86_64")]
        if let Some(uc) = context.cast::<libc::ucontext_t>().as_ref() {
            scan_stack(uc.uc_mcontext.gregs[libc::REG_RSP as usize] as u64);
        }
        let at_fork = threads_at_last_fork();
        if !at_fork.is_empty() {
            write_err(
                b"xpreempt-shim: the other threads at the last fork (tid name state wchan):\n",
            );
            write_err(at_fork);
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
        // SAFETY: plain libc calls with valid arguments; the handler has the SA_SIGINFO signature.
        unsafe {
            libc::backtrace(warm.as_mut_ptr(), 1);
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_fatal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT, libc::SIGILL] {
                libc::sigaction(sig, &action, std::ptr::null_mut());
            }
        }
        INSTALLED.store(true, Ordering::Relaxed);
    });
}

/// `tid comm state` of every other thread at the last fork, as the fork gate saw them, for the
/// handler (taken only when it is installed).
static AT_FORK: Snapshot = Snapshot::new();

/// Keeps the other threads at a fork (tid, name, state, wait channel), for the handler to print.
pub fn note_threads_at_fork(threads: &[(u32, String, u8, String)]) {
    AT_FORK.set(threads);
}

/// The snapshot as text, for the handler (no allocation to read it).
pub fn threads_at_last_fork() -> &'static [u8] {
    AT_FORK.get()
}

/// A fixed buffer written by the forking thread only (forks are serialized by the gate's flag
/// in practice; a torn read costs a garbled diagnostic, nothing else).
struct Snapshot {
    len: AtomicUsize,
    text: std::cell::UnsafeCell<[u8; 2048]>,
}

// SAFETY: see the type's comment: one writer at a time, readers tolerate a torn copy.
unsafe impl Sync for Snapshot {}

impl Snapshot {
    const fn new() -> Self {
        Self {
            len: AtomicUsize::new(0),
            text: std::cell::UnsafeCell::new([0; 2048]),
        }
    }

    fn set(&self, threads: &[(u32, String, u8, String)]) {
        let mut text = String::new();
        for (tid, name, state, wchan) in threads {
            text.push_str(&format!("{tid} {name} {} {wchan}\n", *state as char));
        }
        let n = text.len().min(2048);
        self.len.store(0, SeqCst);
        // SAFETY: the buffer is 2048 bytes and `n` ≤ 2048; see the type's comment on races.
        unsafe { (&mut *self.text.get())[..n].copy_from_slice(&text.as_bytes()[..n]) };
        self.len.store(n, SeqCst);
    }

    fn get(&self) -> &[u8] {
        let n = self.len.load(SeqCst);
        // SAFETY: `n` ≤ 2048 bytes of the buffer.
        unsafe { &(&*self.text.get())[..n] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse_into_ranges_offsets_and_paths() {
        let line = b"7f1f9b7b4000-7f1f9c000000 r-xp 00168000 08:01 1234   /usr/lib/libcuda.so.1";
        let (start, end, exec, offset, path) = parse_line(line).expect("parses");
        assert_eq!(
            (start, end, exec, offset),
            (0x7f1f9b7b4000, 0x7f1f9c000000, true, 0x168000)
        );
        assert_eq!(path, b"/usr/lib/libcuda.so.1");
        let anon = parse_line(b"7ffc65217000-7ffc65238000 rw-p 00000000 00:00 0").expect("parses");
        assert_eq!((anon.2, anon.4), (false, &b"?"[..]));
        assert!(parse_line(b"garbage").is_none());
    }

    /// Dies of SIGABRT with the handler installed, when run as the child of the test below.
    #[test]
    fn abort_with_the_handler() {
        if std::env::var_os("XP_CRASH_CHILD").is_none() {
            return;
        }
        install();
        // SAFETY: raising a signal in this (child) process.
        unsafe { libc::raise(libc::SIGABRT) };
    }

    #[test]
    fn a_fatal_signal_prints_the_stack_and_the_code_addresses_on_it() {
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "crash::tests::abort_with_the_handler",
                "--test-threads=1",
            ])
            .env("XP_CRASH_CHILD", "1")
            .env("XPREEMPT_SHIM_BACKTRACE", "1")
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the child did not die: {err}");
        assert!(err.contains("fatal signal, stack:"), "{err}");
        let scan = err
            .split("code addresses on the stack (path+file offset):\n")
            .nth(1)
            .unwrap_or_else(|| panic!("no stack scan in {err}"));
        let exe = std::env::current_exe().expect("test binary");
        let exe = exe.to_string_lossy();
        assert!(
            scan.lines().any(|l| l.trim_start().starts_with(&*exe)),
            "no return address into the test binary in {scan}"
        );
    }
}
