//! `XPREEMPT_CHAOS=SEED[:PERIOD_US]`: a thread that suspends and resumes the process's queues at
//! random moments, through the same calls the scheduler makes. Results must not change; the
//! conformance suite runs every program under it.

use super::settings::Settings;
use super::streams::StreamQueue;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use xpreempt_core::xqueue::threaded::Preemptible;

static STOP: AtomicBool = AtomicBool::new(false);

pub fn start(s: &Settings) {
    let Some((seed, period_us)) = s.chaos else {
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("xpreempt-chaos".into())
        .spawn(move || run(seed, period_us.max(1)));
    if let Err(e) = spawned {
        shim_log!("chaos thread: {e}");
    }
}

/// Stops injecting and resumes whatever is held (at exit).
pub fn stop() {
    STOP.store(true, Ordering::SeqCst);
    for q in super::streams::all() {
        let _ = q.xq.resume();
    }
}

fn run(seed: u64, period_us: u64) {
    let mut x = seed | 1;
    let mut next = move || {
        // xorshift64: deterministic per seed, no dependency.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // Each suspension ends by its own deadline (at most 4 periods): a queue the application
    // waits on is never held for long, as under a real scheduler with a bounded LC burst.
    let mut held: Vec<(Arc<StreamQueue>, Instant)> = Vec::new();
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_micros(next() % (2 * period_us)));
        let now = Instant::now();
        held.retain(|(q, until)| {
            let keep = *until > now;
            if !keep {
                let _ = q.xq.resume();
            }
            keep
        });
        let queues = super::streams::all();
        if queues.is_empty() || next() % 2 == 0 {
            continue;
        }
        let q = &queues[(next() % queues.len() as u64) as usize];
        if held.iter().any(|(h, _)| Arc::ptr_eq(h, q)) {
            continue;
        }
        if q.xq.suspend().is_ok() {
            let hold = Duration::from_micros(next() % (4 * period_us) + 1);
            held.push((q.clone(), now + hold));
        }
    }
    for (q, _) in held {
        let _ = q.xq.resume();
    }
}
