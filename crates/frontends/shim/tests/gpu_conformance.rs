//! The CUDA queue as `xpreempt run` drives it, through the shim's own libcuda table (each call
//! behind the fork gate, event queries outside stream captures), against the HAL conformance
//! suite on a real GPU at Lv1 and Lv2: the harness is `xpreempt_cuda::conformance`.
//!
//! Run on a GPU machine:
//! `cargo test --release -p xpreempt-shim --test gpu_conformance -- --ignored --test-threads=1`.
//! Each test fails (never passes) when no CUDA driver is found.

use xpreempt_cuda::conformance;
use xpreempt_shim::cuda::driver::REAL;
use xpreempt_types::Level;

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_shims_hal_conforms_at_lv1() {
    conformance::conforms(&REAL, Level::Lv1);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_shims_hal_conforms_at_lv2() {
    conformance::conforms(&REAL, Level::Lv2);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stop_after_the_work_finished_runs_nothing_twice() {
    conformance::a_stop_after_the_work_finished_runs_nothing_twice(&REAL);
}
