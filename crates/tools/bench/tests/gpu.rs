//! GPU tests: XQueues over the CUDA backend; run on a machine with a CUDA GPU with
//! `cargo test -p xpreempt-bench --test gpu -- --ignored`.
//! Each fails (never passes) when no GPU is found.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::time::{Duration, Instant};
use xpreempt_bench::{Env, Shape};
use xpreempt_core::Command;
use xpreempt_core::xqueue::threaded::{Preemptible, SharedXQueue};
use xpreempt_core::{HwQueue, Level, QueueConfig, QueueId, XQueue};
use xpreempt_cuda::driver::DeviceBuffer;
use xpreempt_cuda::entry::{CUDARC, Driver};
use xpreempt_cuda::{CudaQueue, CudaQueueConfig, Deferred};

fn env() -> Env {
    env_on(0)
}

fn env_on(ordinal: i32) -> Env {
    assert!(
        xpreempt_cuda::driver_present(),
        "no CUDA driver: this test needs a GPU"
    );
    Env::new(ordinal).expect("CUDA device with NVRTC")
}

fn queue(e: &Env, level: Level) -> Arc<SharedXQueue<CudaQueue>> {
    let hal = CudaQueue::on_device(
        e.device.clone(),
        0,
        CudaQueueConfig {
            level,
            slots: 20,
            max_units: 1 << 20,
            ..CudaQueueConfig::default()
        },
    )
    .expect("queue");
    let hw = hal.max_level();
    assert!(
        hw >= level.min(Level::Lv2),
        "level {level} must be available"
    );
    let qc = QueueConfig::new(8, 4, level).expect("config");
    Arc::new(SharedXQueue::new(
        XQueue::new(QueueId(0), qc, hw),
        hal,
        None,
    ))
}

/// What goes through the queue besides guarded kernels (at Lv2).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mix {
    /// Every fifth kernel plain and a memset every seventh: a window with them behind a guarded
    /// kernel drains rather than stops.
    WithUnguarded,
    /// Guarded kernels only: the window can always be stopped, and most stops go ahead of the
    /// queue's lock (racing its launches).
    GuardedOnly,
}

/// Random suspend/resume from another thread while `n` kernels (and memsets, with
/// `Mix::WithUnguarded`) go through the queue; every block must run exactly once.
fn exactly_once(level: Level, persistent: bool) {
    exactly_once_on(0, level, persistent, 120, Mix::WithUnguarded);
}

/// Stops ahead of the queue's lock race the submitting thread's launches: each block still runs
/// exactly once.
#[test]
#[ignore = "needs a CUDA GPU"]
fn every_block_exactly_once_lv2_stopped_ahead() {
    let ahead = exactly_once_on(0, Level::Lv2, false, 400, Mix::GuardedOnly);
    eprintln!("{ahead} stops went ahead");
}

/// Returns how many suspensions stopped the queue ahead of its lock.
fn exactly_once_on(ordinal: i32, level: Level, persistent: bool, n: u32, mix: Mix) -> u64 {
    let e = env_on(ordinal);
    let q = queue(&e, level);
    let blocks = 2 * e.wave;
    let counts = DeviceBuffer::zeroed((n * blocks) as usize * 4).expect("alloc");
    let scratch = DeviceBuffer::zeroed(4096).expect("alloc");
    let stop = Arc::new(AtomicBool::new(false));
    let chaos = {
        let q = q.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rng = 0x1234_5678_9abc_def1u64;
            let mut cycles = 0;
            while !stop.load(Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                std::thread::sleep(Duration::from_micros(rng % 400));
                q.suspend().expect("suspend");
                std::thread::sleep(Duration::from_micros((rng >> 20) % 400));
                q.resume().expect("resume");
                cycles += 1;
            }
            cycles
        })
    };
    e.device.bind().expect("bind");
    for i in 0..n {
        let c = counts.ptr + (i * blocks) as u64 * 4;
        let guarded = level >= Level::Lv2 && (mix == Mix::GuardedOnly || i % 5 != 4);
        let shape = if persistent {
            Shape::Persistent
        } else {
            Shape::Spin
        };
        let k = e.kernel(shape, guarded, blocks, 5.0, c, 0).expect("kernel");
        q.submit_with_retry(Command::kernel(Deferred::kernel(k)), Duration::from_secs(5))
            .expect("submit");
        if mix == Mix::WithUnguarded && i % 7 == 3 {
            let (dst, value) = (scratch.ptr, i % 250);
            let m = Command::kernel(Deferred::on_stream(move |stream| {
                CUDARC.memset_d32_async(dst, value, 1024, stream)
            }));
            q.submit_with_retry(m, Duration::from_secs(5))
                .expect("memset");
        }
    }
    q.resume().ok();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(50) {}
    stop.store(true, Relaxed);
    let cycles = chaos.join().expect("chaos thread");
    q.resume().ok();
    q.wait_all().expect("wait_all");
    e.device.synchronize().expect("sync");
    let v = counts.read_u32().expect("read");
    let wrong: Vec<(usize, u32)> = v
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, c)| c != 1)
        .take(10)
        .collect();
    assert!(
        wrong.is_empty(),
        "blocks not run exactly once (index, count): {wrong:?}"
    );
    assert!(cycles > 0, "the test must have suspended at least once");
    let st = q.stats();
    eprintln!(
        "device {ordinal} {level}: {cycles} suspend/resume cycles, stats {:?}",
        (st.preemptions, st.stops_ahead, st.hal_errors)
    );
    if mix == Mix::GuardedOnly {
        assert!(st.stops_ahead > 0, "no stop went ahead in {cycles} cycles");
    }
    st.stops_ahead
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_block_exactly_once_lv1() {
    exactly_once(Level::Lv1, false);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_block_exactly_once_lv2() {
    exactly_once(Level::Lv2, false);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_item_exactly_once_lv2_persistent() {
    exactly_once(Level::Lv2, true);
}

/// One long guarded kernel stopped mid-way: some blocks finished, some not; the relaunch skips the
/// finished ones and runs the rest, each exactly once.
#[test]
#[ignore = "needs a CUDA GPU"]
fn lv2_relaunch_skips_finished_blocks() {
    let e = env();
    let q = queue(&e, Level::Lv2);
    // ~100 waves of 50 us: ~5 ms, so that a test thread that wakes a few ms late (as one did on
    // the H100 host) still stops it part-way.
    let blocks = 100 * e.wave;
    let counts = DeviceBuffer::zeroed(blocks as usize * 4).expect("alloc");
    e.device.bind().expect("bind");
    let k = e
        .kernel(Shape::Spin, true, blocks, 50.0, counts.ptr, 0)
        .expect("kernel");
    let submitted = Instant::now();
    q.submit(Command::kernel(Deferred::kernel(k)))
        .expect("submit");
    std::thread::sleep(Duration::from_micros(700));
    let slept = submitted.elapsed();
    q.suspend().expect("suspend");
    let suspend_call = submitted.elapsed() - slept;
    let t = Instant::now();
    while !q.hal().settled() {
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "deactivate never settled"
        );
    }
    let settle = t.elapsed();
    assert_eq!(
        q.stats().stops_ahead,
        1,
        "a lone guarded kernel is stopped ahead"
    );
    let mid = counts.read_u32().expect("read");
    let done = mid.iter().filter(|&&c| c == 1).count();
    assert!(
        mid.iter().all(|&c| c <= 1),
        "a block ran twice before resume"
    );
    assert!(
        done > 0 && done < blocks as usize,
        "kernel should be stopped part-way: {done}/{blocks} blocks done \
         (suspended {slept:?} after the submission, in {suspend_call:?})"
    );
    std::thread::sleep(Duration::from_millis(5));
    let still = counts
        .read_u32()
        .expect("read")
        .iter()
        .filter(|&&c| c == 1)
        .count();
    assert_eq!(still, done, "blocks ran while deactivated");
    q.resume().expect("resume");
    q.wait_all().expect("wait");
    let v = counts.read_u32().expect("read");
    assert!(
        v.iter().all(|&c| c == 1),
        "after relaunch every block exactly once"
    );
    eprintln!(
        "stopped at {done}/{blocks} blocks; suspended {slept:?} after the submission, in \
         {suspend_call:?}; settled in {settle:?}"
    );
}

/// Level 3 by cost: a queue with a guard-built kernel in flight reports an interrupt that costs
/// nothing (its Lv2 part stops the kernel at its next block), so a suspension interrupts it; once
/// the kernel is done the cost is the process's measured SET_TIMESLICE call again (none here:
/// this process has no level 3).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_guarded_kernel_in_flight_makes_the_interrupt_free() {
    let e = env();
    let q = queue(&e, Level::Lv2);
    let blocks = 2 * e.wave;
    let counts = DeviceBuffer::zeroed(blocks as usize * 4).expect("alloc");
    e.device.bind().expect("bind");
    assert_eq!(
        q.hal().interrupt_cost_ns(),
        None,
        "an idle queue without level 3"
    );
    let k = e
        .kernel(Shape::Spin, true, blocks, 2000.0, counts.ptr, 0)
        .expect("kernel");
    q.submit_with_retry(Command::kernel(Deferred::kernel(k)), Duration::from_secs(5))
        .expect("submit");
    assert_eq!(
        q.hal().interrupt_cost_ns(),
        Some(0),
        "a guard-built kernel of 4 ms is in flight"
    );
    q.wait_all().expect("wait_all");
    assert_eq!(q.hal().interrupt_cost_ns(), None, "nothing in flight");
    let v = counts.read_u32().expect("read");
    assert!(v.iter().all(|&c| c == 1), "every block ran once");
}

/// The `xpreempt-bench` binary: $XPREEMPT_BENCH_BIN, else the one beside $XPREEMPT_BIN (the
/// `xpreempt` of a folder of release binaries copied to the GPU machine), else the one cargo built
/// beside this test.
fn bench_bin() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("XPREEMPT_BENCH_BIN") {
        return p.into();
    }
    let built = std::path::PathBuf::from(env!("CARGO_BIN_EXE_xpreempt-bench"));
    match std::env::var_os("XPREEMPT_BIN") {
        Some(xp) => std::path::PathBuf::from(xp).with_file_name("xpreempt-bench"),
        None => built,
    }
}

/// Lv3: with this process's channel-group timeslice at the minimum, a progress kernel competing
/// with a busy process stops; restored, it runs again. Runs `xpreempt-bench lv3-probe` under the
/// shim: XPREEMPT_SHIM is libxpreempt_shim.so; the binary is found by [`bench_bin`].
#[test]
#[ignore = "needs a CUDA GPU"]
fn lv3_descheduling_is_real() {
    assert!(
        xpreempt_cuda::driver_present(),
        "no CUDA driver: this test needs a GPU"
    );
    let bin = bench_bin();
    let shim = std::env::var("XPREEMPT_SHIM").expect("XPREEMPT_SHIM: path of libxpreempt_shim.so");
    let out = std::process::Command::new(bin)
        .args(["--json", "lv3-probe", "--window-ms", "300"])
        .env("LD_PRELOAD", shim)
        .output()
        .expect("run xpreempt-bench");
    assert!(
        out.status.success(),
        "lv3-probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let w = v["windows"].as_array().expect("windows");
    let rate = |i: usize| w[i]["rate_per_ms"].as_f64().expect("rate");
    eprintln!(
        "progress per ms: default {:.1}, minimum {:.1}, restored {:.1}",
        rate(0),
        rate(1),
        rate(2)
    );
    assert!(rate(0) > 0.0, "no progress at the default timeslice");
    assert!(
        rate(1) < 0.1 * rate(0),
        "progress did not stop at the minimum timeslice"
    );
    assert!(
        rate(2) > 0.5 * rate(0),
        "progress did not resume after restore"
    );
}

/// Commands run in submission order across suspensions: stamps behind slow kernels, each
/// writing its index at the next position of a shared counter.
#[test]
#[ignore = "needs a CUDA GPU"]
fn order_kept_across_suspensions() {
    let e = env();
    let q = queue(&e, Level::Lv1);
    let n = 300u32;
    let counter = DeviceBuffer::zeroed(4).expect("alloc");
    let out = DeviceBuffer::zeroed(n as usize * 4).expect("alloc");
    e.device.bind().expect("bind");
    for i in 0..n {
        if i % 3 == 0 {
            // A slow kernel now and then, so that later stamps would overtake it if order broke.
            let slow = e
                .kernel(Shape::Spin, false, e.wave, 30.0, 0, 0)
                .expect("kernel");
            q.submit(Command::kernel(Deferred::kernel(slow)))
                .expect("spin");
        }
        let k = xpreempt_cuda::Kernel::new(
            e.k.stamp,
            [1, 1, 1],
            [32, 1, 1],
            &[counter.ptr, out.ptr, i as u64],
        )
        .expect("kernel");
        q.submit(Command::kernel(Deferred::kernel(k)))
            .expect("stamp");
        if i % 10 == 9 {
            q.suspend().expect("suspend");
            std::thread::sleep(Duration::from_micros(100));
            q.resume().expect("resume");
        }
    }
    q.wait_all().expect("wait");
    let v = out.read_u32().expect("read");
    let bad: Vec<(usize, u32)> = v
        .iter()
        .copied()
        .enumerate()
        .filter(|&(i, s)| s != i as u32)
        .take(10)
        .collect();
    assert!(
        bad.is_empty(),
        "commands ran out of order (index, position): {bad:?}"
    );
}

/// One backend instance per GPU, all at once: every device runs the exactly-once check in its own
/// thread (on a one-GPU machine this is the single-device case).
#[test]
#[ignore = "needs a CUDA GPU"]
fn every_device_has_its_own_backend() {
    assert!(
        xpreempt_cuda::driver_present(),
        "no CUDA driver: this test needs a GPU"
    );
    let n = xpreempt_cuda::driver::device_count().expect("device count");
    assert!(n >= 1, "no CUDA device");
    let threads: Vec<_> = (0..n)
        .map(|d| {
            std::thread::spawn(move || {
                exactly_once_on(d, Level::Lv2, false, 60, Mix::WithUnguarded)
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a device's check failed");
    }
    eprintln!("{n} device(s) checked side by side");
}
