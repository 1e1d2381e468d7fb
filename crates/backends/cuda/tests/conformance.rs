//! `CudaQueue` through cudarc's driver against the HAL conformance suite on a real GPU, at Lv1 and
//! Lv2 (the harness is `xpreempt_cuda::conformance`; the shim runs it through its own libcuda
//! table).
//!
//! Run on a GPU machine: `cargo test --release -p xpreempt-cuda --test conformance -- --ignored`.
//! Each test fails (never passes) when no CUDA driver is found.

use xpreempt_cuda::conformance;
use xpreempt_cuda::entry::CUDARC;
use xpreempt_types::Level;

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_queue_conforms_at_lv1() {
    conformance::conforms(&CUDARC, Level::Lv1);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_queue_conforms_at_lv2() {
    conformance::conforms(&CUDARC, Level::Lv2);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stop_after_the_work_finished_runs_nothing_twice() {
    conformance::a_stop_after_the_work_finished_runs_nothing_twice(&CUDARC);
}
