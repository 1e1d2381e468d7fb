//! Which of the application's calls had to wait for buffered commands, and how long launches took
//! on which thread (reported at exit with `XPREEMPT_SHIM_LOG=1`). A call that bypasses a stream's
//! queue waits until the queue's buffer is out, so a backlogged stream loses its lead over the
//! device at every such call: this is where a throttled queue's throughput goes.

use std::cell::Cell;
use std::panic::Location;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

thread_local! {
    /// The application's call this thread is serving, if a wrapper named it.
    static CALL: Cell<&'static str> = const { Cell::new("") };
}

struct Waits {
    call: &'static str,
    site: &'static Location<'static>,
    count: u64,
    total: Duration,
}

static WAITS: Mutex<Vec<Waits>> = Mutex::new(Vec::new());

/// Names the call this thread serves until [`served`] (only while the report is on: the name
/// is not worth a thread-local access on every launch otherwise).
pub fn serving(call: &'static str) {
    if crate::log::log_enabled() {
        CALL.with(|c| c.set(call));
    }
}

pub fn served() {
    if crate::log::log_enabled() {
        CALL.with(|c| c.set(""));
    }
}

/// Starts timing a wait for buffered commands, if the report is on and there is something to
/// wait for.
pub fn start(buffered: impl FnOnce() -> bool) -> Option<Instant> {
    (crate::log::log_enabled() && buffered()).then(Instant::now)
}

/// Ends a wait begun by [`start`]; `site` tells calls no wrapper named apart.
pub fn done(started: Option<Instant>, site: &'static Location<'static>) {
    let Some(t0) = started else { return };
    let elapsed = t0.elapsed();
    let call = CALL.with(|c| c.get());
    let mut w = WAITS.lock().unwrap_or_else(|p| p.into_inner());
    match w.iter_mut().find(|w| w.call == call && w.site == site) {
        Some(w) => {
            w.count += 1;
            w.total += elapsed;
        }
        None => w.push(Waits {
            call,
            site,
            count: 1,
            total: elapsed,
        }),
    }
}

/// One line per call that waited, the longest total first.
pub fn report() -> Vec<String> {
    let mut w = WAITS.lock().unwrap_or_else(|p| p.into_inner());
    w.sort_by_key(|w| std::cmp::Reverse(w.total));
    w.iter()
        .map(|w| {
            format!(
                "{} ({}:{}): {} waits for buffered commands, {:.1} ms in all",
                if w.call.is_empty() { "a call" } else { w.call },
                w.site.file().rsplit('/').next().unwrap_or(""),
                w.site.line(),
                w.count,
                w.total.as_secs_f64() * 1e3
            )
        })
        .collect()
}

/// How long one queue's launches took (the shim's part and the driver's), per thread kind: the
/// application's own submissions, and launches from the buffer by the completion watcher or a
/// resume. Kept only while the report is on.
#[derive(Default)]
pub struct LaunchTimes {
    count: [AtomicU64; 2],
    total_ns: [AtomicU64; 2],
    max_ns: [AtomicU64; 2],
}

impl LaunchTimes {
    /// Starts timing a launch, if the report is on.
    pub fn start() -> Option<Instant> {
        crate::log::log_enabled().then(Instant::now)
    }

    pub fn done(&self, started: Instant, by_application: bool) {
        let ns = started.elapsed().as_nanos() as u64;
        let i = usize::from(!by_application);
        self.count[i].fetch_add(1, Ordering::Relaxed);
        self.total_ns[i].fetch_add(ns, Ordering::Relaxed);
        self.max_ns[i].fetch_max(ns, Ordering::Relaxed);
    }

    /// "N by the application (mean µs, max µs), M from the buffer (…)".
    pub fn summary(&self) -> String {
        let part = |i: usize, who: &str| {
            let n = self.count[i].load(Ordering::Relaxed);
            let mean = self.total_ns[i].load(Ordering::Relaxed) as f64 / n.max(1) as f64 / 1e3;
            let max = self.max_ns[i].load(Ordering::Relaxed) as f64 / 1e3;
            format!("{n} {who} (mean {mean:.1} µs, max {max:.0} µs)")
        };
        format!(
            "launches: {}, {}",
            part(0, "by the application"),
            part(1, "from the buffer")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_summed_per_call_and_site() {
        crate::log::enable_for_test();
        let here = Location::caller();
        serving("cuTestCall");
        for _ in 0..3 {
            done(Some(Instant::now()), here);
        }
        served();
        done(Some(Instant::now()), here);
        done(None, here);
        let lines = report();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("cuTestCall (exit_report.rs:") && l.contains("): 3 waits")),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("a call (exit_report.rs:") && l.contains("): 1 waits")),
            "{lines:?}"
        );
    }

    #[test]
    fn launch_times_are_kept_apart_per_thread_kind() {
        let t = LaunchTimes::default();
        let long_ago = Instant::now() - Duration::from_micros(30);
        t.done(long_ago, true);
        t.done(Instant::now(), true);
        t.done(long_ago, false);
        let s = t.summary();
        assert!(
            s.starts_with("launches: 2 by the application (mean "),
            "{s}"
        );
        assert!(s.contains(", 1 from the buffer (mean "), "{s}");
        assert!(t.max_ns[1].load(Ordering::Relaxed) >= 30_000, "{s}");
    }
}
