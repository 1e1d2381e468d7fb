//! Test machinery, built only with the `chaos` feature (the crate's tests turn it on; a product
//! build has none of it). It registers itself when the library loads:
//!
//! - `XPREEMPT_CHAOS=SEED[:PERIOD_US]`: a thread that suspends and resumes the process's queues
//!   at random moments, through the same calls the scheduler makes. Results must not change; the
//!   conformance suites run every program under it.
//! - `XPREEMPT_TEST_LV3=1`: a stand-in for the process's timeslice, so that Lv3 is available
//!   without a GPU; it counts how often the slice was lowered
//!   (`xpreempt_shim_test_lv3_lowered`).

use super::streams::{StreamQueue, TestHooks};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use xpreempt_core::xqueue::threaded::Preemptible;

static STOP: AtomicBool = AtomicBool::new(false);
static LOWERED: AtomicU64 = AtomicU64::new(0);

// SAFETY (of running at load): `register` only stores function pointers and reads the
// environment; it starts no thread and calls no driver.
#[used]
#[unsafe(link_section = ".init_array")]
static REGISTER: extern "C" fn() = register;

extern "C" fn register() {
    super::streams::set_test_hooks(TestHooks {
        agent_started: start,
        exiting: stop,
    });
    if std::env::var("XPREEMPT_TEST_LV3").is_ok_and(|v| v == "1") {
        super::lv3::set_stand_in(stand_in_timeslice);
    }
}

fn stand_in_timeslice(us: u64) -> i64 {
    if us < crate::rm::DRIVER_DEFAULT_TIMESLICE_US {
        LOWERED.fetch_add(1, Ordering::SeqCst);
    }
    0
}

/// How often the stand-in timeslice was lowered (an Lv3 interrupt reached it).
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_shim_test_lv3_lowered() -> u64 {
    LOWERED.load(Ordering::SeqCst)
}

fn start() {
    let Some((seed, period_us)) = super::settings::settings().chaos else {
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
fn stop() {
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
