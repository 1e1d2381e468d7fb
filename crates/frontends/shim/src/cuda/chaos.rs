//! `XPREEMPT_CHAOS=SEED[:PERIOD_US]`: a thread that suspends and resumes the process's queues at
//! random moments, through the same calls the scheduler makes. Results must not change; the
//! conformance suite runs every program under it.

use super::settings::Settings;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
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
    let mut held = Vec::new();
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_micros(next() % (2 * period_us)));
        let queues = super::streams::all();
        if queues.is_empty() {
            continue;
        }
        if next() % 2 == 0 {
            let q = &queues[(next() % queues.len() as u64) as usize];
            if q.xq.suspend().is_ok() {
                held.push(q.clone());
            }
        } else if let Some(q) = held.pop() {
            let _ = q.xq.resume();
        }
    }
    for q in held {
        let _ = q.xq.resume();
    }
}
