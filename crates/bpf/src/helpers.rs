//! The helpers a program may call, by Linux's numbers where Linux has one.
//!
//! rbpf takes helpers as plain function pointers, so the state they work on (the policy's maps,
//! the queues seen so far, the clock) is reached through a thread-local pointer that
//! [`with_env`] sets for the length of one program run. Pointer arguments were checked by the
//! verifier (kind, size, bounds) before the program could run; a helper called outside a run
//! finds no environment and returns an error value.

use crate::ctx::{Hook, Pod, QueueInfoOut};
use crate::maps::Map;
use std::cell::Cell;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HelperId {
    MapLookup = 1,
    MapUpdate = 2,
    MapDelete = 3,
    KtimeGetNs = 5,
    TracePrintk = 6,
    GetQueueInfo = 100,
}

impl HelperId {
    pub const ALL: [HelperId; 6] = [
        HelperId::MapLookup,
        HelperId::MapUpdate,
        HelperId::MapDelete,
        HelperId::KtimeGetNs,
        HelperId::TracePrintk,
        HelperId::GetQueueInfo,
    ];

    pub fn from_imm(imm: i32) -> Option<HelperId> {
        HelperId::ALL.into_iter().find(|h| *h as i32 == imm)
    }

    pub fn function(self) -> rbpf::Helper {
        match self {
            HelperId::MapLookup => map_lookup,
            HelperId::MapUpdate => map_update,
            HelperId::MapDelete => map_delete,
            HelperId::KtimeGetNs => ktime_get_ns,
            HelperId::TracePrintk => trace_printk,
            HelperId::GetQueueInfo => get_queue_info,
        }
    }
}

const ENOENT: u64 = (-2i64) as u64;
const EINVAL: u64 = (-22i64) as u64;

/// What the runtime knows of the queues it has seen, for `get_queue_info`.
pub type QueueTable = HashMap<u64, QueueInfoOut>;

/// The state helpers work on during one run.
pub struct CallEnv<'a> {
    pub maps: &'a mut [Map],
    pub queues: &'a QueueTable,
    pub now: u64,
    pub hook: Hook,
}

thread_local! {
    static ENV: Cell<*mut CallEnv<'static>> = const { Cell::new(std::ptr::null_mut()) };
}

/// Runs `f` (one program run) with `env` visible to the helpers.
pub fn with_env<R>(env: &mut CallEnv<'_>, f: impl FnOnce() -> R) -> R {
    struct Restore(*mut CallEnv<'static>);
    impl Drop for Restore {
        fn drop(&mut self) {
            ENV.with(|e| e.set(self.0));
        }
    }
    // The lifetime is erased only for storage; the pointer is cleared (restored) before `env`'s
    // borrow ends, even if `f` unwinds.
    let ptr = (env as *mut CallEnv<'_>).cast::<CallEnv<'static>>();
    let _restore = Restore(ENV.with(|e| e.replace(ptr)));
    f()
}

fn env<R>(f: impl FnOnce(&mut CallEnv<'static>) -> Option<R>) -> Option<R> {
    let ptr = ENV.with(|e| e.get());
    // SAFETY: non-null only inside `with_env`, whose `&mut CallEnv` is not otherwise used while
    // the program (and so this helper) runs; helpers do not nest.
    let env = unsafe { ptr.as_mut() }?;
    f(env)
}

/// The `len` bytes at `addr`.
///
/// # Safety
/// The verifier proved `addr` points to `len` readable bytes (stack, context or map value).
unsafe fn bytes<'a>(addr: u64, len: usize) -> &'a [u8] {
    // SAFETY: see the function's contract.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

fn map_lookup(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    env(|e| {
        let m = e.maps.get_mut(usize::try_from(map).ok()?)?;
        // SAFETY: the verifier checked r2 points to key_size readable bytes.
        let key = unsafe { bytes(key, m.def().key_size as usize) };
        m.lookup_ptr(key).map(|p| p as u64)
    })
    .unwrap_or(0)
}

fn map_update(map: u64, key: u64, value: u64, flags: u64, _: u64) -> u64 {
    env(|e| {
        let m = e.maps.get_mut(usize::try_from(map).ok()?)?;
        // SAFETY: the verifier checked r2 and r3 point to key_size and value_size readable bytes.
        let key = unsafe { bytes(key, m.def().key_size as usize) }.to_vec();
        let r = unsafe { m.update_raw(&key, value as *const u8, flags) };
        Some(match r {
            Ok(()) => 0,
            Err(err) => err.errno() as u64,
        })
    })
    .unwrap_or(EINVAL)
}

fn map_delete(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    env(|e| {
        let m = e.maps.get_mut(usize::try_from(map).ok()?)?;
        // SAFETY: the verifier checked r2 points to key_size readable bytes.
        let key = unsafe { bytes(key, m.def().key_size as usize) }.to_vec();
        Some(match m.delete(&key) {
            Ok(()) => 0,
            Err(err) => err.errno() as u64,
        })
    })
    .unwrap_or(EINVAL)
}

fn ktime_get_ns(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    env(|e| Some(e.now)).unwrap_or(0)
}

fn get_queue_info(queue: u64, out: u64, size: u64, _: u64, _: u64) -> u64 {
    env(|e| {
        let Some(mut info) = e.queues.get(&queue).copied() else {
            return Some(ENOENT);
        };
        let n = (size as usize).min(size_of::<QueueInfoOut>());
        // SAFETY: the verifier checked r2 points to `size` writable bytes (stack or map value)
        // and that size <= size_of::<QueueInfoOut>().
        unsafe { std::ptr::copy(info.as_bytes_mut().as_ptr(), out as *mut u8, n) };
        Some(0)
    })
    .unwrap_or(EINVAL)
}

fn trace_printk(fmt: u64, size: u64, a: u64, b: u64, c: u64) -> u64 {
    env(|e| {
        // SAFETY: the verifier checked r1 points to r2 (a constant <= 256) readable bytes.
        let raw = unsafe { bytes(fmt, size as usize) };
        let text = format_trace(raw, [a, b, c]);
        tracing::info!(target: "xpreempt_bpf::trace", hook = e.hook.name(), "{text}");
        Some(text.len() as u64)
    })
    .unwrap_or(EINVAL)
}

/// printf with the integer conversions of Linux's `bpf_trace_printk`.
pub fn format_trace(raw: &[u8], args: [u64; 3]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let fmt = String::from_utf8_lossy(&raw[..end]);
    let mut out = String::new();
    let mut args = args.into_iter();
    let mut chars = fmt.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        let mut longs = 0;
        while chars.peek() == Some(&'l') {
            chars.next();
            longs += 1;
        }
        let conv = chars.next();
        if conv == Some('%') {
            out.push('%');
            continue;
        }
        let Some(v) = args.next() else {
            out.push_str("<missing>");
            continue;
        };
        let (v32, wide) = (v as u32, longs > 0);
        let s = match conv {
            Some('d' | 'i') if wide => (v as i64).to_string(),
            Some('d' | 'i') => (v32 as i32).to_string(),
            Some('u') if wide => v.to_string(),
            Some('u') => v32.to_string(),
            Some('x') if wide => format!("{v:x}"),
            Some('x') => format!("{v32:x}"),
            Some(other) => format!("%{other}?"),
            None => "%".into(),
        };
        out.push_str(&s);
    }
    out.trim_end_matches('\n').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_format_handles_widths_and_missing_args() {
        let f = |s: &str, a| format_trace(s.as_bytes(), a);
        assert_eq!(
            f("q=%llu p=%d x=%x\n\0junk", [7, u64::MAX, 255]),
            "q=7 p=-1 x=ff"
        );
        assert_eq!(f("%d %d %d %d", [1, 2, 3]), "1 2 3 <missing>");
        assert_eq!(f("100%%", [0; 3]), "100%");
    }

    #[test]
    fn helpers_outside_a_run_fail_cleanly() {
        assert_eq!(map_lookup(0, 0, 0, 0, 0), 0);
        assert_eq!(map_update(0, 0, 0, 0, 0), EINVAL);
        assert_eq!(ktime_get_ns(0, 0, 0, 0, 0), 0);
    }
}
