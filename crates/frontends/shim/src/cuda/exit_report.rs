//! Which of the application's calls had to wait for buffered commands (reported at exit with
//! `XPREEMPT_SHIM_LOG=1`, beside each queue's launch times). A call that bypasses a stream's
//! queue waits until the queue's buffer is out, so a backlogged stream loses its lead over the
//! device at every such call: this is where a throttled queue's throughput goes.

use std::cell::Cell;
use std::panic::Location;
use std::sync::Mutex;
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
}
