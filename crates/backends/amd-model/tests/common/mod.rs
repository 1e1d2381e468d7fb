//! Helpers shared by the integration tests (included with `mod common;`).
#![allow(dead_code)]

use xpreempt_amd::aql::{KernelDispatch, Packet};
use xpreempt_amd::{Caller, Gpu, GpuConfig, KernelCode, QueueProps};
use xpreempt_types::QueueId;

pub fn gpu(cfg: GpuConfig) -> Gpu {
    Gpu::new(cfg).expect("valid config")
}

pub fn small() -> GpuConfig {
    GpuConfig {
        cus: 8,
        waves_per_cu: 8,
        cu_groups: 2,
        ..GpuConfig::default()
    }
}

pub fn kernel(gpu: &mut Gpu, name: &str, wg_us: u64, idempotent: bool) -> u64 {
    gpu.load_kernel(KernelCode {
        name: name.into(),
        wg_ns: wg_us * 1000,
        jitter: 0.2,
        idempotent,
    })
}

pub fn queue(gpu: &mut Gpu, process: u32, name: &str, prio: i32) -> QueueId {
    gpu.create_queue(Caller::process(process), QueueProps::new(name, prio))
        .expect("queue created")
}

/// Submits `n` dispatches of `wgs` workgroups (4 waves each); returns their signals.
pub fn submit(gpu: &mut Gpu, q: QueueId, object: u64, n: u32, wgs: u32) -> Vec<u64> {
    (0..n)
        .map(|_| {
            let s = gpu.create_signal(1);
            let p = Packet::Dispatch(KernelDispatch::linear(object, wgs, 256, s));
            gpu.submit_packet(q, &p).expect("ring has room");
            s
        })
        .collect()
}

/// Runs until no event is left (or a safety bound).
pub fn run_out(gpu: &mut Gpu) {
    let mut steps = 0u64;
    while let Some(t) = gpu.next_event_time() {
        gpu.advance_to(t);
        gpu.take_touched();
        steps += 1;
        assert!(steps < 50_000_000, "the model did not settle");
    }
}

pub fn advance(gpu: &mut Gpu, by_ns: u64) {
    let until = gpu.now() + by_ns;
    gpu.advance_to(until);
    gpu.take_touched();
}
