//! `xpreempt sim`: plays a [`scenario`] on the AMD model under each mode and compares them.
//! [`runner`] runs one mode (`none`, Scheme A, or Scheme B at lv1/lv2/lv3 — [`scheme_b`], the
//! core's scheduler and driver loop over the model's HAL); [`report`] puts the modes side by side.

pub mod decisions;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod scheme_b;
pub mod svg;
pub mod sweep;
